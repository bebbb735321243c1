#include "runtime/model_plan.h"

#include <smp/error.h>

#include "comm/communicator.h"
#include "graph/profiler.h"
#include "graph/stage_balance.h"
#include "optim/mixed_precision.h"
#include "runtime/data_source.h"

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

namespace smp {

ModelPlan::ModelPlan(std::unique_ptr<const ModelDefinition> model, const JobConfig& job, const DeviceMesh& mesh,
                     Rendezvous* rendezvous, const DataSource* example)
    : model_(std::move(model)), job_(job), mesh_(mesh) {
  const ParallelConfig& par = job_.parallel;
  const ModelGraph& graph = model_->graph();
  const PluginRegistry& registry = model_->registry();
  microbatches_ = par.microbatches;
  global_batch_ = job_.train.batch_size;
  const int chunks = par.virtual_stages, pp = mesh_.pp();
  const int num_stages = pp * chunks;
  std::vector<int> stages(graph.nodes.size(), 0);
  std::vector<NodeCost> node_costs;
  if (num_stages > 1) {
    node_costs = costs(rendezvous, example);
    stages = run_partitioner(registry, par.partition, graph, node_costs, num_stages, job_.partition,
                             par.tie_across_stages);
  } else if (!job_.partition.empty()) {
    // One stage: nothing to split, but the strategy still vets its options
    // (no [partition] key is accepted and then ignored). Costs do not matter.
    run_partitioner(registry, par.partition, graph, std::vector<NodeCost>(graph.nodes.size(), NodeCost{1.0, 1.0}), 1,
                    job_.partition, par.tie_across_stages);
  }
  plan_ = StagePlan::build(graph, stages, pp, chunks);
  plan_.costs = node_costs;
  const std::string unbalanced = stage_balance_warning(graph, plan_);
  if (!unbalanced.empty() && mesh_.rank() == 0) spdlog::warn("partition: {}", unbalanced);
  if (mesh_.rank() == 0)
    for (int st = 0; st < num_stages; ++st)
      spdlog::info("stage {} (rank {}, chunk {}): {} nodes, first '{}', last '{}'", st, plan_.rank_of(st),
                   plan_.chunk_of(st), plan_.nodes_of_stage[st].size(),
                   graph.nodes[plan_.nodes_of_stage[st].front()].name,
                   graph.nodes[plan_.nodes_of_stage[st].back()].name);
  schedule_ = make_schedule(par.schedule, pp, microbatches_, chunks);
  // Evaluation runs forwards only: GPipe's order, or the training order's forwards when chunks > 1.
  eval_schedule_ = chunks > 1 ? schedule_ : make_schedule("gpipe", pp, microbatches_, 1);
  loss_ = std::make_unique<const LossNormalizer>(graph.loss_reduction, global_batch_ / (mesh_.dp() * microbatches_));
}

ModelPlan::~ModelPlan() = default;

// Every rank must agree on the partition, so costs come from the adapter's
// hints (through the memory manager's model) or from rank 0's profile.
std::vector<NodeCost> ModelPlan::costs(Rendezvous* rendezvous, const DataSource* example) const {
  const ModelGraph& graph = model_->graph();
  const int64_t mb_samples = global_batch_ / (mesh_.dp() * microbatches_);
  std::vector<NodeCost> costs;
  const bool hinted = costs_from_hints(graph, mb_samples, costs);
  if (hinted) return memory_costs(graph, memory_options(), costs);
  if (!rendezvous)
    throw Error("--estimate-memory: the adapter gives no cost hints for every node, and without them the "
                "partition needs a profile of the model, which the estimate does not run");
  if (mesh_.rank() == 0) {
    const AdapterData adapter_data(model_->adapter(), mesh_, graph.inputs.size(), global_batch_, microbatches_);
    const DataSource& data = example ? *example : adapter_data;
    costs = profile_costs(graph, model_->registry(), [&](int mb) { return data.microbatch(DataSplit::Train, 0, mb); },
                          job_.train.seed);
    nlohmann::json j = nlohmann::json::array();
    for (auto& c : costs) j.push_back({c.compute, c.memory});
    rendezvous->set("smp/profile", j.dump());
    return costs;
  }
  auto j = nlohmann::json::parse(rendezvous->get("smp/profile"));
  costs.clear();  // what the hints filled before one was missing
  for (auto& c : j) costs.push_back({c[0].get<double>(), c[1].get<double>()});
  return costs;
}

MemoryModelOptions ModelPlan::memory_options() const {
  MemoryModelOptions o;
  o.pp = mesh_.pp();
  o.tp = mesh_.tp();
  o.dp = mesh_.dp();
  o.zero = job_.memory.zero;
  o.compute_bytes = static_cast<int>(c10::elementSize(compute_dtype(job_.train.precision)));
  o.grad_bytes = static_cast<int>(c10::elementSize(compute_dtype(job_.train.grad_reduce_dtype)));
  o.masters = job_.train.precision != Precision::Fp32;
  o.microbatch_samples = global_batch_ / (mesh_.dp() * microbatches_);
  o.checkpoint = model_->checkpointed();
  o.recompute_core = model_->recompute_core();
  o.offload = job_.memory.offload;
  o.offload_horizon = job_.memory.offload_horizon;
  return o;
}

}  // namespace smp
