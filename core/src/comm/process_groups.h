// The communicators of one rank's device mesh: any axis ("pp", "dp", "tp",
// "ep", "edp", "mp", "world") or derived group (tied weights), made on first
// use through the job's Rendezvous and cached for the job. Also the ABI's
// smp_mesh handle a module is given.
#pragma once

#include <smp/abi.h>
#include <smp/mesh.h>

#include "comm/communicator.h"

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace smp {

class ProcessGroups {
 public:
  ProcessGroups(const DeviceMesh& mesh, std::shared_ptr<Rendezvous> rendezvous, CommOptions options);
  ~ProcessGroups();
  ProcessGroups(const ProcessGroups&) = delete;
  ProcessGroups& operator=(const ProcessGroups&) = delete;

  const DeviceMesh& mesh() const { return mesh_; }

  // This rank's group along `axis`, cached under the axis name. Creation is
  // collective over the group: every member must ask for the same groups in
  // the same order (true when it happens while building the same modules).
  Communicator& get(Axis axis);
  Communicator& get(const std::string& axis) { return get(axis_from_name(axis)); }

  // A group that is not a mesh axis, e.g. the pp ranks holding replicas of a
  // tied parameter: cached under `key`; `name` is unique per group in the job;
  // made by exactly the ranks in world_ranks.
  Communicator& derived(const std::string& key, const std::string& kind, const std::string& name,
                        const std::vector<int>& world_ranks);

  // Every communicator made so far, by key ("dp", "tp", "tied.wte", ...).
  const std::map<std::string, std::unique_ptr<Communicator>>& all() const { return comms_; }
  void reset_stats();

  // The handle plugins see; valid while this object lives.
  smp_mesh* handle();

 private:
  // The communicator under `key`, made by `make` the first time.
  Communicator& cached(const std::string& key, const std::function<std::unique_ptr<Communicator>()>& make);

  const DeviceMesh& mesh_;
  std::shared_ptr<Rendezvous> rendezvous_;
  CommOptions options_;
  std::map<std::string, std::unique_ptr<Communicator>> comms_;
  std::unique_ptr<smp_mesh> handle_;
};

}  // namespace smp

// The ABI's opaque smp_mesh.
struct smp_mesh {
  smp::ProcessGroups* groups;
};
