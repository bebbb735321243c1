// One training step and evaluation over this rank's stages: the executor runs
// the schedule, the gradient sync finishes, the optimizer step updates; the
// step's phases, memory account and the graph's metrics are collected.
#pragma once

#include <smp/job_config.h>
#include <smp/runtime.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace smp {

class ActivationOffload;
class Executor;
class ModelBuilder;
class OptimizerStep;
class ParallelContext;
class TrainState;

class StepRunner {
 public:
  StepRunner(const JobConfig& job, ParallelContext& context, const ModelBuilder& model, TrainState& state);
  ~StepRunner();
  StepRunner(const StepRunner&) = delete;
  StepRunner& operator=(const StepRunner&) = delete;

  // before_update runs after the gradients are reduced and before anything in
  // the state changes (a background checkpoint's copies are waited for there).
  StepResult train(const OptimizerStep& update, const std::function<void()>& before_update);
  double evaluate(int batches);
  // The graph's validation metrics over the last evaluate().
  const std::vector<std::pair<std::string, double>>& last_metrics() const { return last_metrics_; }

 private:
  const JobConfig& job_;
  ParallelContext& context_;
  const ModelBuilder& model_;
  TrainState& state_;
  std::unique_ptr<ActivationOffload> offload_;  // memory.offload: checkpointed inputs in host memory
  std::unique_ptr<Executor> executor_;
  std::vector<std::pair<std::string, double>> last_metrics_;
};

}  // namespace smp
