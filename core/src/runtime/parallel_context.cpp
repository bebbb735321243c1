#include "runtime/parallel_context.h"

#include <smp/error.h>

#include "base/axis_names.h"
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

// The mesh from the resolved layout: parallel.placement names every dimension, slowest first.
std::unique_ptr<DeviceMesh> make_mesh(const ParallelConfig& par, int world_size, int rank) {
  const std::vector<std::string> names = split_names(par.placement);
  std::vector<int> shape;
  for (const auto& dim : names) {
    int size = dim == "pp" ? par.pp : dim == "dp" ? par.dp : dim == "tp" ? par.tp : dim == "cp" ? par.cp : 0;
    for (const auto& [name, n] : par.axes)
      if (name == dim) size = n;
    shape.push_back(size);
  }
  MeshOptions options;
  options.ep = par.ep;
  options.flatten = par.flatten;
  // parallel.cp's dimension splits every sample's sequence; the job's own axes split the model.
  if (par.cp > 1) options.sequence = {"cp"};
  return std::make_unique<DeviceMesh>(world_size, rank, shape, names, options);
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
  c->mesh_ = make_mesh(job.parallel, env.world_size, env.rank);
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
  std::string transports;
  for (Axis a : {Axis::PP, Axis::DP, Axis::TP, Axis::World}) {
    Communicator& g = c->comm(a);
    if (g.size() > 1 && a != Axis::PP)
      transports += std::string(transports.empty() ? "" : ", ") + axis_name(a) + " " + g.transport("allreduce", at::kCPU);
  }
  // Rank 0's groups; a group spanning hosts uses the backend (the others' are alike on one host).
  if (env.rank == 0 && !transports.empty()) spdlog::info("CPU all-reduce transport: {}", transports);
  if (c->device_.is_cuda()) {
    std::string cuda;
    for (Axis a : {Axis::PP, Axis::DP, Axis::TP})
      if (c->comm(a).size() > 1)
        cuda += std::string(cuda.empty() ? "" : ", ") + axis_name(a) + " " + c->comm(a).transport("allreduce", c->device_);
    spdlog::info("rank {} on {}{}{}", env.rank, c->device_.str(), cuda.empty() ? "" : "; CUDA tensors: ", cuda);
  }
  return c;
}

std::unique_ptr<ParallelContext> ParallelContext::offline(const JobConfig& job, int world_size) {
  std::unique_ptr<ParallelContext> c(new ParallelContext());
  c->env_.world_size = world_size;
  c->env_.rank = 0;
  c->mesh_ = make_mesh(job.parallel, world_size, 0);
  return c;
}

Rendezvous& ParallelContext::rendezvous() const {
  if (!rendezvous_) throw Error("internal: the job was not joined (no rendezvous)");
  return *rendezvous_;
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
