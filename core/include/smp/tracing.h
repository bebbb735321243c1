// Timeline traces and op profiles of a run (run.trace, run.profile_ops), as
// the training loop turns them on and writes them. One recorder per process.
#pragma once

#include <cstdint>
#include <string>

#pragma GCC visibility push(default)
namespace smp::trace {

// Set up once per process: `rank` names the track; `label` describes it
// ("rank 1: pp 1, dp 0, tp 0"); steps are 0-based, [first_step, last_step].
void configure(bool enabled, int rank, const std::string& label, int64_t first_step, int64_t last_step);
// Writes <dir>/trace/rank-<r>.json. Returns the path ("" when tracing is off).
std::string write_rank_file(const std::string& run_dir);
// Merges the rank files of `ranks` ranks into <dir>/trace.json (rank 0, after
// every rank wrote its file). Returns the path.
std::string merge_rank_files(const std::string& run_dir, int ranks);

}  // namespace smp::trace

namespace smp::op_profile {

// Steps are 0-based here; [first, last] inclusive. Off unless enabled.
void configure(bool enabled, int64_t first_step, int64_t last_step);
// Writes <run_dir>/ops/rank-<rank>.json: {"steps": n, "ops": [{"name", "calls",
// "self_us", "total_us"} per step, the largest self time first]}; returns its path.
std::string write_rank_file(const std::string& run_dir, int rank);

}  // namespace smp::op_profile
#pragma GCC visibility pop
