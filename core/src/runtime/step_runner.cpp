#include "runtime/step_runner.h"

#include <smp/mesh.h>

#include "base/device.h"
#include "base/op_profile.h"
#include "base/trace.h"
#include "comm/process_groups.h"
#include "memory/activation_offload.h"
#include "memory/gradient_sync.h"
#include "optim/mixed_precision.h"
#include "pipeline/executor.h"
#include "runtime/model_builder.h"
#include "runtime/optimizer_step.h"
#include "runtime/parallel_context.h"
#include "runtime/train_state.h"

#include <c10/core/GradMode.h>

#include <algorithm>
#include <chrono>

namespace smp {

namespace {

// The graph's metrics from their summed (sum, count) pairs: sum / count, 0 without counts.
std::vector<std::pair<std::string, double>> metric_values(const std::vector<ModelGraph::Metric>& metrics,
                                                          const std::vector<double>& sums) {
  std::vector<std::pair<std::string, double>> out;
  for (size_t k = 0; k < metrics.size(); ++k)
    out.emplace_back(metrics[k].name, sums[2 * k + 1] > 0 ? sums[2 * k] / sums[2 * k + 1] : 0.0);
  return out;
}

}  // namespace

StepRunner::StepRunner(const JobConfig& job, ParallelContext& context, const ModelBuilder& model, TrainState& state)
    : job_(job), context_(context), model_(model), state_(state) {
  ExecutorSetup setup;
  setup.graph = &model.graph();
  setup.plan = &model.stage_plan();
  setup.pp_rank = context.mesh().coord(Axis::PP);
  setup.pp_comm = context.mesh().pp() > 1 ? &context.comm(Axis::PP) : nullptr;
  setup.modules = &state.modules();
  setup.seed = job.train.seed;
  setup.loss = &model.loss();
  setup.device = context.device();
  setup.compute_dtype = compute_dtype(job.train.precision);
  setup.gather = job.memory.zero == 3 ? state.sharded() : nullptr;
  setup.checkpoint = model.checkpointed();
  if (job.memory.offload) {
    offload_ = std::make_unique<ActivationOffload>(context.device(), job.memory.offload_horizon);
    setup.offload = offload_.get();
  }
  const ModelBuilder* m = &model;
  setup.batch = [m](int64_t step, int mb, bool training) {
    return m->batch(training ? SMP_SPLIT_TRAIN : SMP_SPLIT_VALIDATION, step, mb);
  };
  executor_ = std::make_unique<Executor>(setup);
  context.groups().reset_stats();
}

StepRunner::~StepRunner() = default;

StepResult StepRunner::train(const OptimizerStep& update, const std::function<void()>& before_update) {
  using clock = std::chrono::steady_clock;
  auto since = [](clock::time_point t) { return std::chrono::duration<double>(clock::now() - t).count(); };
  const auto t0 = clock::now();
  const c10::Device& device = context_.device();
  StepResult out;
  out.loss_scale = state_.scaler() ? state_.scaler()->scale() : 1.0;
  model_.loss().set_loss_scale(out.loss_scale);
  const int64_t held_before = reset_device_peak(device);  // CUDA: the step's peak is counted above it
  trace::set_step(state_.steps());
  trace::Scope step_scope("step", "step " + std::to_string(state_.steps() + 1));
  op_profile::StepScope ops(state_.steps());
  state_.sync().begin_step();
  ExecutorResult r = [&] {
    trace::Scope phase("phase", "pipeline");
    return executor_->run(model_.schedule(), state_.steps(), true);
  }();
  out.phases.compute = since(t0);
  const auto t1 = clock::now();
  {
    trace::Scope phase("phase", "grad_sync");
    state_.sync().finish_step();
  }
  out.phases.grad_sync = since(t1);
  before_update();
  // The graph's metrics, counted once per group of model-axis replicas.
  const auto& metrics = model_.graph().metrics;
  std::vector<double> metric_sums(2 * metrics.size(), 0.0);
  if (context_.mesh().at_model_origin())
    for (size_t k = 0; k < metrics.size(); ++k)
      metric_sums[2 * k] = r.metrics[k].first, metric_sums[2 * k + 1] = r.metrics[k].second;
  const OptimizerStepResult u =
      update.run(state_, r.loss, out.loss_scale, context_.mesh(), context_.comm(Axis::World), device, &metric_sums);
  out.metrics = metric_values(metrics, metric_sums);
  out.phases.clip = u.clip_seconds;
  out.phases.optimizer = u.optimizer_seconds;
  out.step = state_.steps();
  state_.step_done();
  out.skipped = u.skipped;
  out.loss = LossNormalizer::mean(u.loss);
  out.grad_norm = u.grad_norm;
  out.grad_scale = u.grad_scale;
  out.lr = u.lr;
  out.peak_activation_bytes = device.is_cuda() ? device_peak_bytes(device) - held_before : r.peak_bytes;
  out.memory = state_.memory_account(out.peak_activation_bytes);
  out.memory.offloaded = r.offloaded_peak_bytes;
  out.memory.activations = r.activation_peak_bytes;
  out.memory.largest_slot = r.largest_slot_bytes;
  out.memory.send_buffers = r.send_buffer_peak_bytes;
  out.seconds = since(t0);
  return out;
}

double StepRunner::evaluate(int batches) {
  c10::NoGradGuard ng;
  LossSums local;
  const auto& metrics = model_.graph().metrics;
  std::vector<double> sums(2 * metrics.size(), 0.0);  // sum, count per metric; in the loss's all-reduce
  for (int b = 0; b < batches; ++b) {
    ExecutorResult r = executor_->run(model_.eval_schedule(), b, false);
    local += r.loss;
    for (size_t k = 0; k < metrics.size(); ++k) {
      sums[2 * k] += r.metrics[k].first;
      sums[2 * k + 1] += r.metrics[k].second;
    }
  }
  const DeviceMesh& mesh = context_.mesh();
  if (!mesh.at_model_origin()) std::fill(sums.begin(), sums.end(), 0.0);  // once per model-axis group
  const double mean = LossNormalizer::mean(sum_over_world(local, sums, mesh, context_.comm(Axis::World)));
  last_metrics_ = metric_values(metrics, sums);
  return mean;
}

}  // namespace smp
