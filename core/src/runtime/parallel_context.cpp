#include "runtime/parallel_context.h"

#include <smp/error.h>

#include "base/device.h"
#include "base/runtime_logging.h"
#include "base/test_faults.h"
#include "comm/communicator.h"
#include "comm/process_groups.h"

#include <ATen/Parallel.h>
#include <spdlog/spdlog.h>

#include <chrono>

namespace smp {

namespace {

// The job's mesh (MeshSpec::from, the one place a layout becomes a mesh), for a world of world_size.
std::unique_ptr<DeviceMesh> mesh_of(const ParallelConfig& parallel, int world_size, int rank) {
  const MeshSpec spec = MeshSpec::from(parallel);
  if (spec.world_size() != world_size)
    throw Error("device mesh: " + spec.order() + " = " + std::to_string(spec.world_size()) +
                " ranks does not equal the world size " + std::to_string(world_size));
  return std::make_unique<DeviceMesh>(spec, rank);
}

std::chrono::milliseconds timeout_of(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

}  // namespace

ParallelContext::~ParallelContext() = default;

std::unique_ptr<ParallelContext> ParallelContext::join(const JobConfig& job, const ProcessEnv& env) {
  check_test_fault_setting();  // refused before anything starts (a release build, an unknown name)
  // A program's runtime logs per rank (run.log_to_file) as smp-worker's does.
  logging::init_for_runtime(env.rank, env.world_size, job.run.dir, job.run.log_to_file);
  std::unique_ptr<ParallelContext> c(new ParallelContext());
  c->env_ = env;
  // run.threads, else OMP_NUM_THREADS (smp-launch sets 1 when ranks share the cores).
  if (int threads = threads_per_rank(job.run.threads); threads > 0) at::set_num_threads(threads);
  c->device_ = rank_device(job.run, env, job.origin);
  c->mesh_ = mesh_of(job.parallel, env.world_size, env.rank);
  const auto timeout = timeout_of(job.run.timeout_s);
  c->rendezvous_ = Rendezvous::connect(env.master_addr, env.master_port, env.rank, env.world_size, timeout);
  CommOptions opts;
  opts.timeout = timeout;
  opts.shm_slot_bytes = job.comm.shm_slot_bytes();
  opts.cuda = c->device_.is_cuda();
  opts.cuda_backend = job.comm.cuda_backend;
  opts.p2p_rendezvous = job.comm.p2p_semantics == "rendezvous";
  opts.device_key = device_key(c->device_);
  opts.cuda_device = c->device_.is_cuda() ? c->device_.index() : -1;
  c->groups_ = std::make_unique<ProcessGroups>(*c->mesh_, c->rendezvous_, opts);
  // Every axis' communicator is made with the groups, in the mesh's order on every rank.
  // What carries each dimension's all-reduces (and the world's); the pipeline
  // axis only sends and receives.
  const DeviceMesh& mesh = *c->mesh_;
  std::string transports, cuda;
  for (const Axis& a : mesh.axes()) {
    const Role role = mesh.role_of(a);
    if ((!is_dimension(role) && role != Role::World) || c->comm(a).size() <= 1) continue;
    Communicator& g = c->comm(a);
    if (role != Role::Pipeline)
      transports += std::string(transports.empty() ? "" : ", ") + axis_name(a) + " " + g.transport("allreduce", at::kCPU);
    if (role != Role::World && c->device_.is_cuda())
      cuda += std::string(cuda.empty() ? "" : ", ") + axis_name(a) + " " + g.transport("allreduce", c->device_);
  }
  // Rank 0's groups; a group spanning hosts uses the backend (the others' are alike on one host).
  if (env.rank == 0 && !transports.empty()) spdlog::info("CPU all-reduce transport: {}", transports);
  if (c->device_.is_cuda())
    spdlog::info("rank {} on {}{}{}", env.rank, c->device_.str(), cuda.empty() ? "" : "; CUDA tensors: ", cuda);
  return c;
}

std::unique_ptr<ParallelContext> ParallelContext::offline(const JobConfig& job, int world_size) {
  std::unique_ptr<ParallelContext> c(new ParallelContext());
  c->env_.world_size = world_size;
  c->env_.rank = 0;
  c->mesh_ = mesh_of(job.parallel, world_size, 0);
  return c;
}

Rendezvous& ParallelContext::rendezvous() const {
  if (!rendezvous_) throw Error("internal: the job was not joined (no rendezvous)");
  return *rendezvous_;
}

std::shared_ptr<Rendezvous> ParallelContext::shared_rendezvous() const {
  rendezvous();  // throws when not joined
  return rendezvous_;
}

ProcessGroups& ParallelContext::groups() const {
  if (!groups_) throw Error("internal: the job was not joined (no communicators)");
  return *groups_;
}

Communicator& ParallelContext::comm(Axis axis) const { return groups().get(axis); }

void ParallelContext::leave(double timeout_s) {
  if (!rendezvous_) return;
  auto rdv = std::move(rendezvous_);
  rdv->shutdown(timeout_of(timeout_s));
}

}  // namespace smp
