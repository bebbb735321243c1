// smp-generate: text from a checkpoint (smp's own, or imported from Hugging
// Face's layout) of a language-model adapter, on one rank or on any tp x pp
// layout under smp-launch.
//
//   smp-generate --plugin gpt --config job.toml --checkpoint PATH [--set key=value ...]
//                --prompt TEXT [--prompt TEXT ...] [--batch-size N] [--max-new-tokens 32]
//                [--temperature 0] [--top-k 0] [--top-p 1] [--seed 0] [--eos-id ID]
//                [--no-kv-cache] [--json]
//   smp-launch --nproc-per-node 2 --worker build/bin/smp-generate -- <the same> --set parallel.tp=2
//
// The job's config gives the model (its [model] table, the tokenizer) and the
// layout; the checkpoint's parameters load through run.init_from into that
// layout. Prompts go in batches of --batch-size (default: all together),
// right-padded. With the KV cache (the default) the prompts are fed once and
// then each new token is one position (Runtime::decode); --no-kv-cache feeds
// the whole sequence for every token (Runtime::forward), the reference the
// cache is tested against. Temperature 0 is greedy (argmax); otherwise the
// logits are divided by the temperature, cut to the top k and to the smallest
// set whose probability reaches top p, and sampled from a generator seeded
// with --seed, the same draws on every rank. A prompt stops at --eos-id
// (default: the tokenizer's end of text; none for bytes), after
// --max-new-tokens, or at the model's sequence length. Rank 0 prints each
// completion and tokens/s (--json: one JSON line per prompt with its ids and
// the log-probability of each where the model chose it, then one with the totals).
#include <smp/generation.h>
#include <smp/smp.h>
#include <smp/sdk/input_file.hpp>
#include <smp/data/tokenizer.hpp>
#include <smp/data/tokenizers.hpp>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

