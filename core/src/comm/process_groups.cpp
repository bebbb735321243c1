#include "comm/process_groups.h"

namespace smp {

ProcessGroups::ProcessGroups(const DeviceMesh& mesh, std::shared_ptr<Rendezvous> rendezvous, CommOptions options)
    : mesh_(mesh), rendezvous_(std::move(rendezvous)), options_(options), handle_(new smp_mesh{this}) {}

ProcessGroups::~ProcessGroups() = default;

Communicator& ProcessGroups::get(Axis axis) {
  const std::string key = axis_name(axis);
  auto it = comms_.find(key);
  if (it != comms_.end()) return *it->second;
  auto c = rendezvous_->new_communicator(key, mesh_.group_name(axis), mesh_.group(axis), options_);
  return *(comms_[key] = std::move(c));
}

Communicator& ProcessGroups::derived(const std::string& key, const std::string& kind, const std::string& name,
                                     const std::vector<int>& world_ranks) {
  auto it = comms_.find(key);
  if (it != comms_.end()) return *it->second;
  auto c = rendezvous_->new_communicator(kind, name, world_ranks, options_);
  return *(comms_[key] = std::move(c));
}

void ProcessGroups::reset_stats() {
  for (auto& [key, c] : comms_) c->reset_stats();
}

smp_mesh* ProcessGroups::handle() { return handle_.get(); }

}  // namespace smp
