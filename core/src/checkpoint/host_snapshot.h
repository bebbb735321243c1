// The copies a background checkpoint takes of the live state, to host memory.
//
// On a GPU they run on a side stream (not the compute stream, which the next
// step's kernels queue on), after an event recorded on the compute stream when
// the save was asked for, into one pinned buffer of exactly the snapshot's
// bytes, kept for the next save and grown only when a snapshot is larger:
// LibTorch's pinned allocator instead rounds each tensor up to a power of two
// and keeps every block it ever made. On the CPU a plain copy.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace smp {

class HostSnapshot {
 public:
  HostSnapshot();
  ~HostSnapshot();
  HostSnapshot(const HostSnapshot&) = delete;
  HostSnapshot& operator=(const HostSnapshot&) = delete;

  // On the training thread, when the save is asked for: marks where on each
  // CUDA device's current stream the state is final.
  void mark(const std::vector<at::Tensor>& tensors);
  // On the writer thread: the host copies, complete when it returns. A CUDA
  // tensor's copy is a view into the pinned buffer, valid until the next copy().
  std::vector<at::Tensor> copy(const std::vector<at::Tensor>& tensors);
  // Pinned bytes held now (0 on the CPU).
  int64_t pinned_bytes() const;

  struct Device;  // per CUDA device: side stream, event, buffer

 private:
  std::vector<std::unique_ptr<Device>> devices_;
};

}  // namespace smp
