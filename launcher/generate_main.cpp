// smp-generate: text from a checkpoint (smp's own, or imported from Hugging
// Face's layout) of a language-model adapter, on one rank or over pipeline
// stages (tp > 1 is refused for now: the logits stay vocabulary-sharded).
//
//   smp-generate --plugin gpt --config job.toml --checkpoint PATH [--set key=value ...]
//                --prompt TEXT [--prompt TEXT ...] [--max-new-tokens 32]
//                [--temperature 0] [--top-k 0] [--top-p 1] [--seed 0] [--eos-id ID] [--json]
//   smp-launch --nproc-per-node 2 --worker build/bin/smp-generate -- <the same> --set parallel.pp=2
//
// The job's config gives the model (its [model] table, the tokenizer) and the
// layout; the checkpoint's parameters load through run.init_from into that
// layout. Each new token is one forward of the whole sequence so far
// (Runtime::forward, which gathers the last stage's logits on every rank):
// no KV cache yet. Temperature 0 is greedy (argmax); otherwise the logits are
// divided by the temperature, cut to the top k and to the smallest set whose
// probability reaches top p, and sampled from a generator seeded with
// --seed, the same draw on every rank. A prompt stops at --eos-id (default:
// the tokenizer's end of text; none for bytes), after --max-new-tokens, or at
// the model's sequence length. Rank 0 prints each completion and tokens/s
// (--json: one JSON line per prompt with its ids).
#include <smp/smp.h>
#include <smp/sdk/tokenizer.hpp>
#include <smp/sdk/tokenizers.hpp>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

