// How the job's model is split, the same on every rank: the definition (what
// is trained), the partition into stages, the schedules and the loss's
// normalisation. Immutable once made: a step reads it and changes nothing in
// it (the fp16 loss scale is passed to the executor's run, not stored here);
// the data comes from a DataSource apart from it.
#pragma once

#include <smp/job_config.h>
#include <smp/mesh.h>
#include <smp/stage_plan.h>

#include "graph/loss_normalizer.h"
#include "memory/memory_model.h"
#include "runtime/model_definition.h"
#include "schedule/schedule.h"

#include <memory>
#include <vector>

namespace smp {

class DataSource;
class Rendezvous;

class ModelPlan {
 public:
  // Partitions `model` into stages and makes the schedules. Costs come from
  // the adapter's hints, else from rank 0's profile shared through
  // `rendezvous` (null: none can be had, an error when the hints are missing),
  // profiled on `example`'s microbatches when given (a program-fed model),
  // else on the adapter's.
  ModelPlan(std::unique_ptr<const ModelDefinition> model, const JobConfig& job, const DeviceMesh& mesh,
            Rendezvous* rendezvous, const DataSource* example = nullptr);
  ~ModelPlan();
  ModelPlan(const ModelPlan&) = delete;
  ModelPlan& operator=(const ModelPlan&) = delete;

  const ModelDefinition& model() const { return *model_; }
  const PluginRegistry& registry() const { return model_->registry(); }
  const AdapterInstance& adapter() const { return model_->adapter(); }
  const ModelGraph& graph() const { return model_->graph(); }
  const nlohmann::json& plugin_tables() const { return model_->plugin_tables(); }
  const std::vector<bool>& checkpointed() const { return model_->checkpointed(); }
  const std::vector<bool>& recompute_core() const { return model_->recompute_core(); }

  const StagePlan& stage_plan() const { return plan_; }
  const Schedule& schedule() const { return schedule_; }
  const Schedule& eval_schedule() const { return eval_schedule_; }
  const LossNormalizer& loss() const { return *loss_; }
  int microbatches() const { return microbatches_; }
  int64_t global_batch() const { return global_batch_; }
  // The job as the memory model sees it.
  MemoryModelOptions memory_options() const;

 private:
  std::vector<NodeCost> costs(Rendezvous* rendezvous, const DataSource* example) const;

  std::unique_ptr<const ModelDefinition> model_;
  const JobConfig& job_;
  const DeviceMesh& mesh_;
  int microbatches_ = 1;
  int64_t global_batch_ = 0;
  StagePlan plan_;
  Schedule schedule_, eval_schedule_;
  std::unique_ptr<const LossNormalizer> loss_;
};

}  // namespace smp
