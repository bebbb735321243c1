// All-reduce through shared memory, for a group whose ranks all run on one
// host (what DeepSpeed's CPU "shm" all-reduce and oneCCL do within a node).
//
// Why: over loopback, Gloo moves every byte through two socket copies and its
// own staging; a 13 MB gradient all-reduce between 2 ranks took 15-25 ms in a
// training step here, the shared-memory one a few ms. Other collectives keep
// going through the c10d backend.
//
// Algorithm, per chunk of at most one slot (each rank owns a slot):
//   1. copy the input chunk into my slot;                       publish READY
//   2. reduce my part (1/n of the chunk, split like tensor_split) over every
//      rank's slot, in rank order, into my slot;                  publish REDUCED
//   3. copy every rank's reduced part out of its slot;           publish RELEASED
// A rank writes its slot for chunk s+1 only after all ranks RELEASED chunk s.
// Every part is reduced once, in the same order, so all ranks get bit-identical
// results. Waiting spins briefly, then sleeps on a futex in the segment.
//
// Slots start small and grow (collectively, at the same call on every rank) to
// the largest all-reduce seen, up to max_slot_bytes; /dev/shm space is reserved
// with posix_fallocate so a small /dev/shm is an error, not a SIGBUS later.
// The segment is unlinked as soon as every member mapped it: nothing is left
// behind when a process dies. Waiters notice a dead peer (kill(pid, 0)) within
// ~100 ms instead of waiting for the timeout.
#pragma once

#include "c10d_compat.h"

#include <smp/communicator.h>

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

namespace smp {

class ShmAllreduce {
 public:
  // Collective over the group (every member calls it, same key_prefix). Returns
  // null when the members are not all on this host (then the caller uses its
  // backend). Throws c10d_compat::Failure when the exchange fails.
  static std::unique_ptr<ShmAllreduce> create(std::shared_ptr<c10d_compat::Store> store, const std::string& key_prefix, int rank,
                                              int size, int64_t max_slot_bytes, std::chrono::milliseconds timeout);
  ~ShmAllreduce();

  // t: dense, contiguous, CPU; same numel, dtype and op on every rank, and the
  // same sequence of calls on every rank. Runs on this group's worker thread,
  // in submission order; wait() throws c10d_compat::Failure (mismatched calls,
  // a dead peer, a timeout). After a failure every later call fails too.
  std::shared_ptr<c10d_compat::PendingWork> allreduce(const at::Tensor& t, ReduceOp op);

  int64_t slot_bytes() const;

  struct Impl;

 private:
  explicit ShmAllreduce(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace smp
