#include "comm/process_groups.h"

namespace smp {

ProcessGroups::ProcessGroups(const DeviceMesh& mesh, std::shared_ptr<Rendezvous> rendezvous, CommOptions options)
    : mesh_(mesh), rendezvous_(std::move(rendezvous)), options_(options), handle_(new smp_mesh{this}) {}

ProcessGroups::~ProcessGroups() = default;

Communicator& ProcessGroups::cached(const std::string& key,
                                    const std::function<std::unique_ptr<Communicator>()>& make) {
  auto it = comms_.find(key);
  if (it != comms_.end()) return *it->second;
  return *(comms_[key] = make());
}

Communicator& ProcessGroups::get(Axis axis) {
  const std::string key = axis_name(axis);
  return cached(key, [&] {
    return rendezvous_->new_communicator(key, mesh_.group_name(axis), mesh_.group(axis), options_);
  });
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
