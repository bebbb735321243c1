// All-reduce, all-gather and reduce-scatter through shared memory, for a group
// whose ranks all run on one host (what DeepSpeed's CPU "shm" collectives and
// oneCCL do within a node).
//
// Why: over loopback, Gloo moves every byte through two socket copies and its
// own staging, and Gloo in LibTorch 1.13 has no reduce-scatter at all (smp
// emulates it with an all-to-all); bench/results/allreduce-probe.json compares
// the two on a gradient-sized all-reduce. Broadcast keeps going through the
// c10d backend; send/recv go
// through ShmMailbox (shm_mailbox.h) in the same groups.
//
// Each rank owns a slot. Per chunk of at most one slot:
//   all-reduce      copy my chunk, less my own 1/n part (split like
//                   tensor_split), into my slot (READY); reduce my part, mine
//                   read in place and the others' from their slots, into my
//                   slot and back into my tensor (REDUCED); copy the other
//                   ranks' reduced parts out of their slots (RELEASED)
//   all-gather      copy my chunk into my slot (READY); copy every slot out (RELEASED)
//   reduce-scatter  copy the chunk of every destination's slice into n
//                   sub-blocks of my slot (ranks 0 and 1: all but my own, read
//                   in place) (READY); reduce my sub-block over every slot into
//                   my output (RELEASED)
//   all-to-all(v)   copy the chunk of every other destination's slice into
//                   its sub-block of my slot (READY, with my longest slice:
//                   the chunks run to the longest of any rank's); copy my
//                   sub-block of every other slot into my output (RELEASED);
//                   my own slice goes straight from input to output
//   shared buffer   (allreduce_shared) every rank marks its buffer ready; the
//                   ranks in the call claim blocks from a counter, and a claimer
//                   reduces its block over every rank's buffer and writes the
//                   result into all of them; done when every block is.
// A rank writes its slot for the next chunk only after all ranks RELEASED the
// previous one. Reductions run in rank order, so every rank's result is the
// same bits. Waiting spins briefly (only when every rank has a core), then
// sleeps on a futex in the segment (comm/wait.h).
//
// Slots start small and grow (collectively, at the same call on every rank) to
// what the largest call needs, up to max_slot_bytes; /dev/shm space is reserved
// with posix_fallocate so a small /dev/shm is an error, not a SIGBUS later.
// The segment is unlinked as soon as every member mapped it: nothing is left
// behind when a process dies. Waiters notice a dead peer (kill(pid, 0)) within
// ~100 ms instead of waiting for the timeout.
#pragma once

#include "comm/c10d_compat.h"

#include "comm/communicator.h"

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace smp {

class ShmCollectives {
 public:
  enum Kind { kAllreduce = 0, kAllgather = 1, kReduceScatter = 2, kAlltoall = 3 };

  // Collective over the group (every member calls it, same key_prefix). Returns
  // null when the members are not all on this host (then the caller uses its
  // backend). Throws c10d_compat::Failure when the exchange fails.
  static std::unique_ptr<ShmCollectives> create(std::shared_ptr<c10d_compat::Store> store,
                                                const std::string& key_prefix, int rank, int size,
                                                int64_t max_slot_bytes, std::chrono::milliseconds timeout);
  ~ShmCollectives();

  // Tensors: dense, contiguous, CPU, alive until wait() returns. Every rank
  // makes the same sequence of calls with the same kinds, sizes, dtypes and
  // ops. They run on this group's worker thread in submission order; wait()
  // throws c10d_compat::Failure (mismatched calls; a dead peer or a timeout,
  // with the message of comm/wait.h's WaitFailed).
  // After a failure every later call fails too.
  std::shared_ptr<c10d_compat::PendingWork> allreduce(const at::Tensor& t, ReduceOp op);
  // out: n * in.numel() elements, rank j's input at [j * in.numel(), ...).
  std::shared_ptr<c10d_compat::PendingWork> allgather(const at::Tensor& in, const at::Tensor& out);
  // in: the concatenation of n slices, slice j of counts[j] elements; out:
  // counts[rank] elements, the reduction of every rank's slice `rank`.
  std::shared_ptr<c10d_compat::PendingWork> reduce_scatter(const at::Tensor& in, const at::Tensor& out,
                                                           std::vector<int64_t> counts, ReduceOp op);
  // All-to-all(v): in is n slices, slice j (in_counts[j] elements) for rank
  // j; out is n slices, slice j (out_counts[j] elements) from rank j. Each
  // rank's out_counts[j] must be rank j's in_counts[rank]. Moves bytes only.
  std::shared_ptr<c10d_compat::PendingWork> alltoall(const at::Tensor& in, const at::Tensor& out,
                                                     std::vector<int64_t> in_counts, std::vector<int64_t> out_counts);

  // A buffer of `numel` elements in shared memory that every member maps, for
  // a tensor all-reduced again and again in place (data parallelism's gradient
  // buckets). Every member calls it in the same order with the same numel and
  // dtype (the k-th call's buffers belong together); it returns once every
  // member has mapped every other's (the names are then unlinked). The tensor
  // keeps its mapping alive. Throws c10d_compat::Failure when /dev/shm has no
  // room (on every member), WaitFailed (comm/wait.h) when a member does not come.
  at::Tensor shared_buffer(int64_t numel, at::ScalarType dtype);
  // The index of the shared buffer that is exactly t (same memory, numel and
  // dtype), or -1.
  int shared_buffer_index(const at::Tensor& t) const;
  // All-reduce of shared buffer `index`, in place in every member's buffer.
  // Nothing is staged, and the work is shared out in blocks to whichever
  // members are in the call: a member still computing when the others arrive
  // leaves its share to them (with one core per rank and one rank slower, the
  // faster one reduces almost everything while it would otherwise wait).
  std::shared_ptr<c10d_compat::PendingWork> allreduce_shared(int index, ReduceOp op);

  // Bytes this rank has copied into shared memory for the other members to
  // read, over the completed part of every call of `kind` so far: an
  // all-reduce writes each byte of its tensor once (the others' parts, then
  // its reduced part), a shared-buffer all-reduce (n-1) times the blocks it
  // happened to claim, an all-gather its input, a reduce-scatter every slice
  // it does not read in place.
  int64_t bytes_written(Kind kind) const;

  struct Impl;
  struct Task;
  struct SharedBuffer;

 private:
  explicit ShmCollectives(std::unique_ptr<Impl> impl);
  std::shared_ptr<c10d_compat::PendingWork> submit(Task task, int64_t slot_bytes_wanted);
  std::unique_ptr<Impl> impl_;
};

}  // namespace smp