namespace {

// The first graph node's config key `key` (the model's real vocabulary: its
// loss node's "real_vocab", serial or vocabulary-parallel), or `fallback`.
// A plugin wrote these strings: parsed with the bounded parser, the value
// checked to be a positive integer.
int64_t node_key(const smp::ModelGraph& graph, const char* key, int64_t fallback) {
  for (const auto& n : graph.nodes) {
    const std::string what = "graph node '" + n.name + "' config";
    nlohmann::json c;
    try {
      c = smp::input::parse_json(n.config_json, what);
    } catch (const smp::input::Error& e) {
      throw smp::Error(e.what());
    }
    if (!c.is_object() || !c.contains(key)) continue;
    if (!c[key].is_number_integer() || c[key].get<int64_t>() <= 0)
      throw smp::Error(what + ": \"" + key + "\" is " + c[key].dump() + ", not a positive integer");
    return c[key].get<int64_t>();
  }
  return fallback;
}

// A [model] key's value as a message shows it ("not set" when absent).
std::string shown(const nlohmann::json& model, const char* key) {
  return model.is_object() && model.contains(key) ? model[key].dump() : std::string("not set");
}

std::string text_of(const nlohmann::json& model, const char* key, const std::string& fallback) {
  if (!model.is_object() || !model.contains(key) || model[key].is_null()) return fallback;
  return model[key].is_string() ? model[key].get<std::string>() : model[key].dump();
}

// Whether two tokenizer file names hold one tokenizer: the same name, the same
// file, or the same bytes. `why` gets what could not be read.
bool same_file(const std::string& a, const std::string& b, std::string& why) {
  if (a == b) return true;
  if (a.empty() || b.empty()) return false;
  const std::string ca = smp::input::canonical(a), cb = smp::input::canonical(b);
  if (!ca.empty() && ca == cb) return true;
  try {
    return smp::input::read_file(a, "the checkpoint's tokenizer file", smp::input::kMaxTokenizerBytes) ==
           smp::input::read_file(b, "the job's tokenizer file", smp::input::kMaxTokenizerBytes);
  } catch (const smp::input::Error& e) {
    why = e.what();
    return false;
  }
}

// The checkpoint's [model] (its manifest) against the job's, before a token is
// generated: a model trained on one tokenizer's ids decodes garbage through
// another's, and a vocabulary padded to the same rows loads without a shape
// error. The tokenizer (kind and files) and the vocabulary must agree;
// `vocab` is the job model's real vocabulary, `tokenizer_vocab` its
// tokenizer's. A checkpoint that records no [model] (imported) is not compared.
void check_same_model(const smp::CheckpointModel& ck, const smp::Config& config, const nlohmann::json& job,
                      int64_t vocab, int64_t tokenizer_vocab) {
  if (!ck.model.is_object()) return;
  const std::string theirs = "the checkpoint's [model] (" + ck.manifest + ")";
  const auto ours = [&](const char* key) {
    return "the job's [model] (" + config.origin_of(std::string("model.") + key) + ")";
  };
  const auto refuse = [&](const char* key, const std::string& a, const std::string& b, const std::string& why) {
    throw smp::Error(std::string("model.") + key + " differs: " + theirs + " has " + a + ", " + ours(key) + " has " +
                     b + "; the checkpoint was trained on other token ids" + (why.empty() ? "" : " (" + why + ")") +
                     ": generate with the job it was trained with");
  };
  const std::string kind_then = text_of(ck.model, "tokenizer", "bytes"), kind_now = text_of(job, "tokenizer", "bytes");
  if (kind_then != kind_now)
    refuse("tokenizer", "\"" + kind_then + "\"" + (ck.model.contains("tokenizer") ? "" : " (not set: bytes)"),
           "\"" + kind_now + "\"" + (job.contains("tokenizer") ? "" : " (not set: bytes)"), "");
  for (const char* key : {"tokenizer_model", "tokenizer_merges"}) {
    const std::string then = text_of(ck.model, key, ""), now = text_of(job, key, "");
    std::string why;
    if (same_file(then, now, why)) continue;
    // A file moved since: the same name and, below, the same vocabulary.
    if (!then.empty() && !now.empty() && smp::input::base_of(then) == smp::input::base_of(now) &&
        smp::input::canonical(then).empty())
      continue;
    refuse(key, shown(ck.model, key), shown(job, key) + (why.empty() && !then.empty() && !now.empty()
                                                             ? " (other bytes)"
                                                             : ""),
           why);
  }
  if (vocab < 0) return;  // not built yet
  int64_t then = -1;
  if (ck.model.contains("vocab")) {
    if (!ck.model["vocab"].is_number_integer())
      throw smp::Error(theirs + ": model.vocab is " + ck.model["vocab"].dump() + ", not an integer");
    then = ck.model["vocab"].get<int64_t>();
  } else if (kind_then != "bytes") {
    then = tokenizer_vocab;  // the same tokenizer's (checked above)
  }
  if (then >= 0 && then != vocab)
    refuse("vocab", std::to_string(then) + (ck.model.contains("vocab") ? "" : " (not set: the tokenizer's)"),
           std::to_string(vocab) + (job.contains("vocab") ? "" : " (not set)"), "");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"smp-generate: text from a checkpoint, on one rank or on any layout"};
  std::vector<std::string> plugins, overrides, prompts;
  std::string config_path, checkpoint;
  smp::GenerationOptions options;
  int64_t seed = 0, batch_size = 0;
  options.eos_id = -2;
  bool json = false, no_cache = false;
  app.add_option("--plugin", plugins, "plugin to load (path or name); the first model adapter found is used")
      ->required()
      ->take_all();
  app.add_option("--config", config_path, "the job's TOML (its [model] and layout)")->required();
  app.add_option("--checkpoint", checkpoint, "checkpoint folder, or a folder with a `latest` one")->required();
  app.add_option("--set", overrides, "key=value over the config (repeatable)");
  app.add_option("--prompt", prompts, "a prompt (repeatable)")->required();
  app.add_option("--batch-size", batch_size, "prompts generated together (default: all of them)")
      ->check(CLI::PositiveNumber);
  app.add_option("--max-new-tokens", options.max_new_tokens, "tokens to generate per prompt at most")
      ->check(CLI::PositiveNumber);
  app.add_option("--temperature", options.sampling.temperature, "0: greedy (argmax); else sample at this temperature")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--top-k", options.sampling.top_k, "sample among the k likeliest (0: all)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--top-p", options.sampling.top_p, "sample among the likeliest whose probability reaches p")
      ->check(CLI::Range(0.0, 1.0));
  // The seed as text, parsed strictly: CLI11 let 2^64 and more through.
  std::string seed_text;
  app.add_option("--seed", seed_text, "the sampling generator's seed (0 to 2^63 - 1)");
  auto* eos_given = app.add_option("--eos-id", options.eos_id, "stop at this id (-1: never; default: the tokenizer's end of text)");
  app.add_flag("--no-kv-cache", no_cache, "feed the whole sequence for each token (the reference)");
  app.add_flag("--json", json, "one JSON line per prompt (prompt, ids, logprobs, text), then the totals");
  CLI11_PARSE(app, argc, argv);
  try {
    // Every option in range before anything loads: NaN passes CLI11's range checks.
    smp::check_sampling(options.sampling, "--");
    if (options.max_new_tokens < 1 || options.max_new_tokens > (int64_t{1} << 31))
      throw smp::Error("--max-new-tokens is " + std::to_string(options.max_new_tokens) + ": expected 1 to 2^31");
    if (options.eos_id < -1 && eos_given->count() > 0)
      throw smp::Error("--eos-id is " + std::to_string(options.eos_id) + ": expected -1 or an id");
    if (!seed_text.empty()) {
      const auto [end, ec] = std::from_chars(seed_text.data(), seed_text.data() + seed_text.size(), seed);
      if (ec != std::errc() || end != seed_text.data() + seed_text.size() || seed < 0)
        throw smp::Error("--seed " + seed_text + ": expected a whole number from 0 to 2^63 - 1");
    }
    // The checkpoint's parameters into this layout; nothing trained, nothing resumed.
    std::vector<std::string> sets = overrides;
    // No log files: generating is not a run of the job's (its run.dir is the training run's).
    for (const std::string s :
         {"run.resume=\"never\"", "run.dump_parameters=false", "parallel.microbatches=1", "run.log_to_file=false"})
      sets.push_back(s);
    sets.push_back("run.init_from=\"" + checkpoint + "\"");
    smp::Config config = smp::Config::load(config_path, sets);
    // The checkpoint's [model] against this job's: the tokenizer before
    // anything loads, the vocabulary once the model is built.
    const smp::CheckpointModel saved = smp::checkpoint_model(checkpoint);
    const nlohmann::json job_model = config.to_json().value("model", nlohmann::json::object());
    check_same_model(saved, config, job_model, -1, -1);
    auto rt = smp::Runtime::create(config, smp::ProcessEnv::from_environment(), {plugins.begin(), plugins.end()});
    const bool talk = rt->mesh().rank() == 0;
    const nlohmann::json model = rt->config().to_json().value("model", nlohmann::json::object());
    std::unique_ptr<smp::sdk::Tokenizer> tokenizer = smp::sdk::model_tokenizer(model);
    if (!tokenizer) tokenizer = std::make_unique<smp::sdk::ByteTokenizer>();
    if (options.eos_id == -2)
      options.eos_id = tokenizer->eod() >= 0 && tokenizer->name() != "bytes" ? tokenizer->eod() : -1;
    options.vocab = node_key(rt->graph(), "real_vocab", tokenizer->vocab());
    check_same_model(saved, config, job_model, options.vocab, tokenizer->vocab());
    if (options.sampling.top_k > options.vocab)
      throw smp::Error("--top-k is " + std::to_string(options.sampling.top_k) + ", more than the model's vocabulary (" +
                       std::to_string(options.vocab) + "); 0 takes every token");
    if (options.eos_id >= options.vocab)
      throw smp::Error("--eos-id is " + std::to_string(options.eos_id) + ", outside the model's vocabulary (" +
                       std::to_string(options.vocab) + ")");
    options.max_positions =
        static_cast<int64_t>(rt->items_per_step() / static_cast<double>(rt->config().get_int("train.batch_size")));
    options.kv_cache = !no_cache;
    at::Generator gen = at::detail::createCPUGenerator(static_cast<uint64_t>(seed));
    std::vector<std::vector<int64_t>> encoded;
    for (const std::string& prompt : prompts) {
      encoded.push_back(tokenizer->encode(prompt));
      if (encoded.back().empty()) throw smp::Error("--prompt '" + prompt + "' has no tokens");
      if (static_cast<int64_t>(encoded.back().size()) >= options.max_positions)
        throw smp::Error("--prompt '" + prompt.substr(0, 40) + (prompt.size() > 40 ? "...'" : "'") + " has " +
                         std::to_string(encoded.back().size()) + " tokens; the model's sequence length is " +
                         std::to_string(options.max_positions) + ", which leaves no position for a new token");
    }
    const size_t per_batch = batch_size > 0 ? static_cast<size_t>(batch_size) : prompts.size();
    int64_t generated = 0;
    double seconds = 0;
    for (size_t first = 0; first < prompts.size(); first += per_batch) {
      const size_t end = std::min(prompts.size(), first + per_batch);
      const std::vector<std::vector<int64_t>> batch(encoded.begin() + static_cast<std::ptrdiff_t>(first),
                                                    encoded.begin() + static_cast<std::ptrdiff_t>(end));
      const auto t0 = std::chrono::steady_clock::now();
      const std::vector<smp::Completion> out = smp::generate(*rt, batch, options, gen);
      seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      for (size_t i = 0; i < out.size(); ++i) {
        generated += static_cast<int64_t>(out[i].ids.size());
        if (!talk) continue;
        const std::string& prompt = prompts[first + i];
        if (json)
          std::cout << nlohmann::json{{"prompt", prompt},
                                      {"ids", out[i].ids},
                                      {"logprobs", out[i].logprobs},
                                      {"text", tokenizer->decode(out[i].ids)}}
                           .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
                    << std::endl;
        else
          std::cout << prompt << tokenizer->decode(out[i].ids) << "\n---" << std::endl;
      }
    }
    const double rate = seconds > 0 ? generated / seconds : 0.0;
    if (talk && json)
      std::cout << nlohmann::json{{"generated", generated}, {"seconds", seconds}, {"tokens_per_s", rate},
                                  {"kv_cache", options.kv_cache}, {"batch_size", per_batch},
                                  {"ranks", rt->mesh().world_size()}}
                       .dump()
                << std::endl;
    if (talk)
      std::cerr << "smp-generate: " << generated << " tokens in " << seconds << " s (" << rate << " tokens/s, "
                << (options.kv_cache ? "KV cache" : "no KV cache: each token one forward of the whole sequence")
                << ", batches of " << per_batch << "), on " << rt->mesh().world_size() << " rank(s)" << std::endl;
    rt->shutdown();
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "smp-generate: error: " << e.what() << std::endl;
    return 1;
  }
}
