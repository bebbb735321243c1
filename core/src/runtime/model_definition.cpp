#include "runtime/model_definition.h"

#include <smp/axis_role.h>
#include <smp/error.h>

#include "base/axis_names.h"
#include "graph/parallel_rules.h"
#include "memory/activation_checkpoint.h"
#include "plugin/module_instance.h"

#include <nlohmann/json.hpp>

namespace smp {


ModelDefinition::ModelDefinition(const JobConfig& job, const DeviceMesh& mesh, const std::vector<PluginSource>& plugins) {
  load_plugins(job, plugins);
  adapter_ = std::make_unique<AdapterInstance>(registry_, job.adapter, job.model.dump(), job.parallel_json.dump(),
                                               job.train.seed, job.origin);
  graph_ = adapter_->describe();
  // Chosen on the adapter's own kinds and names, before the rules rewrite kinds.
  checkpoint_ = select_checkpointed(graph_, job.memory.checkpoint, job.memory.checkpoint_every, job.origin);
  recompute_core_ = select_checkpointed(graph_, job.memory.checkpoint_attention_core, 1, job.origin,
                                        "memory.checkpoint_attention_core");
  apply_rules(job, mesh);
  check_kinds(job);
}

ModelDefinition::~ModelDefinition() = default;


// Rules per axis, in the mesh's order (tp, the job's axes, ep). A job's own
// axis must split something: otherwise its ranks would only repeat each other.
void ModelDefinition::apply_rules(const JobConfig& job, const DeviceMesh& mesh) {
  for (const Axis& a : mesh.rule_axes()) {
    const int n = mesh.size(a);
    if (n <= 1) continue;
    if (mesh.role(a) == AxisRole::SplitsSequence) {
      check_sequence_split(job, mesh, a);
      continue;
    }
    const int split = apply_parallel_rules(graph_, registry_, a.name(), n, job.parallel.tp_replicate_indivisible);
    // An axis that splits nothing would only repeat the work on each of its ranks.
    if (split == 0) {
      const std::string key = axis_size_key(a.name());
      std::string kinds;
      for (const GraphNode& node : graph_.nodes)
        if (kinds.find("'" + node.kind + "'") == std::string::npos) kinds += (kinds.empty() ? "'" : ", '") + node.kind + "'";
      throw Error(job.origin + ": " + key + " = " + std::to_string(n) + ": no node of the model is split over \"" +
                  a.name() + "\": no loaded plugin has a \"" + a.name() + "\" rule for its kinds (" + kinds +
                  "), so every rank of the axis would repeat the same work (load a plugin with such rules, use the "
                  "SDK's tensor-parallel blocks inside the model, or set " + key + " = 1)");
    }
  }
}

// A sequence axis: the adapter cuts each sample's sequence, every node's kind
// computes on a share of it (a rule for the axis each), and the loss is a sum
// with a count, so that the shares' sums add up over the axis before the mean.
void ModelDefinition::check_sequence_split(const JobConfig& job, const DeviceMesh& mesh, const Axis& a) {
  const int n = mesh.size(a);
  const std::string key = axis_size_key(a.name());
  const std::string where = job.origin + ": " + key + " = " + std::to_string(n) + ": adapter '" + adapter_->name() +
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
    throw Error(job.origin + ": " + e.what());
  }
}

void ModelDefinition::load_plugins(const JobConfig& job, const std::vector<PluginSource>& plugins) {
  for (const auto& p : plugins) registry_.load_source(p);
  for (const auto& p : job.plugins.paths) registry_.load(p);
  for (const char* standard : {"smp_nn", "smp_tp", "smp_partition", "smp_optim"}) registry_.load_unless_provided(standard);
  plugin_tables_ = registry_.check_tables(job.plugin_tables, job.origin);
}

// Every node's kind is provided, and only kinds that can recompute an attention core are asked to.
void ModelDefinition::check_kinds(const JobConfig& job) const {
  for (size_t i = 0; i < graph_.nodes.size(); ++i) {
    const GraphNode& n = graph_.nodes[i];
    if (!registry_.has_module_kind(n.kind)) {
      std::string loaded;
      for (const auto& p : registry_.plugins()) loaded += (loaded.empty() ? "" : ", ") + p.name;
      throw Error("node '" + n.name + "': no loaded plugin provides module kind '" + n.kind + "' (loaded: " + loaded + ")");
    }
    if (recompute_core_[i] && !kind_recomputes_attention_core(registry_, n.kind))
      throw Error(job.origin + ": memory.checkpoint_attention_core: node '" + n.name + "' is of kind '" + n.kind +
                  "' (plugin '" + registry_.provider(n.kind) + "'), which cannot recompute an attention core");
  }
}

}  // namespace smp
