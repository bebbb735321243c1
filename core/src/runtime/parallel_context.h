// This rank's place in the job: the process environment, its threads and
// device, the mesh of named axes, the rendezvous and every group's communicator.
#pragma once

#include <smp/job_config.h>
#include <smp/mesh.h>
#include <smp/process_env.h>

#include <c10/core/Device.h>

#include <memory>

namespace smp {

class Communicator;
class ProcessGroups;
class Rendezvous;

class ParallelContext {
 public:
  // Sets the rank's threads and device, joins the job (rendezvous) and makes
  // the communicators of the axes every job uses, in one order on every rank.
  static std::unique_ptr<ParallelContext> join(const JobConfig& job, const ProcessEnv& env);
  // Rank 0's mesh of a world_size job, without joining it (no rendezvous, no
  // communicator, the CPU): what --estimate-memory plans with.
  static std::unique_ptr<ParallelContext> offline(const JobConfig& job, int world_size);
  ~ParallelContext();

  const ProcessEnv& env() const { return env_; }
  const DeviceMesh& mesh() const { return *mesh_; }
  const c10::Device& device() const { return device_; }
  bool joined() const { return rendezvous_ != nullptr; }
  Rendezvous& rendezvous() const;  // throws when not joined
  std::shared_ptr<Rendezvous> shared_rendezvous() const;  // the same, for a holder that may outlive leave()
  ProcessGroups& groups() const;   // throws when not joined
  Communicator& comm(Axis axis) const;
  // The communicator of the one axis with `role` (DeviceMesh::axis_with).
  Communicator& comm(Role role) const { return comm(mesh_->axis_with(role)); }
  // Leaves the job (see Runtime::shutdown); idempotent.
  void leave(double timeout_s);

 private:
  ParallelContext() = default;
  ProcessEnv env_;
  std::unique_ptr<DeviceMesh> mesh_;
  c10::Device device_ = c10::Device(c10::kCPU);
  std::shared_ptr<Rendezvous> rendezvous_;
  std::unique_ptr<ProcessGroups> groups_;  // after the rendezvous it uses; destroyed first
};

}  // namespace smp
