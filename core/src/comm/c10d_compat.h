// Private: the only door to c10d. Everything whose spelling differs between
// LibTorch 1.13 and 2.x (TCPStore options, ProcessGroup vs Backend, Gloo
// devices, Work::wait, alltoall_base, send/recv, ReduceOp) stays in
// c10d_compat.cpp; this header shows no c10d type.
#pragma once

#include "comm/communicator.h"

#include <ATen/core/Tensor.h>

#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace smp::c10d_compat {

// Any c10d / Gloo / NCCL failure, with the library's message (no C++ backtrace).
class Failure : public std::runtime_error {
 public:
  Failure(const std::string& message, bool timed_out) : std::runtime_error(message), timed_out_(timed_out) {}
  bool timed_out() const { return timed_out_; }

 private:
  bool timed_out_;
};

// An operation in flight. wait() blocks until done; throws Failure.
class PendingWork {
 public:
  virtual ~PendingWork() = default;
  virtual void wait() = 0;
  virtual bool ready() = 0;  // true once wait() would not block
};

// A c10d TCPStore (world rank 0 hosts the server).
class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const std::string& value) = 0;
  virtual std::string get(const std::string& key) = 0;  // waits up to the store timeout
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  virtual bool check(const std::string& key) = 0;  // whether the key is set; does not wait
  // How long get() (and Gloo's rendezvous over this store) waits from now on.
  virtual void set_timeout(std::chrono::milliseconds timeout) = 0;
};

// Throws Failure (bind errors, connect timeouts, workers that never joined).
std::shared_ptr<Store> connect_tcp_store(const std::string& host, int port, bool is_server, int world_size,
                                         std::chrono::milliseconds timeout);

// One process group. Tensors handed in are dense and contiguous; the caller
// keeps them alive until wait() returns. Submission errors throw Failure.
class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;  // "gloo" or "nccl"
  // True when the backend has a native (equal-split) reduce-scatter.
  virtual bool has_reduce_scatter() const = 0;
  virtual std::shared_ptr<PendingWork> allreduce(at::Tensor& t, ReduceOp op) = 0;
  // out: size * in.size(0) rows.
  virtual std::shared_ptr<PendingWork> allgather(at::Tensor& in, at::Tensor& out) = 0;
  // Native only (has_reduce_scatter()); in: size * out.size(0) rows.
  virtual std::shared_ptr<PendingWork> reduce_scatter(at::Tensor& in, at::Tensor& out, ReduceOp op) = 0;
  // Row splits along dim 0, one per rank.
  virtual std::shared_ptr<PendingWork> alltoall(at::Tensor& in, at::Tensor& out, std::vector<int64_t> in_splits,
                                                std::vector<int64_t> out_splits) = 0;
  virtual std::shared_ptr<PendingWork> broadcast(at::Tensor& t, int root) = 0;
  virtual std::shared_ptr<PendingWork> send(at::Tensor& t, int peer, int tag) = 0;
  virtual std::shared_ptr<PendingWork> recv(at::Tensor& t, int peer, int tag) = 0;
  virtual std::shared_ptr<PendingWork> barrier() = 0;
  // Bytes this rank has written to its peers over the backend's connections so
  // far, as the kernel counts them (Gloo's TCP sockets); -1 where the backend
  // keeps no count we can read (NCCL).
  virtual int64_t bytes_written() const = 0;
};

struct BackendOptions {
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
  bool cuda = false;        // NCCL (only when compiled with USE_C10D_NCCL)
  int cuda_device = -1;     // NCCL: this rank's GPU, connected at once (LibTorch >= 2.3); -1: lazily
  std::string master_addr;  // picks the Gloo device's local address
};

// A process group of `size` ranks over `store` under `prefix`; blocks until
// every member has connected (or the timeout). Throws Failure.
std::unique_ptr<Backend> make_backend(Store& store, const std::string& prefix, int rank, int size,
                                      const BackendOptions& options);

bool has_nccl();
const char* torch_version();

}  // namespace smp::c10d_compat
