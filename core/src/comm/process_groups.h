// The communicators of one rank's device mesh: one per axis of the mesh (its
// dimensions and derived axes, whatever their names), all made when the
// object is created, in the mesh's axis order on every rank, so no plugin has
// an ordering rule to keep; and groups the core derives later (tied weights).
// Also the ABI's smp_mesh handle a module is given.
#pragma once

#include <smp/mesh.h>

#include "comm/communicator.h"

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

struct smp_mesh;  // the ABI's opaque handle, defined below

namespace smp {

class ProcessGroups {
 public:
  ProcessGroups(const DeviceMesh& mesh, std::shared_ptr<Rendezvous> rendezvous, CommOptions options);
  ~ProcessGroups();
  ProcessGroups(const ProcessGroups&) = delete;
  ProcessGroups& operator=(const ProcessGroups&) = delete;

  const DeviceMesh& mesh() const { return mesh_; }

  // This rank's group along `axis`; throws smp::Error naming the mesh's axes
  // for an axis it does not have.
  Communicator& get(const Axis& axis);
  Communicator& get(const std::string& axis) { return get(mesh_.axis(axis)); }

  // A group that is not a mesh axis, e.g. the pp ranks holding replicas of a
  // tied parameter: cached under `key`; `name` is unique per group in the job;
  // made by exactly the ranks in world_ranks (collectively, in one order: the
  // core's own calls while it builds the same modules on every rank).
  Communicator& derived(const std::string& key, const std::string& kind, const std::string& name,
                        const std::vector<int>& world_ranks);

  // The pipeline's second group over the pp axis' ranks, for messages to a
  // lower pp rank ("pp" carries those to a higher one): under NCCL a send
  // waits for its receive, and ops of one stream run in order, so the two
  // directions must not share one (schedule/nccl_order.h: with a stream per
  // pair and direction, or per group, no schedule deadlocks). Null when pp == 1.
  Communicator* pipeline_down();

  // Every communicator made so far, by key ("dp", "tp", "tied.wte", ...).
  const std::map<std::string, std::unique_ptr<Communicator>>& all() const { return comms_; }
  void reset_stats();

  // The handle plugins see; valid while this object lives.
  smp_mesh* handle();

 private:
  // pipeline: the group of the mesh's Pipeline axis (whose sends may go
  // through the rendezvous transport, comm.p2p_semantics).
  std::unique_ptr<Communicator> make(const std::string& kind, const std::string& name,
                                     const std::vector<int>& world_ranks, bool pipeline);
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
