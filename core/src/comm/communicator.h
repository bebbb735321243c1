// One mesh axis' collectives (c10d underneath: Gloo for CPU tensors, NCCL for CUDA).
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

struct smp_comm;  // the ABI's opaque handle (comm/comm_handle.h)

namespace smp {

enum class ReduceOp { Sum, Max, Min, Product };
const char* to_string(ReduceOp op);  // "sum", "max", "min", "product"

// What this rank's communication moved, per operation name ("allreduce",
// "allgather", "reduce_scatter", "alltoall", "broadcast", "send", "recv", "barrier").
struct CommStats {
  // The bytes the standard (ring / direct) algorithm sends from this rank,
  // computed from the sizes when the op is submitted; the formulas are at the
  // top of comm/byte_accounting.h.
  std::map<std::string, int64_t> analytic;
  std::map<std::string, int64_t> calls;
  // The bytes counted where they moved, by transport then op: "shm", what this
  // rank copied into shared memory for the other members; "gloo", what it
  // wrote into the group's sockets (the kernel's count, message headers
  // included). Where Gloo ops of different names overlapped, their bytes are
  // under the names joined by '+'; bytes with no Gloo op in flight are under
  // "unattributed".
  std::map<std::string, std::map<std::string, int64_t>> sent;
  // Calls on a transport that keeps no byte count (NCCL), by transport then op.
  std::map<std::string, std::map<std::string, int64_t>> uncounted_calls;
  int64_t total_analytic() const;
};

// An outstanding asynchronous operation.
class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
  virtual bool ready() = 0;  // true once wait() would not block (it may still throw)
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual const std::string& axis() const = 0;       // "pp", "dp", "tp", "mp", "world", ...
  virtual int rank() const = 0;                       // rank within this group
  virtual int size() const = 0;
  virtual const std::vector<int>& global_ranks() const = 0;  // group rank -> world rank

  // All return a Work; call wait() before reading the result. Errors (timeouts
  // included) throw smp::Error naming the axis, the operation and the ranks.
  virtual std::shared_ptr<Work> allreduce(at::Tensor& t, ReduceOp op = ReduceOp::Sum) = 0;
  // out = cat(dim 0) of every rank's in (equal sizes).
  virtual std::shared_ptr<Work> allgather(const at::Tensor& in, at::Tensor& out) = 0;
  // out = this rank's dim-0 slice of the reduction of every rank's in.
  virtual std::shared_ptr<Work> reduce_scatter(const at::Tensor& in, at::Tensor& out,
                                               ReduceOp op = ReduceOp::Sum) = 0;
  // Dim-0 splits (rows); empty = equal.
  virtual std::shared_ptr<Work> alltoall(const at::Tensor& in, at::Tensor& out,
                                         const std::vector<int64_t>& in_splits,
                                         const std::vector<int64_t>& out_splits) = 0;
  virtual std::shared_ptr<Work> broadcast(at::Tensor& t, int root) = 0;
  virtual std::shared_ptr<Work> send(const at::Tensor& t, int peer, int tag) = 0;  // peer: group rank
  virtual std::shared_ptr<Work> recv(at::Tensor& t, int peer, int tag) = 0;
  virtual void barrier() = 0;

  // A CPU tensor of `numel` zeros in memory every member of the group maps
  // (shared memory, when all members are on this host and comm.shm_mb > 0),
  // for a tensor all-reduced again and again: allreduce() of exactly that
  // tensor stages nothing, and members that arrive first do the reduction for
  // those still computing. Every member calls it in the same order with the
  // same arguments; it returns once all have. Undefined where there is no such path.
  virtual at::Tensor shared_buffer(int64_t numel, at::ScalarType dtype) { return {}; }

  // What carries an op for tensors on `device`: "shm" (shared memory, all
  // members on this host), "gloo", "nccl", or "local" (a group of one).
  virtual std::string transport(const std::string& op, const c10::Device& device) const = 0;

  virtual CommStats stats() const = 0;  // a snapshot
  virtual void reset_stats() = 0;

  // The ABI handle plugins use; valid while this communicator lives.
  virtual smp_comm* handle() = 0;
};

}  // namespace smp

namespace smp {

struct CommOptions {
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
  // The job has CUDA tensors: they go through NCCL (a second c10d group beside
  // Gloo's, which keeps CPU tensors), or, with cuda_backend "gloo" or when two
  // members share a GPU under "auto", through host memory and the CPU path.
  bool cuda = false;
  std::string cuda_backend = "auto";  // "auto" | "nccl" | "gloo" (comm.cuda_backend)
  std::string device_key;             // this rank's GPU (base/device.h), to find shared GPUs
  int cuda_device = -1;               // its CUDA index: NCCL groups connect at once with it
  // All-reduce CPU tensors through shared memory when every member runs on this
  // host, with per-rank slots of up to this many bytes (larger tensors go in
  // chunks); also all-gather and reduce-scatter; 0 = everything through the c10d
  // backend. See core/src/comm/shm_collectives.h.
  int64_t shm_slot_bytes = int64_t{16} << 20;
  // comm.p2p_semantics = "rendezvous": send/recv under NCCL's rules on the CPU
  // (rendezvous_p2p.h), for tests; false: as the transport gives them.
  bool p2p_rendezvous = false;
};

// The job's rendezvous (a c10d TCPStore; world rank 0 hosts it) and the factory
// of communicators over it. Everything c10d-version-specific lives in c10d_compat.cpp.
class Rendezvous {
 public:
  virtual ~Rendezvous() = default;
  // In a world of more than one rank, every rendezvous a process makes on one
  // endpoint (address, port, rank, world size) shares one store, kept for the
  // process's life, each under keys of its own: a program may create runtimes
  // one after another (every rank the same ones, in the same order).
  static std::shared_ptr<Rendezvous> connect(const std::string& master_addr, int master_port, int rank,
                                             int world_size, std::chrono::milliseconds timeout);
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // Called by exactly the ranks in global_ranks (sorted or not: group rank i is
  // global_ranks[i]); `name` must be unique per group in the job ("tp.3", "tied.wte.0").
  virtual std::unique_ptr<Communicator> new_communicator(const std::string& axis, const std::string& name,
                                                         const std::vector<int>& global_ranks,
                                                         const CommOptions& options) = 0;
  virtual void set(const std::string& key, const std::string& value) = 0;
  virtual std::string get(const std::string& key) = 0;  // waits for the key
  // A barrier over the store that does not hold the arrivals up: every world
  // rank calls arrive(key) once (keys unique in the job), and wait_for_all
  // returns once all have, or throws WaitFailed (an smp::Error, comm/wait.h)
  // after `timeout`, naming the world ranks that had not arrived and `what`
  // was waited for.
  virtual void arrive(const std::string& key) = 0;
  virtual void wait_for_all(const std::string& key, std::chrono::milliseconds timeout, const std::string& what) = 0;
  // World rank 0 hosts the store, so it must not exit while others still use
  // it: every rank calls shutdown() at the end of a successful run; rank 0
  // returns once all have called it (or after `timeout`, with a warning: it
  // never throws), the others return at once. Communicators stay usable.
  virtual void shutdown(std::chrono::milliseconds timeout) = 0;
};

}  // namespace smp
