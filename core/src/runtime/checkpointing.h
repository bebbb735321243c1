// This run's checkpoints: the train state saved with what the manifest says
// besides its tensors (step, layout, [model], graph, adapter), loaded back from
// a checkpoint of any layout, and run.resume / run.init_from carried out.
#pragma once

#include <smp/config.h>
#include <smp/job_config.h>
#include <smp/state_types.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <string>

namespace smp {

class CheckpointWriter;
class MemorySnapshot;
class ModelPlan;
class ParallelContext;
class TrainState;

class Checkpointing {
 public:
  // token: the same on every rank of this run (names its temporary folders).
  Checkpointing(const JobConfig& job, const ParallelContext& context, const ModelPlan& model, TrainState& state,
                uint64_t token);
  ~Checkpointing();  // waits for the pending save
  Checkpointing(const Checkpointing&) = delete;
  Checkpointing& operator=(const Checkpointing&) = delete;

  void save(const std::string& path);
  void save_step();  // <dir()>/step-<N>, `latest` updated, run.keep_checkpoints kept
  void load(const std::string& path);
  std::string resume();  // run.resume, then run.init_from when nothing was resumed
  // A runtime at create: run.resume only when asked (run.resume or
  // run.checkpoint_dir given, or a restarted rank), said as a warning on rank
  // 0 with the step; then run.init_from when nothing was resumed.
  ResumePoint resume_if_asked(bool asked);
  void init_from(const std::string& path);
  std::string dir() const;  // run.checkpoint_dir, or <run.dir>/checkpoints
  // run.snapshot_every: this step's state to memory, here and on the next
  // machine (memory_snapshot.h); collective. And, at the end of a run, this
  // machine's snapshots removed.
  void save_snapshot();
  void remove_snapshots();
  CheckpointWriter& writer() { return *writer_; }

 private:
  std::string resume_checkpoint(const std::string& mode);
  nlohmann::json info() const;
  const JobConfig& job_;
  const ParallelContext& context_;
  const ModelPlan& model_;
  TrainState& state_;
  std::unique_ptr<CheckpointWriter> writer_;
  std::unique_ptr<MemorySnapshot> snapshot_;  // with run.snapshot_every
};

}  // namespace smp
