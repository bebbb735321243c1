// SyncBatchNorm for a program's own modules: BatchNorm whose batch statistics
// are those of the whole batch across the data-parallel replicas, as
// PyTorch's torch.nn.SyncBatchNorm (the statistics all-reduced over dp, and
// their gradients too). Under dp it normalises every replica's samples by
// the global batch's mean and variance, so a run at dp N equals the serial
// run with torch::nn::BatchNorm over the whole batch; at dp 1, or outside
// smp, it is torch::nn::BatchNorm exactly (the same ATen call).
//
//   struct Block : torch::nn::Module {
//     smp::sdk::SyncBatchNorm bn{register_module("bn", smp::sdk::SyncBatchNorm(64))};
//     ...
//   };
//
// Input [N, C, ...]: statistics per channel C over every other dimension.
// Each microbatch's forward all-reduces twice over dp (the sum and count,
// then the squared deviations), in the same order on every replica.
// parallel.dp only: a job's other batch axes (cp) are not summed over.
#pragma once

#include <smp/sdk/collectives.hpp>
#include <smp/sdk/module.hpp>
#include <smp/sdk/torch_parallel.hpp>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <string>
#include <utility>
#include <vector>

namespace smp::sdk {

class SyncBatchNormImpl : public torch::nn::Module, public PlacedModule {
 public:
  explicit SyncBatchNormImpl(int64_t features, double eps = 1e-5, double momentum = 0.1, bool affine = true)
      : eps_(eps), momentum_(momentum) {
    if (affine) {
      weight = register_parameter("weight", at::ones({features}));
      bias = register_parameter("bias", at::zeros({features}));
    }
    running_mean = register_buffer("running_mean", at::zeros({features}));
    running_var = register_buffer("running_var", at::ones({features}));
    num_batches_tracked = register_buffer("num_batches_tracked", at::zeros({}, at::kLong));
  }

  at::Tensor forward(const at::Tensor& x) {
    if (!is_training() || dp_size_ == 1) {
      if (is_training()) num_batches_tracked.add_(1);  // as torch::nn::BatchNorm's forward does
      return at::batch_norm(x, weight, bias, running_mean, running_var, is_training(), momentum_, eps_, false);
    }
    std::vector<int64_t> dims{0}, shape(static_cast<size_t>(x.dim()), 1);
    for (int64_t d = 2; d < x.dim(); ++d) dims.push_back(d);
    shape[1] = x.size(1);
    const double local = static_cast<double>(x.numel() / x.size(1));
    // The global count and mean, then the global variance from the deviations
    // (two passes: steadier than E[x^2] - E[x]^2). Differentiable all-reduces:
    // every replica's loss depends on every replica's samples.
    at::Tensor sum = all_reduce(x.sum(dims));
    at::Tensor count = at::full({1}, local, x.options().dtype(at::kDouble));
    dp_.allreduce(count);
    const double n = count.item<double>();
    at::Tensor mean = sum / n;
    at::Tensor centred = x - mean.view(shape);
    at::Tensor var = all_reduce((centred * centred).sum(dims)) / n;
    at::Tensor y = centred * at::rsqrt(var + eps_).view(shape);
    if (weight.defined()) y = y * weight.view(shape) + bias.view(shape);
    {
      c10::NoGradGuard no_grad;
      running_mean.mul_(1 - momentum_).add_(mean.detach(), momentum_);
      running_var.mul_(1 - momentum_).add_(var.detach() * (n / std::max(n - 1, 1.0)), momentum_);
      num_batches_tracked.add_(1);
    }
    return y;
  }

  // A one-rank context (the partition's cost profile) leaves an earlier binding as it is.
  void bind(const ModuleContext& ctx) override {
    if (ctx.axis_size("dp") == 1) return;
    dp_size_ = ctx.axis_size("dp");
    dp_ = ctx.comm("dp");
  }
  // Nothing split: its parameters are replicated, their gradients summed over dp as any.
  std::vector<std::pair<std::string, Param>> placements() const override { return {}; }

  at::Tensor weight, bias, running_mean, running_var, num_batches_tracked;

 private:
  // All-reduce forward and backward (PyTorch's SyncBatchNorm reduces the
  // gradients of the statistics too): Megatron's f then g.
  at::Tensor all_reduce(const at::Tensor& t) const { return reduce_from_region(copy_to_region(t, dp_), dp_); }

  double eps_, momentum_;
  int dp_size_ = 1;
  Comm dp_;
};
TORCH_MODULE(SyncBatchNorm);

}  // namespace smp::sdk
