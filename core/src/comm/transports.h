// Which transport carries an op of one group: shared memory (every member on
// this host) for CPU collectives and sends, NCCL for CUDA tensors where the
// group has it, else the CPU path on host copies, and Gloo for the rest.
// The one place that decides; Communicator::transport() reports it.
#pragma once

#include "comm/c10d_compat.h"

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>

namespace smp {

class ShmCollectives;
class ShmMailbox;

struct Transports {
  Transports();
  Transports(Transports&&) noexcept;
  Transports& operator=(Transports&&) noexcept;
  ~Transports();

  std::unique_ptr<c10d_compat::Backend> gloo;  // null for groups of one
  std::unique_ptr<c10d_compat::Backend> nccl;  // CUDA tensors; null: through host memory
  std::unique_ptr<ShmCollectives> shm;         // null unless every member is on this host
  std::unique_ptr<ShmMailbox> mailbox;         // CPU send/recv; null with shm
  int size = 1;

  // All-reduce, all-gather, reduce-scatter, all-to-all of tensors on `device`.
  bool via_shm(const c10::Device& device) const { return shm && device.is_cpu(); }
  // Send and receive of t.
  bool via_mailbox(const at::Tensor& t) const { return mailbox && t.is_cpu(); }
  // CUDA tensors without NCCL go through host copies and the CPU path.
  bool via_host(const at::Tensor& t) const { return t.is_cuda() && !nccl && size > 1; }
  // NCCL's own reduce-scatter (CUDA, an even split); else it is emulated.
  bool native_reduce_scatter(const at::Tensor& in, int64_t rows) const;
  c10d_compat::Backend& backend_for(const at::Tensor& t) const { return t.is_cuda() && nccl ? *nccl : *gloo; }

  // "shm", "gloo", "nccl", "local", or "<cpu path> (through host memory)".
  std::string name(const std::string& op, const c10::Device& device) const;
};

}  // namespace smp
