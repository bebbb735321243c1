// This run's in-memory snapshots (run.snapshot_every): every k steps each rank
// writes its part of the train state to its machine's memory (run.snapshot_dir,
// /dev/shm: tmpfs) and sends a copy to its counterpart on the next machine, so
// each machine holds its own ranks' parts and the previous machine's. When an
// elastic job loses a machine, the machines left hold a whole snapshot
// between them (on two machines, each alone does): the re-formed job resumes
// from it, reading no disk, having lost at most k steps. A machine that joins
// is sent the parts it lacks. The format is a checkpoint's (checkpoint.h):
// it loads into any layout. As Gemini and torchft keep state in peers' memory.
#pragma once

#include <smp/job_config.h>
#include <smp/state_types.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace smp {

class Communicator;

class MemorySnapshot {
 public:
  // `checkpoint_dir` names the run (its snapshots' folder is named after it).
  MemorySnapshot(const JobConfig& job, Communicator& world, const std::string& checkpoint_dir);

  // Collective: this rank's part here and on the next machine, then on each
  // machine the manifest; rank 0 tells smp-launch ("committed <step>").
  void save(int64_t step, const std::vector<StateEntry>& entries, const nlohmann::json& info);

  // Collective: the newest snapshot newer than `newer_than` that the machines
  // hold between them, made whole on each machine (each part it lacks sent
  // from a rank whose machine has it). Its folder here, or "" when none is.
  std::string gather_newest(int64_t newer_than);

  // This machine's snapshots of this run removed (its lowest rank), at the end.
  void remove_local();

  // <run.snapshot_dir>/smp-snapshot-<run>/<machine>.
  const std::string& node_dir() const { return node_dir_; }

 private:
  std::vector<std::string> allgather_text(const std::string& mine);
  Communicator& world_;
  std::string node_dir_, node_;
  int local_rank_ = 0, local_size_ = 1;
  int keep_ = 2;
};

}  // namespace smp
