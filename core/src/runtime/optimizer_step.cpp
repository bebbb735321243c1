#include "runtime/optimizer_step.h"

#include "base/device.h"
#include "base/test_faults.h"
#include "base/trace.h"
#include "comm/communicator.h"
#include "memory/sharded_parameters.h"
#include "optim/mixed_precision.h"
#include "plugin/optimizer_instance.h"
#include "runtime/train_state.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>

#include <smp/error.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

namespace smp {

LossSums sum_over_world(const LossSums& local, std::vector<double>& extra, const DeviceMesh& mesh, Communicator& world) {
  const bool counted = mesh.at_model_origin();  // once per group of model-axis replicas
  std::vector<double> v = {counted ? local.loss : 0.0, counted ? local.items : 0.0};
  v.insert(v.end(), extra.begin(), extra.end());
  at::Tensor t = at::tensor(v, at::kDouble);
  world.allreduce(t)->wait();
  for (size_t i = 0; i < extra.size(); ++i) extra[i] = t[2 + i].item<double>();
  return {t[0].item<double>(), t[1].item<double>()};
}

namespace {

bool is_cpu_float(const at::Tensor& t) {
  return t.device().is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous() && !t.is_sparse();
}

// The sum of a CPU float tensor's squares in double. Chunks of a fixed size
// are summed on the intra-op threads, each over four lanes, and the chunk
// sums in order: the result is the same whatever the thread count, on every
// rank and layout holding the same elements.
double sum_of_squares(const at::Tensor& t) {
  constexpr int64_t kChunk = 1 << 15;
  const float* x = t.data_ptr<float>();
  const int64_t n = t.numel(), chunks = (n + kChunk - 1) / kChunk;
  auto chunk_sum = [x, n](int64_t c) {
    const int64_t end = std::min(n, (c + 1) * kChunk);
    double a[4] = {0.0, 0.0, 0.0, 0.0};
    int64_t i = c * kChunk;
    for (; i + 4 <= end; i += 4)
      for (int j = 0; j < 4; ++j) a[j] += static_cast<double>(x[i + j]) * x[i + j];
    for (; i < end; ++i) a[0] += static_cast<double>(x[i]) * x[i];
    return (a[0] + a[1]) + (a[2] + a[3]);
  };
  if (chunks <= 1) return n == 0 ? 0.0 : chunk_sum(0);
  std::vector<double> sums(static_cast<size_t>(chunks));
  at::parallel_for(0, chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) sums[static_cast<size_t>(c)] = chunk_sum(c);
  });
  double total = 0.0;
  for (double v : sums) total += v;
  return total;
}

}  // namespace

OptimizerStep::OptimizerStep(const TrainConfig& t) : clip_(t.grad_clip) {
  fault_dp_mean_ = test_fault(TestFault::DpMeanGradients);
  lr_.lr = t.lr;
  lr_.min_lr = t.min_lr;
  lr_.warmup = t.warmup_steps;
  lr_.total = t.steps;
}

OptimizerStepResult OptimizerStep::run(TrainState& state, const LossSums& local, double loss_scale,
                                       const DeviceMesh& mesh, Communicator& world, const c10::Device& device,
                                       std::vector<double>* metric_sums) const {
  using clock = std::chrono::steady_clock;
  auto since = [](clock::time_point t) { return std::chrono::duration<double>(clock::now() - t).count(); };
  OptimizerStepResult out;
  auto t0 = clock::now();
  const int64_t clip_start = trace::now_us();
  // Global gradient norm over distinct values. Under ZeRO the gradients are
  // this rank's shard segments, which the optimizer's tensors match.
  const std::vector<at::Tensor> grads = state.gradients();
  const std::vector<bool>& counted = state.norm_counted();
  std::vector<double> norm_sq{0.0};
  {
    c10::NoGradGuard ng;
    // Each parameter's squared norm on its own, summed in a fixed order:
    // per parameter, not per bucket, since buckets differ between layouts
    // whose norms must agree. On the CPU a float gradient's sum of squares
    // is one pass in double (no kernel per parameter, no copies); otherwise
    // one norm kernel per parameter, in fp32 whatever the gradient's dtype
    // (a 16-bit norm of a loss-scaled fp16 gradient overflows at 65504 long
    // before any element does), gone to double together.
    std::vector<at::Tensor> norms;
    for (size_t k = 0; k < grads.size(); ++k) {
      if (!counted[k] || !grads[k].defined()) continue;
      if (is_cpu_float(grads[k])) norm_sq[0] += sum_of_squares(grads[k]);
      else norms.push_back(grads[k].norm(2, at::kFloat));
    }
    if (!norms.empty()) norm_sq[0] += at::stack(norms).to(at::kDouble).pow(2).sum().item<double>();
  }
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
  out.clip_seconds = since(t0);
  trace::complete("phase", "clip", clip_start, trace::now_us());
  t0 = clock::now();
  {
    trace::Scope phase("phase", "optimizer");
    out.skipped = state.scaler() && !state.scaler()->update(std::isfinite(norm_sq[0]));
    if (!out.skipped) {
      state.optimizer().step(out.lr, grad_scale, grads, state.updates() + 1);
      state.count_update();
      if (state.masters()) state.masters()->copy_to_params();
    }
    if (state.sharded()) state.sharded()->after_step();
    synchronize(device);
  }
  out.optimizer_seconds = since(t0);
  return out;
}

}  // namespace smp
