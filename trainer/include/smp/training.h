// The training loop: the one owner of the cadence keys (run.checkpoint_every,
// train.val_every, run.trace, run.profile_ops, run.dump_parameters,
// run.exit_after_steps, run.hang_timeout_s), the progress lines, metrics.jsonl
// and summary.json. smp-worker runs it over the adapter's batches; a program
// steps it with its own:
//
//   smp::Trainer trainer(*rt);
//   for (int64_t i = rt->steps_done(); i < steps && !trainer.done(); ++i) trainer.step(my_batch(i));
//   trainer.finish();
//
// In libsmp_training (link smp::training), over the public API of libsmp_core.
#pragma once

#include <smp/batch.h>
#include <smp/state_types.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>

// Exported from libsmp_core (built with hidden visibility): the public API.
#pragma GCC visibility push(default)
namespace smp {

class Runtime;

class Trainer {
 public:
  // Takes over the runtime's stepping: checks that run.dir can be written,
  // configures the trace and op profile, measures the peaks MFU is stated
  // against, logs the layout on rank 0, arms smp-launch's hang detection
  // (run.hang_timeout_s; one per process) and resumes when asked if the
  // runtime left that to it (Checkpointer::resume_if_asked).
  explicit Trainer(Runtime& runtime);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // One step on the adapter's next batch, or on the program's (as
  // Runtime::train_step), then what the cadence keys ask after it: a
  // progress line every train.log_every steps, validation every
  // train.val_every (on the adapter's validation batches; the loss in
  // StepResult::validation_loss), a checkpoint every run.checkpoint_every and
  // at the last step, and the stop run.exit_after_steps asks for (done()).
  StepResult step();
  StepResult step(const Batch& batch);
  // train.steps taken, or run.exit_after_steps reached.
  bool done() const;
  // The end of the run: a last validation (over the adapter's batches, when
  // the steps took them and train.val_batches > 0), the last checkpoint
  // committed, parameters, traces and op profiles written, and on rank 0
  // <run.dir>/summary.json (a previous summary kept as summary.json.prev) and
  // report.html. Returns the summary on every rank. Collective.
  nlohmann::json finish();
  // while (!done()) step(); return finish();
  nlohmann::json run();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Trainer(runtime).run(): the remaining train.steps steps on the adapter's batches.
nlohmann::json run_training(Runtime& runtime);

// This process' peak resident memory (VmHWM) in bytes.
int64_t peak_resident_bytes();

}  // namespace smp
#pragma GCC visibility pop
