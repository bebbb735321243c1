#include "runtime/buffer_sync.h"

#include "comm/communicator.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <map>
#include <utility>

namespace smp {

BufferSync::BufferSync(const std::vector<BufferToSync>& buffers, const std::function<Communicator&(Axis)>& comm_of) {
  std::map<std::pair<Communicator*, int>, size_t> group_of;
  for (const BufferToSync& b : buffers) {
    Communicator& comm = comm_of(b.data_axis);
    if (comm.size() == 1 || b.tensor.numel() == 0) continue;
    const auto key = std::make_pair(&comm, static_cast<int>(b.tensor.scalar_type()));
    auto it = group_of.find(key);
    if (it == group_of.end()) {
      it = group_of.emplace(key, groups_.size()).first;
      groups_.push_back({&comm, {}});
    }
    groups_[it->second].tensors.push_back(b.tensor);
  }
}

void BufferSync::run() {
  c10::NoGradGuard no_grad;
  for (Group& g : groups_) {
    std::vector<at::Tensor> flat;
    flat.reserve(g.tensors.size());
    for (const at::Tensor& t : g.tensors) flat.push_back(t.reshape({-1}));
    at::Tensor all = at::cat(flat);
    g.comm->broadcast(all, 0)->wait();
    int64_t offset = 0;
    for (at::Tensor& t : g.tensors) {
      t.copy_(all.narrow(0, offset, t.numel()).view_as(t));
      offset += t.numel();
    }
  }
}

}  // namespace smp
