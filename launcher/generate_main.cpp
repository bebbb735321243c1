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
#include <smp/sdk/tokenizer.hpp>
#include <smp/sdk/tokenizers.hpp>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

namespace {

// The first graph node's config key `key` (the model's real vocabulary: its
// loss node's "real_vocab", serial or vocabulary-parallel), or `fallback`.
int64_t node_key(const smp::ModelGraph& graph, const char* key, int64_t fallback) {
  for (const auto& n : graph.nodes) {
    const nlohmann::json c = nlohmann::json::parse(n.config_json);
    if (c.is_object() && c.contains(key)) return c[key].get<int64_t>();
  }
  return fallback;
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
  app.add_option("--seed", seed, "the sampling generator's seed");
  app.add_option("--eos-id", options.eos_id, "stop at this id (-1: never; default: the tokenizer's end of text)");
  app.add_flag("--no-kv-cache", no_cache, "feed the whole sequence for each token (the reference)");
  app.add_flag("--json", json, "one JSON line per prompt (prompt, ids, logprobs, text), then the totals");
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
    const nlohmann::json model = rt->config().to_json().value("model", nlohmann::json::object());
    std::unique_ptr<smp::sdk::Tokenizer> tokenizer = smp::sdk::model_tokenizer(model);
    if (!tokenizer) tokenizer = std::make_unique<smp::sdk::ByteTokenizer>();
    if (options.eos_id == -2)
      options.eos_id = tokenizer->eod() >= 0 && tokenizer->name() != "bytes" ? tokenizer->eod() : -1;
    options.vocab = node_key(rt->graph(), "real_vocab", tokenizer->vocab());
    options.max_positions =
        static_cast<int64_t>(rt->items_per_step() / static_cast<double>(rt->config().get_int("train.batch_size")));
    options.kv_cache = !no_cache;
    at::Generator gen = at::detail::createCPUGenerator(static_cast<uint64_t>(seed));
    std::vector<std::vector<int64_t>> encoded;
    for (const std::string& prompt : prompts) {
      encoded.push_back(tokenizer->encode(prompt));
      if (encoded.back().empty()) throw smp::Error("--prompt '" + prompt + "' has no tokens");
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
