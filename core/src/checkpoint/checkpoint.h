// Distributed checkpoints, independent of the layout that wrote them.
//
// A checkpoint is a folder: one safetensors shard per rank that owns values
// (rank-<r>.safetensors; a tensor held by several ranks is written by its one
// owner) and manifest.json, which lists every global tensor (name, global
// shape, dtype) and which slice of it is in which file, with each file's size
// and CRC-32C, plus the step, layout, resolved config and adapter. Loading
// assembles each tensor a rank holds from the slices that overlap it, reading
// only their byte spans, so any layout loads any other's checkpoint.
//
// Committing (rank 0, once every rank said through the rendezvous that its
// part is on disk: no polling of the file system): write the folder
// under a temporary name, fsync files and folder, rename it into place, then
// update the `latest` pointer. A crash at any moment leaves earlier
// checkpoints whole. See docs/checkpoints.md.
#pragma once

#include "checkpoint/host_snapshot.h"

#include <smp/state_types.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

namespace smp {

class Rendezvous;

inline constexpr int kCheckpointFormatVersion = 1;

// Writes this rank's part of checkpoints, one at a time, in the background.
class CheckpointWriter {
 public:
  struct Options {
    int rank = 0, world = 1;
    double timeout_s = 300;  // rank 0's wait for the other ranks' parts
    uint64_t token = 0;      // the same on every rank of this run: names its temporary folders
    // Where each rank says its part is written and rank 0 waits for all
    // (kept alive by the writer: a background save may outlive the job's
    // shutdown). Needed when world > 1.
    std::shared_ptr<Rendezvous> rendezvous;
  };
  explicit CheckpointWriter(Options o);
  ~CheckpointWriter();  // waits for the pending save; its error is logged
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Saves `entries` (this rank's state) as the folder `path`. Waits for the
  // previous save first. Synchronously: writes (and on rank 0 commits) before
  // it returns. With `async`: a background thread copies the owned entries to
  // host memory (the caller calls wait_for_snapshot before anything changes
  // them), then writes and commits. With `keep` > 0 (rank 0, after committing) the folder's parent
  // keeps the newest `keep` step-* checkpoints and `latest` names this one.
  void save(const std::string& path, const std::vector<StateEntry>& entries, const nlohmann::json& info, bool async,
            int keep, bool update_latest);
  // Waits for the pending save; rethrows its error.
  void wait();
  // Waits until the pending background save has copied the state (before
  // anything changes it: the optimizer's update).
  void wait_for_snapshot();
  // Seconds the last save() call blocked its caller (a background save's
  // copies are waited for in the next step, by wait_for_snapshot) and took in all.
  double last_blocking_seconds() const { return blocking_s_; }
  double last_total_seconds() const { return total_s_; }
  // Bytes the last save wrote: every rank's files on rank 0, its own elsewhere.
  int64_t last_bytes() const { return bytes_; }

 private:
  struct Job;
  void run(const std::shared_ptr<Job>& job);
  // Rank 0: until every rank arrived at `barrier`; throws WaitFailed after timeout_s.
  void wait_for_parts(const std::string& barrier, const std::string& target) const;
  Options o_;
  HostSnapshot snapshot_;  // the background save's copies
  std::thread thread_;
  std::exception_ptr error_;
  std::mutex snapshot_mutex_;
  std::condition_variable snapshot_done_;
  bool snapshot_pending_ = false;
  double blocking_s_ = 0, total_s_ = 0;
  int64_t bytes_ = 0;
  uint64_t saves_ = 0;  // save() calls so far: names each save's barrier
};

// The checkpoint folder `path` names: itself when it holds manifest.json, else
// (a checkpoint_dir) the folder its `latest` names; "" when neither exists.
// Throws naming the path when `latest` names a folder that is not there.
// The pieces of a checkpoint, for one kept elsewhere than a shared folder
// (runtime/memory_snapshot.h): a rank's part in `folder` (its owned entries
// as rank-<r>.safetensors; returns its index, which the manifest merges), and
// the manifest of every rank's index with `info` (the step, the layout...).
nlohmann::json write_checkpoint_part(const std::string& folder, int rank, const std::vector<StateEntry>& entries);
void write_checkpoint_manifest(const std::string& folder, const std::vector<nlohmann::json>& parts,
                               const nlohmann::json& info);

std::string find_checkpoint(const std::string& path);

// manifest.json of a checkpoint folder, checked for its format and version
// and its claims against the folder (check_manifest).
nlohmann::json read_manifest(const std::string& folder);

// Fills this rank's live entries from the checkpoint (any layout). Counters
// (0-d entries) get their values in `live[i].local`. `same_model`: whether the
// [model] tables agree, so a global shape that differs can only be the
// layout's padding (the common part loads, the rest keeps its values).
// Throws naming the file and tensor on a missing, corrupt or unlike tensor.
void load_entries(const std::string& folder, const nlohmann::json& manifest, const std::vector<StateEntry>& live,
                  bool same_model);

// The whole global tensor `name` (e.g. "model/wte.weight") in `dtype`: the
// fp32 masters for a parameter when the checkpoint has them and dtype is fp32.
at::Tensor read_global_tensor(const std::string& folder, const nlohmann::json& manifest, const std::string& name,
                              at::ScalarType dtype);

// A StateEntry holding all of a global tensor (one rank's whole copy), owned.
StateEntry whole_tensor_entry(const std::string& name, const at::Tensor& t);

// Checks the manifest's claims (check_manifest: throws at the first that
// cannot hold), then every file's size and CRC-32C and that each slice's
// tensor is in its file with the manifest's dtype and element count; returns
// the problems found in the files (empty: intact).
std::vector<std::string> verify_checkpoint(const std::string& folder, const nlohmann::json& manifest);

}  // namespace smp
