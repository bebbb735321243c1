// smp-bench checkpoint: save and load times, write throughput against the
// disk's measured in the same run, the training stall of an async save against
// a synchronous save, and a load with resharding against one without.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace bench {

struct CheckpointBenchOptions {
  std::string config;                  // job TOML
  std::vector<std::string> overrides;  // every job's (model size, batch, steps)
  int repeat = 10;                     // interleaved rounds
  int save_every = 2;
  double quiet_cores = 0.5, job_wait_s = 60;
};

// The disk's sequential write throughput (bytes/s) for files of these sizes
// written at once under `dir`, one thread each: write + fsync.
double disk_write_bytes_per_s(const std::string& dir, const std::vector<int64_t>& sizes);

// Runs the rounds and returns the result JSON (every round's values, medians, goals).
nlohmann::json run_checkpoint_bench(const CheckpointBenchOptions& o);

}  // namespace bench
