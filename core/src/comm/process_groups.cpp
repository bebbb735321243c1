#include "comm/process_groups.h"

#include <smp/error.h>

#include "base/pipeline_limits.h"
#include "comm/rendezvous_p2p.h"

namespace smp {

ProcessGroups::ProcessGroups(const DeviceMesh& mesh, std::shared_ptr<Rendezvous> rendezvous, CommOptions options)
    : mesh_(mesh), rendezvous_(std::move(rendezvous)), options_(options), handle_(new smp_mesh{this}) {
  for (const Axis& axis : mesh_.axes()) {
    const std::string key = axis.name();
    const bool pipeline = mesh_.role_of(axis) == Role::Pipeline;
    comms_[key] = make(key, mesh_.group_name(axis), mesh_.group(axis), pipeline);
    if (pipeline && mesh_.group(axis).size() > 1)
      comms_["pp.down"] = make(key, mesh_.group_name(axis) + ".down", mesh_.group(axis), true);
  }
}

std::unique_ptr<Communicator> ProcessGroups::make(const std::string& kind, const std::string& name,
                                                  const std::vector<int>& world_ranks, bool pipeline) {
  // Only the pipeline's groups send and receive (plugins' sends go through
  // the ABI handle, to the transport itself).
  if (!options_.p2p_rendezvous || !pipeline || world_ranks.size() < 2)
    return rendezvous_->new_communicator(kind, name, world_ranks, options_);
  // Through Gloo (see rendezvous_p2p.h), with a timeout longer than the
  // host's, so that a hang is reported by the host waiting for it, with what
  // the stream is stuck at.
  CommOptions inner = options_;
  inner.timeout = options_.timeout * 2;
  inner.shm_slot_bytes = 0;
  return with_rendezvous_p2p(rendezvous_->new_communicator(kind, name, world_ranks, inner), options_.timeout,
                             pipeline_limits::describe);
}

Communicator* ProcessGroups::pipeline_down() {
  auto it = comms_.find("pp.down");
  return it == comms_.end() ? nullptr : it->second.get();
}

ProcessGroups::~ProcessGroups() = default;

Communicator& ProcessGroups::cached(const std::string& key,
                                    const std::function<std::unique_ptr<Communicator>()>& make) {
  auto it = comms_.find(key);
  if (it != comms_.end()) return *it->second;
  return *(comms_[key] = make());
}

Communicator& ProcessGroups::get(const Axis& axis) {
  auto it = comms_.find(axis.name());
  if (it != comms_.end()) return *it->second;
  mesh_.axis(axis.name());  // throws, naming the mesh's axes
  throw Error("internal: no communicator for axis \"" + std::string(axis.name()) + "\"");
}

Communicator& ProcessGroups::derived(const std::string& key, const std::string& kind, const std::string& name,
                                     const std::vector<int>& world_ranks) {
  return cached(key, [&] { return make(kind, name, world_ranks, false); });
}

void ProcessGroups::reset_stats() {
  for (auto& [key, c] : comms_) c->reset_stats();
}

smp_mesh* ProcessGroups::handle() { return handle_.get(); }

}  // namespace smp
