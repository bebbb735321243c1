// smp-bench context-parallel: what parallel.cp buys on this machine, for the
// GPT bench model with a long sequence.
//   memory:   peak activation bytes per rank (the CPU allocator's count over a
//             step) at cp 1, 2 and 4 for one sequence length, against 1/cp;
//   speed:    step time of cp 2 against dp 2 on 2 ranks at the same global
//             batch, interleaved, the median of the paired ratios;
//   longest:  the longest sequence (doubling) whose peak activation bytes per
//             rank stay within a budget, at cp 1 and at cp 4.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace bench {

struct ContextParallelOptions {
  std::string config;                  // the GPT bench config
  std::vector<std::string> overrides;  // for every job
  int64_t memory_seq = 2048;           // the sequence of the memory comparison
  int64_t speed_seq = 512;             // and of the speed comparison
  int64_t speed_batch = 4;             // its global batch
  int repeat = 10;                     // speed pairs
  double budget_mib = 128;             // the longest sequence's budget, per rank
  int64_t longest_max = 65536;         // the doubling stops here
  double quiet_cores = 0.5, job_wait_s = 60;
};

nlohmann::json run_context_parallel(const ContextParallelOptions& o);

}  // namespace bench
