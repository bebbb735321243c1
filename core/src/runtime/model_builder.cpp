#include "runtime/model_builder.h"

#include <smp/axis_role.h>
#include <smp/error.h>

#include "comm/communicator.h"
#include "graph/parallel_rules.h"
#include "graph/profiler.h"
#include "graph/stage_balance.h"
#include "memory/activation_checkpoint.h"
#include "optim/mixed_precision.h"
#include "plugin/module_instance.h"
#include "runtime/data_source.h"

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

namespace smp {

namespace {
// The key that sets an axis' size: parallel.<name> for the core's own axes,
// parallel.axes.<name> for a job's.
std::string size_key(const Axis& a) {
  return std::string(builtin_axis(a.name()) ? "parallel." : "parallel.axes.") + a.name();
}
}  // namespace

ModelBuilder::ModelBuilder(const JobConfig& job, const DeviceMesh& mesh, const std::vector<PluginSource>& plugins)
    : job_(job), mesh_(mesh) {
  load_plugins(plugins);
  create_adapter();
  // Chosen on the adapter's own kinds and names, before the rules rewrite kinds.
  checkpoint_ = select_checkpointed(graph_, job.memory.checkpoint, job.memory.checkpoint_every, job.origin);
  recompute_core_ = select_checkpointed(graph_, job.memory.checkpoint_attention_core, 1, job.origin,
                                        "memory.checkpoint_attention_core");
  apply_rules();
  check_kinds();
}

ModelBuilder::~ModelBuilder() = default;

const std::string& ModelBuilder::adapter_name() const { return adapter_->name(); }
const std::string& ModelBuilder::adapter_plugin() const { return adapter_->plugin(); }

// Rules per axis, in the mesh's order (tp, the job's axes, ep). A job's own
// axis must split something: otherwise its ranks would only repeat each other.
void ModelBuilder::apply_rules() {
  for (const Axis& a : mesh_.rule_axes()) {
    const int n = mesh_.size(a);
    if (n <= 1) continue;
    if (mesh_.role(a) == AxisRole::SplitsSequence) {
      check_sequence_split(a);
      continue;
    }
    const int split = apply_parallel_rules(graph_, registry_, a.name(), n, job_.parallel.tp_replicate_indivisible);
    // An axis that splits nothing would only repeat the work on each of its ranks.
    if (split == 0) {
      const std::string key = size_key(a);
      std::string kinds;
      for (const GraphNode& node : graph_.nodes)
        if (kinds.find("'" + node.kind + "'") == std::string::npos) kinds += (kinds.empty() ? "'" : ", '") + node.kind + "'";
      throw Error(job_.origin + ": " + key + " = " + std::to_string(n) + ": no node of the model is split over \"" +
                  a.name() + "\": no loaded plugin has a \"" + a.name() + "\" rule for its kinds (" + kinds +
                  "), so every rank of the axis would repeat the same work (load a plugin with such rules, use the "
                  "SDK's tensor-parallel blocks inside the model, or set " + key + " = 1)");
    }
  }
}

// A sequence axis: the adapter cuts each sample's sequence, every node's kind
// computes on a share of it (a rule for the axis each), and the loss is a sum
// with a count, so that the shares' sums add up over the axis before the mean.
void ModelBuilder::check_sequence_split(const Axis& a) {
  const int n = mesh_.size(a);
  const std::string key = size_key(a);
  const std::string where = job_.origin + ": " + key + " = " + std::to_string(n) + ": adapter '" + adapter_->name() +
                            "' (plugin '" + adapter_->plugin() + "')";
  if (graph_.sequence_dim < 0)
    throw Error(where + " does not cut its samples' sequences (its describe() does not call "
                "GraphBuilder::split_sequence), so every rank of the axis would get whole sequences");
  if (graph_.loss_reduction != ModelGraph::LossReduction::Sum)
    throw Error(where + " declares its loss a per-sample mean (GraphBuilder::loss): each rank of the axis holds a "
                "share of every sample's tokens, so the loss must be a sum with a count (GraphBuilder::loss_sum), "
                "summed over the axis before the mean");
  try {
    apply_parallel_rules(graph_, registry_, a.name(), n, false, true, key);
  } catch (const Error& e) {
    throw Error(job_.origin + ": " + e.what());
  }
}

void ModelBuilder::load_plugins(const std::vector<PluginSource>& plugins) {
  for (const auto& p : plugins) registry_.load_source(p);
  for (const auto& p : job_.plugins.paths) registry_.load(p);
  for (const char* standard : {"smp_nn", "smp_tp", "smp_partition", "smp_optim"}) registry_.load_unless_provided(standard);
  plugin_tables_ = registry_.check_tables(job_.plugin_tables, job_.origin);
}

void ModelBuilder::create_adapter() {
  adapter_ = std::make_unique<AdapterInstance>(registry_, job_.adapter, job_.model.dump(), job_.parallel_json.dump(),
                                               job_.train.seed, job_.origin);
  graph_ = adapter_->describe();
}

// Every node's kind is provided, and only kinds that can recompute an attention core are asked to.
void ModelBuilder::check_kinds() const {
  for (size_t i = 0; i < graph_.nodes.size(); ++i) {
    const GraphNode& n = graph_.nodes[i];
    if (!registry_.has_module_kind(n.kind)) {
      std::string loaded;
      for (const auto& p : registry_.plugins()) loaded += (loaded.empty() ? "" : ", ") + p.name;
      throw Error("node '" + n.name + "': no loaded plugin provides module kind '" + n.kind + "' (loaded: " + loaded + ")");
    }
    if (recompute_core_[i] && !kind_recomputes_attention_core(registry_, n.kind))
      throw Error(job_.origin + ": memory.checkpoint_attention_core: node '" + n.name + "' is of kind '" + n.kind +
                  "' (plugin '" + registry_.provider(n.kind) + "'), which cannot recompute an attention core");
  }
}

void ModelBuilder::plan(Rendezvous* rendezvous, const DataSource* example) {
  const ParallelConfig& par = job_.parallel;
  microbatches_ = par.microbatches;
  global_batch_ = job_.train.batch_size;
  const int chunks = par.virtual_stages, pp = mesh_.pp();
  // Partition: every rank must agree, so costs come from hints or rank 0's profile.
  const int num_stages = pp * chunks;
  std::vector<int> stages(graph_.nodes.size(), 0);
  const int64_t mb_samples = global_batch_ / (mesh_.dp() * microbatches_);
  std::vector<NodeCost> costs;
  if (num_stages > 1) {
    const bool hinted = costs_from_hints(graph_, mb_samples, costs);
    if (hinted) costs = memory_costs(graph_, memory_options(), costs);  // the memory manager's model
    if (!hinted && !rendezvous)
      throw Error("--estimate-memory: the adapter gives no cost hints for every node, and without them the "
                  "partition needs a profile of the model, which the estimate does not run");
    if (!hinted && mesh_.rank() == 0) {
      const AdapterData adapter_data(*adapter_, mesh_, graph_.inputs.size(), global_batch_, microbatches_);
      const DataSource& data = example ? *example : adapter_data;
      costs = profile_costs(graph_, registry_, [&](int mb) { return data.microbatch(DataSplit::Train, 0, mb); },
                            job_.train.seed);
      nlohmann::json j = nlohmann::json::array();
      for (auto& c : costs) j.push_back({c.compute, c.memory});
      rendezvous->set("smp/profile", j.dump());
    } else if (!hinted) {
      auto j = nlohmann::json::parse(rendezvous->get("smp/profile"));
      costs.clear();  // what the hints filled before one was missing
      for (auto& c : j) costs.push_back({c[0].get<double>(), c[1].get<double>()});
    }
    stages = run_partitioner(registry_, par.partition, graph_, costs, num_stages, job_.partition, par.tie_across_stages);
  } else if (!job_.partition.empty()) {
    // One stage: nothing to split, but the strategy still vets its options
    // (no [partition] key is accepted and then ignored). Costs do not matter.
    run_partitioner(registry_, par.partition, graph_, std::vector<NodeCost>(graph_.nodes.size(), NodeCost{1.0, 1.0}), 1,
                    job_.partition, par.tie_across_stages);
  }
  plan_ = StagePlan::build(graph_, stages, pp, chunks);
  plan_.costs = costs;
  const std::string unbalanced = stage_balance_warning(graph_, plan_);
  if (!unbalanced.empty() && mesh_.rank() == 0) spdlog::warn("partition: {}", unbalanced);
  if (mesh_.rank() == 0)
    for (int st = 0; st < num_stages; ++st)
      spdlog::info("stage {} (rank {}, chunk {}): {} nodes, first '{}', last '{}'", st, plan_.rank_of(st),
                   plan_.chunk_of(st), plan_.nodes_of_stage[st].size(),
                   graph_.nodes[plan_.nodes_of_stage[st].front()].name,
                   graph_.nodes[plan_.nodes_of_stage[st].back()].name);
  schedule_ = make_schedule(par.schedule, pp, microbatches_, chunks);
  // Evaluation runs forwards only: GPipe's order, or the training order's forwards when chunks > 1.
  eval_schedule_ = chunks > 1 ? schedule_ : make_schedule("gpipe", pp, microbatches_, 1);
  loss_ = std::make_unique<LossNormalizer>(graph_.loss_reduction, mb_samples);
}

MemoryModelOptions ModelBuilder::memory_options() const {
  MemoryModelOptions o;
  o.pp = mesh_.pp();
  o.tp = mesh_.tp();
  o.dp = mesh_.dp();
  o.zero = job_.memory.zero;
  o.compute_bytes = static_cast<int>(c10::elementSize(compute_dtype(job_.train.precision)));
  o.grad_bytes = static_cast<int>(c10::elementSize(compute_dtype(job_.train.grad_reduce_dtype)));
  o.masters = job_.train.precision != Precision::Fp32;
  o.microbatch_samples = global_batch_ / (mesh_.dp() * microbatches_);
  o.checkpoint = checkpoint_;
  o.recompute_core = recompute_core_;
  o.offload = job_.memory.offload;
  o.offload_horizon = job_.memory.offload_horizon;
  return o;
}

}  // namespace smp
