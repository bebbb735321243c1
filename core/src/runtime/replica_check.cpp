#include "runtime/replica_check.h"

#include <smp/error.h>

#include "comm/communicator.h"

#include <ATen/ATen.h>

#include <cstring>
#include <map>

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
  std::map<std::string, std::vector<const ReplicaCandidate*>> by_axis;
  for (const auto& p : params)
    if (mesh.size(p.data_axis) > 1) by_axis[p.data_axis.name()].push_back(&p);
  for (const Axis axis : {Axis::DP, Axis::EDP}) {
    if (mesh.size(axis) <= 1) continue;
    const auto& list = by_axis[axis.name()];
    Communicator& comm = comm_of(axis);
    // Every rank of the axis holds the same parameters in the same order (one
    // model-parallel coordinate): the count first, so a mismatch is named too.
    const int64_t n = static_cast<int64_t>(list.size());
    at::Tensor mine = at::empty({n + 1}, at::kLong);
    mine[0] = n;
    for (int64_t i = 0; i < n; ++i) mine[i + 1] = static_cast<int64_t>(fingerprint(list[i]->tensor));
    at::Tensor counts = at::empty({comm.size()}, at::kLong), count = mine.narrow(0, 0, 1).clone();
    comm.allgather(count, counts)->wait();
    for (int r = 0; r < comm.size(); ++r)
      if (counts[r].item<int64_t>() != n)
        throw Error(origin + ": world rank " + std::to_string(comm.global_ranks()[r]) + " holds " +
                    std::to_string(counts[r].item<int64_t>()) + " parameters replicated over " + axis.name() +
                    ", this rank " + std::to_string(n));
    at::Tensor all = at::empty({comm.size() * (n + 1)}, at::kLong);
    comm.allgather(mine, all)->wait();
    const int64_t* v = all.data_ptr<int64_t>();
    for (int64_t i = 0; i < n; ++i)
      for (int r = 1; r < comm.size(); ++r)
        if (v[r * (n + 1) + i + 1] != v[i + 1])
          throw Error(origin + ": parameter '" + list[i]->name + "' starts with different values on world ranks " +
                      std::to_string(comm.global_ranks()[0]) + " and " + std::to_string(comm.global_ranks()[r]) +
                      ", replicas over " + axis.name() + ": its module kind initialises it differently per rank "
                      "(seed the initialisation from the node's init_seed, as the SDK's InitStream and "
                      "torch-module kinds do, or build the program's model the same way on every rank)");
  }
}

}  // namespace smp