namespace {

struct Sampling {
  double temperature = 0, top_p = 1;
  int64_t top_k = 0;
};

// The next token from the last position's logits [vocab] (float64).
int64_t next_token(at::Tensor logits, const Sampling& s, at::Generator& gen) {
  if (s.temperature <= 0) return logits.argmax().item<int64_t>();
  logits = logits / s.temperature;
  if (s.top_k > 0 && s.top_k < logits.size(0)) {
    const double kth = std::get<0>(logits.topk(s.top_k)).min().item<double>();
    logits = logits.masked_fill(logits < kth, -std::numeric_limits<double>::infinity());
  }
  at::Tensor probs = at::softmax(logits, 0);
  if (s.top_p < 1) {
    auto [sorted, order] = probs.sort(0, /*descending=*/true);
    const at::Tensor before = sorted.cumsum(0) - sorted;  // the mass of the tokens ahead of each
    at::Tensor drop = at::zeros_like(probs, at::kBool);
    drop.index_put_({order}, before >= s.top_p);
    probs = probs.masked_fill(drop, 0);
  }
  return at::multinomial(probs, 1, /*replacement=*/false, gen).item<int64_t>();
}

// A graph node's config key, or `fallback`.
int64_t node_key(const smp::ModelGraph& graph, const std::string& kind, const char* key, int64_t fallback) {
  for (const auto& n : graph.nodes)
    if (n.kind == kind) {
      const nlohmann::json c = nlohmann::json::parse(n.config_json);
      if (c.contains(key)) return c[key].get<int64_t>();
    }
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"smp-generate: text from a checkpoint, on one rank or on any layout"};
  std::vector<std::string> plugins, overrides, prompts;
  std::string config_path, checkpoint;
  Sampling sampling;
  int64_t max_new = 32, seed = 0, eos = -2;
  bool json = false;
  app.add_option("--plugin", plugins, "plugin to load (path or name); the first model adapter found is used")
      ->required()
      ->take_all();
  app.add_option("--config", config_path, "the job's TOML (its [model] and layout)")->required();
  app.add_option("--checkpoint", checkpoint, "checkpoint folder, or a folder with a `latest` one")->required();
  app.add_option("--set", overrides, "key=value over the config (repeatable)");
  app.add_option("--prompt", prompts, "a prompt (repeatable)")->required();
  app.add_option("--max-new-tokens", max_new, "tokens to generate per prompt at most")->check(CLI::PositiveNumber);
  app.add_option("--temperature", sampling.temperature, "0: greedy (argmax); else sample at this temperature")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--top-k", sampling.top_k, "sample among the k likeliest (0: all)")->check(CLI::NonNegativeNumber);
  app.add_option("--top-p", sampling.top_p, "sample among the likeliest whose probability reaches p")
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--seed", seed, "the sampling generator's seed");
  app.add_option("--eos-id", eos, "stop at this id (-1: never; default: the tokenizer's end of text)");
  app.add_flag("--json", json, "one JSON line per prompt: prompt, ids, text");
  CLI11_PARSE(app, argc, argv);
  try {
    // The checkpoint's parameters into this layout; nothing trained, nothing resumed.
    std::vector<std::string> sets = overrides;
    for (const std::string s : {"run.resume=\"never\"", "run.dump_parameters=false", "parallel.microbatches=1"})
      sets.push_back(s);
    sets.push_back("run.init_from=\"" + checkpoint + "\"");
    smp::Config config = smp::Config::load(config_path, sets);
    auto rt = smp::Runtime::create(config, smp::ProcessEnv::from_environment(), {plugins.begin(), plugins.end()});
    const bool talk = rt->mesh().rank() == 0;
    if (rt->mesh().tp() > 1)
      throw smp::Error("parallel.tp = " + std::to_string(rt->mesh().tp()) +
                       ": Runtime::forward gives each tp rank its shard of the vocabulary-parallel logits, and "
                       "gathering them for generation is not done yet: generate on 1 rank or under pp");
    const nlohmann::json model = rt->config().to_json().value("model", nlohmann::json::object());
    std::unique_ptr<smp::sdk::Tokenizer> tokenizer = smp::sdk::model_tokenizer(model);
    if (!tokenizer) tokenizer = std::make_unique<smp::sdk::ByteTokenizer>();
    if (eos == -2) eos = tokenizer->eod() >= 0 && tokenizer->name() != "bytes" ? tokenizer->eod() : -1;
    // The model's vocabulary (the padded logits are never chosen) and sequence length.
    const int64_t vocab = node_key(rt->graph(), "cross_entropy", "real_vocab", tokenizer->vocab());
    const int64_t seq_len =
        static_cast<int64_t>(rt->items_per_step() / static_cast<double>(rt->config().get_int("train.batch_size")));
    at::Generator gen = at::detail::createCPUGenerator(static_cast<uint64_t>(seed));
    int64_t generated = 0;
    double seconds = 0;
    for (const std::string& prompt : prompts) {
      std::vector<int64_t> ids = tokenizer->encode(prompt);
      if (ids.empty()) throw smp::Error("--prompt '" + prompt + "' has no tokens");
      if (static_cast<int64_t>(ids.size()) >= seq_len)
        throw smp::Error("--prompt '" + prompt + "' has " + std::to_string(ids.size()) +
                         " tokens, the model's sequence length is " + std::to_string(seq_len));
      const size_t first_new = ids.size();
      const auto t0 = std::chrono::steady_clock::now();
      for (int64_t k = 0; k < max_new && static_cast<int64_t>(ids.size()) < seq_len; ++k) {
        const at::Tensor tokens = at::tensor(ids, at::kLong).view({1, static_cast<int64_t>(ids.size())});
        const at::Tensor logits = rt->forward(smp::Batch{{"tokens", tokens}}, {"logits"}).at("logits");
        const at::Tensor last = logits[0][logits.size(1) - 1].narrow(0, 0, vocab).to(at::kDouble);
        const int64_t next = next_token(last, sampling, gen);
        ids.push_back(next);
        if (next == eos) break;
      }
      seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const std::vector<int64_t> out(ids.begin() + static_cast<std::ptrdiff_t>(first_new), ids.end());
      generated += static_cast<int64_t>(out.size());
      if (!talk) continue;
      if (json)
        std::cout << nlohmann::json{{"prompt", prompt}, {"ids", out}, {"text", tokenizer->decode(out)}}.dump(
                         -1, ' ', false, nlohmann::json::error_handler_t::replace)
                  << std::endl;
      else
        std::cout << prompt << tokenizer->decode(out) << "\n---" << std::endl;
    }
    if (talk)
      std::cerr << "smp-generate: " << generated << " tokens in " << seconds << " s ("
                << (seconds > 0 ? generated / seconds : 0.0) << " tokens/s, no KV cache: each token one forward "
                << "of the whole sequence), on " << rt->mesh().world_size() << " rank(s)" << std::endl;
    rt->shutdown();
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "smp-generate: error: " << e.what() << std::endl;
    return 1;
  }
}
