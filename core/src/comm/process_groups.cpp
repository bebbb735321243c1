#include "comm/process_groups.h"

#include <smp/error.h>

namespace smp {

ProcessGroups::ProcessGroups(const DeviceMesh& mesh, std::shared_ptr<Rendezvous> rendezvous, CommOptions options)
    : mesh_(mesh), rendezvous_(std::move(rendezvous)), options_(options), handle_(new smp_mesh{this}) {
  for (const Axis& axis : mesh_.axes()) {
    const std::string key = axis.name();
    comms_[key] = rendezvous_->new_communicator(key, mesh_.group_name(axis), mesh_.group(axis), options_);
  }
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
  return cached(key, [&] { return rendezvous_->new_communicator(kind, name, world_ranks, options_); });
}

void ProcessGroups::reset_stats() {
  for (auto& [key, c] : comms_) c->reset_stats();
}

smp_mesh* ProcessGroups::handle() { return handle_.get(); }

}  // namespace smp
