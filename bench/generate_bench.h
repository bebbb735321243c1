// smp-bench generate: smp-generate's tokens/s (1 rank, KV cache) against a
// plain LibTorch greedy loop with a KV cache at the same thread count, batch 1
// and 8; and smp-checkpoint export / import times in Hugging Face's layout
// against the disk's sequential write throughput measured in the same rounds.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

namespace bench {

struct GenerateBenchOptions {
  std::string config;      // the model (bench/configs/generate-bench.toml)
  int repeat = 10;         // interleaved rounds
  int64_t new_tokens = 32;
  int64_t prompt_tokens = 16;
  double quiet_cores = 0.5, job_wait_s = 60;
};

nlohmann::json run_generate_bench(const GenerateBenchOptions& o);

}  // namespace bench
