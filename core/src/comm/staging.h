// Tensors as a transport takes them: dense and contiguous (a copy when they
// are not, written back once the op completed), and CUDA tensors on host
// copies where the group has no NCCL.
#pragma once

#include "comm/communicator.h"

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>

namespace smp {

// A dense contiguous tensor to hand to a transport; `copied` when it is a copy.
struct Staged {
  at::Tensor t;
  bool copied = false;
};
Staged stage(const at::Tensor& t);

// What an op does once it completed: copy the staged result back into the
// caller's tensor when staging made a copy; the captures keep the staged
// tensors (and keep_alive, the staged input) alive until then.
std::function<void()> write_back(at::Tensor target, const Staged& result, at::Tensor keep_alive = {});

// A CUDA tensor's op on the host: `op` ran on host_out (and host copies of its
// inputs, kept alive in keep); waiting for the returned work copies host_out
// back into device_out.
std::shared_ptr<Work> copied_back(std::shared_ptr<Work> op, at::Tensor device_out, at::Tensor host_out,
                                  at::Tensor keep = {});
// An empty host tensor of t's shape and dtype.
at::Tensor host_like(const at::Tensor& t);

}  // namespace smp
