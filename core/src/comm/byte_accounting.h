// What a communicator's ops moved, counted once per op and per transport
// (CommStats): the analytic bytes of the standard algorithm when the op is
// issued, and the bytes the transport that carried it counted.
//
// Analytic bytes (CommStats::analytic[op]): the bytes THIS rank sends for the
// op under the standard algorithm, as exact integers. n = group size, r =
// group rank, B = the tensor's bytes (numel * element size). Groups of one send 0.
//   allreduce       ring (reduce-scatter then allgather) over n chunks split
//                   like torch.tensor_split (the first numel % n chunks one
//                   element longer): rank r sends every chunk but (r+1)%n in
//                   the first phase and every chunk but (r+2)%n in the second:
//                   2*B - chunk[(r+1)%n] - chunk[(r+2)%n]. That is exactly
//                   2*(n-1)/n * B when numel % n == 0, and sums to 2*(n-1)*B
//                   over the group in every case.
//   allgather       (n-1) * B_in (its block to every other rank).
//   reduce_scatter  B_in - B_out: every slice of its input but its own (what a
//                   direct / ring reduce-scatter sends); = (n-1)/n * B_in when even.
//   alltoall        the rows it sends to other ranks: sum over j != r of
//                   in_splits[j] * row bytes.
//   broadcast       a binomial tree (what Gloo runs): with v = (r - root) mod n,
//                   in round k the ranks v < 2^k send to v + 2^k (when < n):
//                   B per such round; (n-1) B over the group.
//   send            B.   recv, barrier: 0.
// CommStats::calls[op] counts calls (groups of one included). Analytic bytes
// are counted when the op is submitted, whether or not it then succeeds; an op
// on CUDA tensors staged through host memory is counted once, by the host op.
//
// Measured bytes (CommStats::sent[transport][op]) are counted by the transport
// that moved them: shared memory counts its copies into shared memory (see
// ShmCollectives::bytes_written; a one-host all-reduce writes each byte once,
// not a ring's 2(n-1)/n); Gloo's are the kernel's count of what this rank
// wrote into the group's sockets, read before a Gloo op is submitted and when
// stats() is read, and given to the Gloo ops in flight in between. NCCL keeps
// no count we can read: its calls are tallied in uncounted_calls.
#pragma once

#include "comm/c10d_compat.h"
#include "comm/comm_work.h"
#include "comm/communicator.h"

#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace smp {

class ShmCollectives;
class ShmMailbox;

// Rows of slice i when `rows` rows are split n ways (torch.tensor_split).
int64_t split_rows(int64_t rows, int n, int i);
// The bytes rank r sends in a ring all-reduce / a binomial-tree broadcast from `root`.
int64_t ring_allreduce_bytes(int64_t numel, int64_t esize, int n, int r);
int64_t tree_broadcast_bytes(int64_t bytes, int n, int r, int root);

class ByteAccounting {
 public:
  // gloo: the group's Gloo backend when its socket bytes can be read (else
  // null); shm, mailbox: the shared-memory transports (null where absent).
  ByteAccounting(const c10d_compat::Backend* gloo, const ShmCollectives* shm, const ShmMailbox* mailbox);

  // An op is issued (once per call, whatever carries it): its analytic bytes
  // and its call. The op this thread submits next is this one.
  void count(const std::string& op, int64_t bytes);
  // The trace tag of the op this thread issues (cleared: taken once).
  TraceTag take_trace_tag();

  // Before this thread submits its op through the c10d backend `via`: Gloo's
  // bytes so far go to the ops already in flight; a backend with no count
  // (NCCL) tallies the call.
  void before_backend_op(const c10d_compat::Backend& via);
  // Before an op that Gloo may carry after all (a shared-memory send that
  // finds its outbox full): the same reading, only when Gloo ops are in flight.
  void before_possible_gloo_op();
  // The op this thread submitted went through Gloo: its bytes from now until
  // it completes are its own (shared with the Gloo ops in flight beside it).
  void track_gloo(std::shared_ptr<c10d_compat::PendingWork> work);

  CommStats stats() const;  // a snapshot
  void reset();

 private:
  void settle_gloo() const;  // under mu_
  struct GlooOp {
    std::string op;
    std::shared_ptr<c10d_compat::PendingWork> work;  // its ready() never blocks
  };
  const c10d_compat::Backend* gloo_;
  const ShmCollectives* shm_;
  const ShmMailbox* mailbox_;
  mutable std::mutex mu_;
  mutable CommStats stats_;
  mutable std::vector<GlooOp> gloo_inflight_;  // Gloo ops not seen completed
  mutable int64_t gloo_seen_ = 0;              // gloo_->bytes_written() at the last reading
  int64_t shm_base_[4] = {0, 0, 0, 0};         // shared-memory counts at the last reset
  int64_t mailbox_base_ = 0;
};

}  // namespace smp
