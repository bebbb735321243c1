#include "runtime/optimizer_step.h"

#include "base/device.h"
#include "base/phase_clock.h"
#include "base/test_faults.h"
#include "comm/communicator.h"
#include "memory/sharded_parameters.h"
#include "optim/grad_norm.h"
#include "optim/mixed_precision.h"
#include "plugin/optimizer_instance.h"
#include "runtime/train_state.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <smp/error.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

namespace smp {

namespace {

// The minor_gradient_error fault (tests only): among this rank's gradients the
// one whose norm is nearest 1% of the largest, times `factor`. Replicas hold
// the same gradients after their sum, so they choose and scale alike.
void scale_minor_gradient(const std::vector<at::Tensor>& grads, double factor) {
  std::vector<double> norms;
  for (const at::Tensor& g : grads) norms.push_back(g.defined() ? g.norm().item<double>() : 0.0);
  if (norms.empty()) return;
  const double target = 0.01 * *std::max_element(norms.begin(), norms.end());
  size_t pick = 0;
  for (size_t i = 1; i < norms.size(); ++i)
    if (std::abs(std::log(norms[i] / target)) < std::abs(std::log(norms[pick] / target))) pick = i;
  if (norms[pick] > 0) grads[pick].mul_(factor);
}

}  // namespace

LossSums sum_over_world(const LossSums& local, std::vector<double>& extra, const DeviceMesh& mesh, Communicator& world) {
  const bool counted = mesh.at_model_origin();  // once per group of model-axis replicas
  std::vector<double> v = {counted ? local.loss : 0.0, counted ? local.items : 0.0};
  v.insert(v.end(), extra.begin(), extra.end());
  at::Tensor t = at::tensor(v, at::kDouble);
  world.allreduce(t)->wait();
  for (size_t i = 0; i < extra.size(); ++i) extra[i] = t[2 + i].item<double>();
  return {t[0].item<double>(), t[1].item<double>()};
}

OptimizerStep::OptimizerStep(const TrainConfig& t) : clip_(t.grad_clip) {
  fault_dp_mean_ = test_fault(TestFault::DpMeanGradients);
  fault_small_ = test_fault(TestFault::SmallGradientError);
  fault_minor_ = test_fault(TestFault::MinorGradientError);
  lr_.lr = t.lr;
  lr_.min_lr = t.min_lr;
  lr_.warmup = t.warmup_steps;
  lr_.total = t.steps;
}

OptimizerStepResult OptimizerStep::run(TrainState& state, const LossSums& local, double loss_scale,
                                       const DeviceMesh& mesh, Communicator& world, const c10::Device& device,
                                       std::vector<double>* metric_sums, PhaseClock* clock) const {
  std::unique_ptr<PhaseClock> own;
  if (!clock) {
    own = std::make_unique<PhaseClock>(device);
    clock = own.get();
    clock->start();
  }
  OptimizerStepResult out;
  // Global gradient norm over distinct values. Under ZeRO the gradients are
  // this rank's shard segments, which the optimizer's tensors match.
  const std::vector<at::Tensor> grads = state.gradients();
  const std::vector<bool>& counted = state.norm_counted();
  // Each parameter's squared norm on its own, summed in a fixed order (on the
  // CPU a float gradient's in one pass in double; on a GPU one multi-tensor
  // norm per dtype, gone to double together).
  std::vector<double> norm_sq{squared_norm(grads, counted)};
  // One all-reduce over the world: the squared norm, the loss sums and the metrics.
  if (metric_sums) norm_sq.insert(norm_sq.end(), metric_sums->begin(), metric_sums->end());
  out.loss = sum_over_world(local, norm_sq, mesh, world);
  if (metric_sums) std::copy(norm_sq.begin() + 1, norm_sq.end(), metric_sums->begin());
  // .grad holds the gradient of the summed loss: the mean's gradient is
  // grad_scale times that. Clipping joins the same factor, which the optimizer
  // applies as it reads .grad. Under fp16 the loss scale joins it too; the
  // norm² is the same on every rank, so an overflow (inf / nan) skips the step
  // everywhere alike.
  double grad_scale = LossNormalizer::grad_scale(out.loss) / loss_scale;
  if (fault_dp_mean_) grad_scale /= mesh.dp();
  out.grad_norm = std::sqrt(norm_sq[0]) * grad_scale;
  if (clip_ > 0 && out.grad_norm > clip_) grad_scale *= clip_ / (out.grad_norm + 1e-6);
  out.grad_scale = grad_scale;
  out.lr = lr_override_ >= 0 ? lr_override_ : lr_.at(state.steps());
  out.clip_seconds = clock->end("clip");
  {
    out.skipped = state.scaler() && !state.scaler()->update(std::isfinite(norm_sq[0]));
    if (!out.skipped) {
      // SMP_TEST_FAULT=small_gradient_error: this rank's first gradient 1e-3
      // too large, after the norm (which stays right): only the parameters show it.
      if (fault_small_ && !grads.empty()) grads[0].mul_(1.0 + 1e-3);
      // SMP_TEST_FAULT=minor_gradient_error: the gradient whose norm is nearest
      // 1% of the largest, 20% too large (a parameter that moves little).
      if (fault_minor_) scale_minor_gradient(grads, 1.2);
      state.optimizer().step(out.lr, grad_scale, grads, state.updates() + 1);
      state.count_update();
      if (state.masters()) state.masters()->copy_to_params();
    }
    if (state.sharded()) state.sharded()->after_step();
    synchronize(device);
  }
  out.optimizer_seconds = clock->end("optimizer");
  if (own) own->finish();
  return out;
}

}  // namespace smp
