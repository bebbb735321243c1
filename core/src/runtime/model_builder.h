// What the job trains and how it is split, the same on every rank: the
// plugins, the adapter and its graph, the activation policies, the rules per
// axis, the costs, the partition into stages and the schedules.
#pragma once

#include <smp/job_config.h>
#include <smp/mesh.h>
#include <smp/model_graph.h>
#include <smp/plugin_registry.h>
#include <smp/plugin_source.h>
#include <smp/stage_plan.h>

#include "graph/loss_normalizer.h"
#include "memory/memory_model.h"
#include "plugin/adapter_instance.h"
#include "schedule/schedule.h"

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

namespace smp {

class DataSource;
class Rendezvous;

class ModelBuilder {
 public:
  // Loads the plugins (these, then plugins.paths, then the standard ones,
  // smp_nn, smp_tp, smp_partition and smp_optim, unless a loaded plugin
  // already provides one of their capabilities), creates the
  // adapter and its graph, selects the activation policies and applies the
  // rules of every axis larger than one.
  ModelBuilder(const JobConfig& job, const DeviceMesh& mesh, const std::vector<PluginSource>& plugins);
  ~ModelBuilder();
  ModelBuilder(const ModelBuilder&) = delete;
  ModelBuilder& operator=(const ModelBuilder&) = delete;

  // Partitions the graph into stages and makes the schedules. Costs come from
  // the adapter's hints, else from rank 0's profile shared through `rendezvous`
  // (null: none can be had, an error when the hints are missing), profiled on
  // `example`'s microbatches when given (a program-fed model), else the adapter's.
  void plan(Rendezvous* rendezvous, const DataSource* example = nullptr);

  // The job as the memory model sees it (after plan()).
  MemoryModelOptions memory_options() const;

  const PluginRegistry& registry() const { return registry_; }
  const AdapterInstance& adapter() const { return *adapter_; }  // the adapter the graph came from
  const std::string& adapter_name() const;
  const std::string& adapter_plugin() const;  // and the plugin that provides it
  const ModelGraph& graph() const { return graph_; }
  // The loaded plugins' tables of the job, checked by their owners, by name
  // (what modules get as SMP_EXTENSION_JOB_TABLES).
  const nlohmann::json& plugin_tables() const { return plugin_tables_; }
  const StagePlan& stage_plan() const { return plan_; }
  const Schedule& schedule() const { return schedule_; }
  const Schedule& eval_schedule() const { return eval_schedule_; }
  const LossNormalizer& loss() const { return *loss_; }
  const std::vector<bool>& checkpointed() const { return checkpoint_; }        // per node: recomputed in backward
  const std::vector<bool>& recompute_core() const { return recompute_core_; }  // per node: its attention core only
  int microbatches() const { return microbatches_; }
  int64_t global_batch() const { return global_batch_; }

 private:
  void load_plugins(const std::vector<PluginSource>& plugins);
  void create_adapter();
  void apply_rules();
  void check_sequence_split(const Axis& axis);
  void check_kinds() const;

  const JobConfig& job_;
  const DeviceMesh& mesh_;
  PluginRegistry registry_;
  std::unique_ptr<AdapterInstance> adapter_;  // destroyed before the registry whose plugin made it
  ModelGraph graph_;
  nlohmann::json plugin_tables_ = nlohmann::json::object();
  StagePlan plan_;
  Schedule schedule_, eval_schedule_;
  std::unique_ptr<LossNormalizer> loss_;
  std::vector<bool> checkpoint_, recompute_core_;
  int microbatches_ = 1;
  int64_t global_batch_ = 0;
};

}  // namespace smp
