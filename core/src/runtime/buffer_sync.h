// Buffers (ABI 2.6 SMP_PARAM_FLAG_BUFFER: state a module updates in its own
// forward, such as BatchNorm's running statistics) drift apart over
// data-parallel replicas, each seeing its own samples. Before each step the
// first replica along the buffer's data-parallel axis sends its values to the
// others, as DDP's broadcast_buffers does, so that every replica evaluates and
// saves the same state. One broadcast per axis and dtype, not per buffer.
#pragma once

#include <smp/mesh.h>

#include <ATen/core/Tensor.h>

#include <functional>
#include <vector>

namespace smp {

class Communicator;

struct BufferToSync {
  at::Tensor tensor;
  Axis data_axis;  // Placements::data_parallel_axis
};

class BufferSync {
 public:
  // Keeps the buffers replicated over an axis larger than one (comm_of gives its communicator).
  BufferSync(const std::vector<BufferToSync>& buffers, const std::function<Communicator&(Axis)>& comm_of);
  // Sends the first replica's values to the others (nothing when no buffer is replicated).
  void run();
  bool empty() const { return groups_.empty(); }

 private:
  struct Group {
    Communicator* comm;
    std::vector<at::Tensor> tensors;
  };
  std::vector<Group> groups_;
};

}  // namespace smp
