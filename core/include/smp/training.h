// The training loop every job runs: steps, validation, progress, summary.json.
// In libsmp_training (link smp::training), over the public API of libsmp_core.
#pragma once

#include <nlohmann/json.hpp>

// Exported from libsmp_core (built with hidden visibility): the public API.
#pragma GCC visibility push(default)
namespace smp {

class Runtime;

// Runs the remaining train.steps steps, validation every train.val_every steps
// (and at the end), prints a progress line per train.log_every steps on rank 0,
// and writes <run.dir>/summary.json on rank 0 (a previous summary is kept as
// summary.json.prev). Returns the summary on every rank.
nlohmann::json run_training(Runtime& runtime);

// This process' peak resident memory (VmHWM) in bytes.
int64_t peak_resident_bytes();

}  // namespace smp
#pragma GCC visibility pop
