#include <smp/generation.h>

#include <smp/error.h>

#include "checkpoint/checkpoint.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>

namespace smp {

namespace {

std::string shown(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

}  // namespace

void check_sampling(const Sampling& s, const std::string& names) {
  // "--": smp-generate's options (--top-k), else the fields under `names`.
  const auto name = [&](const char* field, const char* option) {
    return names == "--" ? std::string("--") + option : names + field;
  };
  if (!std::isfinite(s.temperature) || s.temperature < 0 || s.temperature > kMaxTemperature)
    throw Error(name("temperature", "temperature") + " is " + shown(s.temperature) + ": expected a finite number in [0, " +
                shown(kMaxTemperature) + "] (0: greedy)");
  if (s.top_k < 0)
    throw Error(name("top_k", "top-k") + " is " + std::to_string(s.top_k) + ": expected 0 (every token) or more");
  if (!std::isfinite(s.top_p) || s.top_p < 0 || s.top_p > 1)
    throw Error(name("top_p", "top-p") + " is " + shown(s.top_p) + ": expected a number in [0, 1] (0: the most likely token)");
}

int64_t next_token(at::Tensor logits, const Sampling& s, at::Generator& gen) {
  check_sampling(s);
  if (!at::isfinite(logits).all().item<bool>())
    throw Error("generate: the model's logits hold NaN or infinity (a diverged checkpoint?)");
  // Only the most likely token survives each of these: greedy.
  if (s.temperature <= 0 || s.top_k == 1 || s.top_p <= 0) return logits.argmax().item<int64_t>();
  // The largest logit moved to 0 first: a tiny temperature then sends the
  // others toward -inf, never the largest to inf (softmax would give NaN).
  logits = (logits - logits.max()) / s.temperature;
  if (s.top_k > 0 && s.top_k < logits.size(0)) {
    const double kth = std::get<0>(logits.topk(s.top_k)).min().item<double>();
    logits = logits.masked_fill(logits < kth, -std::numeric_limits<double>::infinity());
  }
  at::Tensor probs = at::softmax(logits, 0);
  if (s.top_p < 1) {
    auto [sorted, order] = probs.sort(0, /*descending=*/true);
    const at::Tensor before = sorted.cumsum(0) - sorted;  // the mass of the tokens ahead of each
    at::Tensor cut = before >= s.top_p;
    cut[0] = false;  // the most likely token always stays (a top_p below its probability keeps it alone)
    at::Tensor drop = at::zeros_like(probs, at::kBool);
    drop.index_put_({order}, cut);
    probs = probs.masked_fill(drop, 0);
  }
  return at::multinomial(probs, 1, /*replacement=*/false, gen).item<int64_t>();
}

std::vector<Completion> generate(Runtime& runtime, const std::vector<std::vector<int64_t>>& prompts,
                                 const GenerationOptions& o, at::Generator& gen) {
  check_sampling(o.sampling);
  if (o.vocab <= 0) throw Error("generate: the model's vocabulary is " + std::to_string(o.vocab));
  if (o.max_positions <= 1)
    throw Error("generate: the model's sequence length is " + std::to_string(o.max_positions) +
                ": a prompt and one new token need at least 2 positions");
  const int64_t batch = static_cast<int64_t>(prompts.size());
  std::vector<std::vector<int64_t>> ids = prompts;
  std::vector<Completion> out(prompts.size());
  std::vector<bool> done(prompts.size(), false);
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (prompts[i].empty()) throw Error("generate: prompt " + std::to_string(i) + " has no tokens");
    for (const int64_t id : prompts[i])
      if (id < 0 || id >= o.vocab)
        throw Error("generate: prompt " + std::to_string(i) + " holds id " + std::to_string(id) +
                    ", outside the model's vocabulary of " + std::to_string(o.vocab));
    if (static_cast<int64_t>(prompts[i].size()) >= o.max_positions)
      throw Error("generate: prompt " + std::to_string(i) + " has " + std::to_string(prompts[i].size()) +
                  " tokens, the model's sequence length is " + std::to_string(o.max_positions));
  }
  // Each sample's logits at its last position, and its next token appended.
  auto take = [&](const at::Tensor& logits, const std::vector<int64_t>& row_of_last) {
    const at::Tensor rows = logits.to(at::kDouble);
    for (int64_t i = 0; i < batch; ++i) {
      if (done[static_cast<size_t>(i)]) continue;
      auto& seq = ids[static_cast<size_t>(i)];
      const at::Tensor logits = rows[i][row_of_last[static_cast<size_t>(i)]].narrow(0, 0, o.vocab);
      const int64_t next = next_token(logits, o.sampling, gen);
      seq.push_back(next);
      out[static_cast<size_t>(i)].ids.push_back(next);
      out[static_cast<size_t>(i)].logprobs.push_back(at::log_softmax(logits, 0)[next].item<double>());
      const int64_t made = static_cast<int64_t>(seq.size() - prompts[static_cast<size_t>(i)].size());
      if (next == o.eos_id || made >= o.max_new_tokens || static_cast<int64_t>(seq.size()) >= o.max_positions)
        done[static_cast<size_t>(i)] = true;
    }
  };
  auto all_done = [&] { return std::all_of(done.begin(), done.end(), [](bool d) { return d; }); };
  // [batch, width] of each sample's tokens from `from[i]`, right-padded with its last token.
  auto tokens = [&](const std::vector<int64_t>& from, int64_t width) {
    at::Tensor t = at::empty({batch, width}, at::kLong);
    for (int64_t i = 0; i < batch; ++i) {
      const auto& seq = ids[static_cast<size_t>(i)];
      for (int64_t j = 0; j < width; ++j) {
        const int64_t k = std::min<int64_t>(from[static_cast<size_t>(i)] + j, static_cast<int64_t>(seq.size()) - 1);
        t[i][j] = seq[static_cast<size_t>(k)];
      }
    }
    return t;
  };
  const std::vector<int64_t> zeros(prompts.size(), 0);
  if (o.max_new_tokens <= 0) return out;
  if (!o.kv_cache) {
    // The reference: every step one forward over every sequence so far.
    while (!all_done()) {
      int64_t width = 0;
      std::vector<int64_t> last(prompts.size());
      for (size_t i = 0; i < ids.size(); ++i) {
        width = std::max<int64_t>(width, static_cast<int64_t>(ids[i].size()));
        last[i] = static_cast<int64_t>(ids[i].size()) - 1;
      }
      take(runtime.forward(Batch{{"tokens", tokens(zeros, width)}}, {"logits"}).at("logits"), last);
    }
  } else {
    // The prompts at once from position 0, then each sample's newest token at its position.
    DecodePositions at{zeros, o.max_positions};
    int64_t width = 0;
    std::vector<int64_t> last(prompts.size());
    for (size_t i = 0; i < prompts.size(); ++i) {
      width = std::max<int64_t>(width, static_cast<int64_t>(prompts[i].size()));
      last[i] = static_cast<int64_t>(prompts[i].size()) - 1;
    }
    take(runtime.decode(Batch{{"tokens", tokens(zeros, width)}}, at, {"logits"}).at("logits"), last);
    const std::vector<int64_t> first_row(prompts.size(), 0);
    while (!all_done()) {
      // A finished sample feeds its last token again at its last position (never read).
      for (size_t i = 0; i < ids.size(); ++i) at.start[i] = static_cast<int64_t>(ids[i].size()) - 1;
      take(runtime.decode(Batch{{"tokens", tokens(at.start, 1)}}, at, {"logits"}).at("logits"), first_row);
    }
  }
  return out;
}

CheckpointModel checkpoint_model(const std::string& path) {
  CheckpointModel c;
  c.folder = find_checkpoint(path);
  if (c.folder.empty()) throw Error("--checkpoint: '" + path + "' is not a checkpoint folder nor holds a `latest` one");
  c.manifest = c.folder + "/manifest.json";
  const nlohmann::json manifest = read_manifest(c.folder);
  c.model = manifest.is_object() && manifest.contains("model") ? manifest["model"] : nlohmann::json();
  return c;
}

}  // namespace smp
