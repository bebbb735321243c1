// smp-bench moe: the MoE model's step time at ep 2 against ep 1 on two ranks
// with the all-to-all's share of the step, one rank against a PyTorch-eager
// MoE of the same shape, the grouped GEMM against a loop over experts, and
// the moe preset's validation loss against its dense twin's.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace bench {

struct MoeBenchOptions {
  std::string config;                  // the benchmark model's TOML (bench/configs/moe-bench.toml)
  std::vector<std::string> overrides;  // every timed job's (steps, batch)
  int repeat = 10;                     // interleaved pairs
  bool quality = true;                 // also train configs/moe-small.toml and its dense twin
  double quiet_cores = 0.5, job_wait_s = 60;
};

nlohmann::json run_moe_bench(const MoeBenchOptions& o);

}  // namespace bench
