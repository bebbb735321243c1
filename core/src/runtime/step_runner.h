// One training step and evaluation over this rank's stages: the executor runs
// the schedule, the gradient sync finishes, the optimizer step updates; the
// step's phases (host and, on a GPU, device seconds), memory account and the
// graph's metrics are collected.
#pragma once

#include <smp/batch.h>
#include <smp/job_config.h>
#include <smp/runtime.h>

#include "runtime/data_source.h"

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace smp {

class ActivationOffload;
class Executor;
class ModelPlan;
class OptimizerStep;
class ParallelContext;
class PhaseClock;
class TrainState;

class StepRunner {
 public:
  StepRunner(const JobConfig& job, ParallelContext& context, const ModelPlan& model, TrainState& state);
  ~StepRunner();
  StepRunner(const StepRunner&) = delete;
  StepRunner& operator=(const StepRunner&) = delete;

  // before_update runs after the gradients are reduced and before anything in
  // the state changes (a background checkpoint's copies are waited for there).
  // batch: the program's (Runtime::train_step(batch)), null for the adapter's.
  StepResult train(const OptimizerStep& update, const std::function<void()>& before_update,
                   const Batch* batch = nullptr);
  double evaluate(int batches);
  double evaluate(const Batch& batch);
  // decode: Runtime::decode's positions (each module call carries them), or null.
  Batch forward(const Batch& inputs, const std::vector<std::string>& outputs,
                const DecodePositions* decode = nullptr);
  // The dtypes and ranks program batches must have (from the example given
  // to create, else the first batch).
  void expect_inputs(std::vector<InputSpec> spec) { spec_ = std::move(spec); }
  // The graph's validation metrics over the last evaluate().
  const std::vector<std::pair<std::string, double>>& last_metrics() const { return last_metrics_; }

 private:
  const JobConfig& job_;
  ParallelContext& context_;
  const ModelPlan& model_;
  TrainState& state_;
  std::unique_ptr<ActivationOffload> offload_;  // memory.offload: checkpointed inputs in host memory
  // The program's batch checked against the graph and cut into microbatches.
  ProgramBatch program_batch(const Batch& batch, const std::string& call, int64_t rows, bool allow_missing);
  Batch share_of(const Batch& batch) const;
  std::unique_ptr<Executor> executor_;
  AdapterData adapter_data_;
  const DataSource* source_ = &adapter_data_;  // what the executor reads this run
  std::vector<InputSpec> spec_;
  std::vector<std::pair<std::string, double>> last_metrics_;
  std::unique_ptr<PhaseClock> clock_;  // the step's phases, on the host's clock and the device's
};

}  // namespace smp
