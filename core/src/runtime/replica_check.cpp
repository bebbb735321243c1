#include "runtime/replica_check.h"

#include <smp/error.h>

#include "comm/communicator.h"

#include <ATen/ATen.h>

#include <cstring>

namespace smp {

uint64_t fingerprint(const at::Tensor& t) {
  const at::Tensor c = t.detach().to(at::kCPU).contiguous();
  uint64_t h = 1469598103934665603ull ^ static_cast<uint64_t>(c.scalar_type());
  auto mix = [&h](uint64_t w) {
    h ^= w + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h *= 0x100000001b3ull;
  };
  for (int64_t d : c.sizes()) mix(static_cast<uint64_t>(d));
  const auto* bytes = static_cast<const unsigned char*>(c.data_ptr());
  const size_t n = static_cast<size_t>(c.numel()) * c.element_size();
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, bytes + i, 8);
    mix(w);
  }
  uint64_t tail = 0;
  std::memcpy(&tail, bytes + i, n - i);
  mix(tail);
  return h;
}

void check_replicas_agree(const std::vector<ReplicaCandidate>& params, const DeviceMesh& mesh,
                          const std::function<Communicator&(Axis)>& comm_of, const std::string& origin) {
  for (const Axis axis : {mesh.axis_with(Role::Batch), mesh.axis_with(Role::ExpertBatch)}) {
    if (mesh.size(axis) <= 1) continue;
    std::vector<const ReplicaCandidate*> list;
    for (const auto& p : params)
      if (p.data_axis == axis) list.push_back(&p);
    Communicator& comm = comm_of(axis);
    // Every rank of the axis holds the same parameters in the same order (one
    // model-parallel coordinate): the count first, so a mismatch is named too.
    const int64_t n = static_cast<int64_t>(list.size());
    at::Tensor count = at::full({1}, n, at::kLong), counts = at::empty({comm.size()}, at::kLong);
    comm.allgather(count, counts)->wait();
    for (int r = 0; r < comm.size(); ++r)
      if (counts[r].item<int64_t>() != n)
        throw Error(origin + ": world rank " + std::to_string(comm.global_ranks()[r]) + " holds " +
                    std::to_string(counts[r].item<int64_t>()) + " parameters replicated over " + axis.name() +
                    ", this rank " + std::to_string(n));
    if (n == 0) continue;
    at::Tensor mine = at::empty({n}, at::kLong), all = at::empty({comm.size() * n}, at::kLong);
    for (int64_t i = 0; i < n; ++i) mine[i] = static_cast<int64_t>(fingerprint(list[i]->tensor));
    comm.allgather(mine, all)->wait();
    const int64_t* v = all.data_ptr<int64_t>();
    for (int64_t i = 0; i < n; ++i)
      for (int r = 1; r < comm.size(); ++r)
        if (v[r * n + i] != v[i])
          throw Error(origin + ": parameter '" + list[i]->name + "' starts with different values on world ranks " +
                      std::to_string(comm.global_ranks()[0]) + " and " + std::to_string(comm.global_ranks()[r]) +
                      ", replicas over " + axis.name() + ": its module kind initialises it differently per rank "
                      "(seed the initialisation from the node's init_seed, as the SDK's InitStream and "
                      "torch-module kinds do, or build the program's model the same way on every rank)");
  }
}

}  // namespace smp
