// What the job trains, the same on every rank: the plugins, the adapter and
// its graph with the rules of every axis applied, the plugins' job tables and
// the activation policies. Immutable once made; the ModelPlan (model_plan.h)
// adds how it is split, and the data comes from a DataSource (data_source.h).
#pragma once

#include <smp/job_config.h>
#include <smp/mesh.h>
#include <smp/model_graph.h>
#include <smp/plugin_registry.h>
#include <smp/plugin_source.h>

#include "plugin/adapter_instance.h"

#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <vector>

namespace smp {

class ModelDefinition {
 public:
  // Loads the plugins (these, then plugins.paths, then the standard ones,
  // smp_nn, smp_tp, smp_partition and smp_optim, unless a loaded plugin
  // already provides one of their capabilities), creates the adapter and its
  // graph, selects the activation policies and applies the rules of every
  // axis larger than one. Throws naming the job file, key, node or plugin.
  ModelDefinition(const JobConfig& job, const DeviceMesh& mesh, const std::vector<PluginSource>& plugins);
  ~ModelDefinition();
  ModelDefinition(const ModelDefinition&) = delete;
  ModelDefinition& operator=(const ModelDefinition&) = delete;

  const PluginRegistry& registry() const { return registry_; }
  const AdapterInstance& adapter() const { return *adapter_; }  // the adapter the graph came from
  const ModelGraph& graph() const { return graph_; }
  // The loaded plugins' tables of the job, checked by their owners, by name
  // (what modules get as SMP_EXTENSION_JOB_TABLES).
  const nlohmann::json& plugin_tables() const { return plugin_tables_; }
  const std::vector<bool>& checkpointed() const { return checkpoint_; }        // per node: recomputed in backward
  const std::vector<bool>& recompute_core() const { return recompute_core_; }  // per node: its attention core only

 private:
  void load_plugins(const JobConfig& job, const std::vector<PluginSource>& plugins);
  void apply_rules(const JobConfig& job, const DeviceMesh& mesh);
  void check_sequence_split(const JobConfig& job, const DeviceMesh& mesh, const Axis& axis);
  void check_kinds(const JobConfig& job) const;

  PluginRegistry registry_;
  std::unique_ptr<AdapterInstance> adapter_;  // destroyed before the registry whose plugin made it
  ModelGraph graph_;
  nlohmann::json plugin_tables_ = nlohmann::json::object();
  std::vector<bool> checkpoint_, recompute_core_;
};

}  // namespace smp
