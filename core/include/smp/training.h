// The training loop every job runs: steps, validation, progress, summary.json.
#pragma once

#include <nlohmann/json.hpp>

namespace smp {

class Runtime;

// Per-rank peak of a timed fp32 GEMM (FLOP/s) with the current thread count:
// the denominator of MFU, measured rather than assumed.
double measure_peak_flops();

// Runs the remaining train.steps steps, validation every train.val_every steps
// (and at the end), prints a progress line per train.log_every steps on rank 0,
// and writes <run.dir>/summary.json on rank 0 (a previous summary is kept as
// summary.json.prev). Returns the summary on every rank.
nlohmann::json run_training(Runtime& runtime);

// This process' peak resident memory (VmHWM) in bytes.
int64_t peak_resident_bytes();

}  // namespace smp
