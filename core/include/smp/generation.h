// Text generation over a Runtime: a batch of prompts, greedy or sampled, with
// the modules' KV caches (Runtime::decode: one position per new token) or
// without (Runtime::forward over each whole sequence, the reference). What
// smp-generate runs; a program that embeds smp calls it the same way.
#pragma once

#include <smp/runtime.h>

#include <ATen/core/Generator.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

// Exported from libsmp_core (built with hidden visibility): the public API.
#pragma GCC visibility push(default)
namespace smp {

struct Sampling {
  double temperature = 0;  // 0: greedy (argmax); finite, at most kMaxTemperature
  int64_t top_k = 0;       // 0: every token; 1: greedy
  double top_p = 1;        // 1: every token; 0: the most likely token only (greedy); in [0, 1]
};

inline constexpr double kMaxTemperature = 1e6;

// Throws smp::Error naming the setting (`names` "--" names smp-generate's
// options, --top-k; any other prefixes the field: "sampling.top_k") when a value is
// outside its range: temperature NaN, infinite, negative or above
// kMaxTemperature; top_k negative; top_p NaN or outside [0, 1].
void check_sampling(const Sampling& s, const std::string& names = "sampling.");

struct GenerationOptions {
  Sampling sampling;
  int64_t max_new_tokens = 32;
  int64_t eos_id = -1;      // stop a prompt at this id; -1: never
  int64_t vocab = 0;        // the model's own vocabulary (padded logits past it are never chosen)
  int64_t max_positions = 0;  // the model's sequence length: a prompt stops there
  bool kv_cache = true;
};

// The next token from one position's logits [vocab] (float64): argmax at
// temperature 0, top_k 1 or top_p 0; else the logits over the temperature,
// cut to the top k and to the smallest set whose probability reaches top p
// (never fewer than the most likely token, as transformers keeps one),
// sampled from `gen`. Settings out of range (check_sampling) and logits that
// are not finite are refused.
int64_t next_token(at::Tensor logits, const Sampling& s, at::Generator& gen);

// One prompt's new tokens, and the model's log-probability of each (over the
// model's vocabulary, before temperature and cuts) where it chose it.
struct Completion {
  std::vector<int64_t> ids;
  std::vector<double> logprobs;
};

// The completion of each prompt (ids, each non-empty and shorter than
// max_positions), generated together as one batch: prompts are right-padded,
// so that under causal attention a sample never sees another's padding, and
// each reads its logits at its own last position. Same call on every rank.
// Sampling draws sample by sample at each step from `gen`.
std::vector<Completion> generate(Runtime& runtime, const std::vector<std::vector<int64_t>>& prompts,
                                 const GenerationOptions& options, at::Generator& gen);

// The [model] table a checkpoint was saved with (its manifest's "model"; null
// where the manifest records none, as `smp-checkpoint import` writes none),
// and the folder and manifest file it came from. `path`: a checkpoint folder
// or a folder with a `latest` one. Throws smp::Error naming the path.
struct CheckpointModel {
  std::string folder;
  std::string manifest;  // folder + "/manifest.json"
  nlohmann::json model;
};
CheckpointModel checkpoint_model(const std::string& path);

}  // namespace smp
#pragma GCC visibility pop
