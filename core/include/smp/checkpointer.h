// A runtime's checkpoints (docs/checkpoints.md): what a program saves, loads
// and resumes, apart from what it trains (Runtime) and from the loop that
// saves on a cadence (smp::Trainer). Saving, loading and resuming are
// collective: every rank makes the call. A folder holds per-rank
// safetensors shards and a manifest, readable by any layout of the same
// model.
//
//   smp::Checkpointer& ckpt = runtime->checkpoints();
//   ckpt.save("runs/a/step-100");
//   ckpt.load("runs/a/step-100");  // any layout's
#pragma once

#include <smp/state_types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

// Exported from libsmp_core (built with hidden visibility): the public API.
#pragma GCC visibility push(default)
namespace smp {

class Runtime;

class Checkpointer {
 public:
  ~Checkpointer();
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // Writes the folder `path`, replacing one of that name only once the new
  // one is complete; returns when it is committed on rank 0 and this rank's
  // part is written on the others.
  void save(const std::string& path);
  // A checkpoint folder, or a folder of them (its `latest`), saved by any
  // layout of the same model: the next step is the one after the saved step.
  // Throws naming the file and tensor at fault.
  void load(const std::string& path);
  // run.checkpoint_dir/step-<N> with `latest` updated and the newest
  // run.keep_checkpoints kept; with run.checkpoint_async the caller blocks
  // only for host copies (the next save or wait() waits for the writing).
  void save_step();
  // run.snapshot_every: this step's state to this machine's memory and a copy
  // to the next machine's (collective; smp::Trainer calls it every n steps),
  // which a re-formed elastic job resumes from; at the end of a run the
  // machine's snapshots are removed.
  void save_snapshot();
  void remove_snapshots();
  void wait();
  // What run.resume asks for; returns the folder loaded, "" if none (then
  // run.init_from, when given, sets the parameters).
  std::string resume();
  // The parameters (and fp32 masters) only, from a checkpoint folder; the
  // optimizer state and the step stay as they are.
  void init_from(const std::string& path);
  // What Runtime::create does (unless RuntimeOptions::resume_at_create is
  // false): resume as run.resume says when asked (run.resume or
  // run.checkpoint_dir given, or a rank smp-launch restarted), said as a
  // warning on rank 0, else apply run.init_from. Once: a later call returns
  // what the first did.
  ResumePoint resume_if_asked();
  // The checkpoint resume_if_asked() resumed (at create, or when called),
  // its step and the seconds the load took; an empty folder when it started
  // afresh.
  ResumePoint resumed() const;
  std::string dir() const;  // run.checkpoint_dir, or <run.dir>/checkpoints

  // Seconds the last save blocked its caller and took in all (known once it
  // is waited for); its bytes (all files on rank 0, this rank's elsewhere).
  double blocking_seconds() const;
  double total_seconds() const;
  int64_t bytes() const;

  // Everything this rank holds between steps, as slices of global tensors
  // (see StateEntry), in a fixed order; tensors are views of the live state.
  std::vector<StateEntry> entries() const;
  // Copies entries taken from a runtime of the same job and layout (this
  // rank's, cloned) into this one: the next step is the one that runtime
  // would have taken. Throws naming the first entry missing, extra or unlike.
  void load_entries(const std::vector<StateEntry>& entries);

 private:
  friend class Runtime;
  struct Impl;
  explicit Checkpointer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace smp
#pragma GCC visibility pop
