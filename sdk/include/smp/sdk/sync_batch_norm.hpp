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
// The statistics of bf16 / fp16 inputs are computed in fp32 (the output in
// the input's dtype), as PyTorch's SyncBatchNorm does.
//
// convert_sync_batchnorm(*net), like PyTorch's
// torch.nn.SyncBatchNorm.convert_sync_batchnorm, makes every
// torch::nn::BatchNorm{1,2,3}d in a program's module tree synchronise its
// statistics over dp without changing the model's source: the modules stay
// the program's (a Sequential's children are AnyModule copies, so swapping
// them is not reliable); while smp runs their node at dp > 1, the
// dispatcher's mode key (mode_key.hpp, shared with the tensor-parallel plan)
// hands their aten::batch_norm calls to the function above.
#pragma once

#include <smp/sdk/collectives.hpp>
#include <smp/sdk/mode_key.hpp>
#include <smp/sdk/module.hpp>
#include <smp/sdk/torch_parallel.hpp>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/pimpl.h>

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace smp::sdk {

// Batch normalisation in training over the whole batch across `dp` (the
// statistics all-reduced forward and backward), updating the running
// statistics when given. Statistics in fp32 for a 16-bit input.
inline at::Tensor sync_batch_norm(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias,
                                  const at::Tensor& running_mean, const at::Tensor& running_var, double momentum,
                                  double eps, const Comm& dp) {
  const bool low = input.scalar_type() == at::kBFloat16 || input.scalar_type() == at::kHalf;
  const at::Tensor x = low ? input.to(at::kFloat) : input;
  // All-reduce forward and backward (PyTorch's SyncBatchNorm reduces the
  // gradients of the statistics too): Megatron's f then g.
  auto all_reduce = [&](const at::Tensor& t) { return reduce_from_region(copy_to_region(t, dp), dp); };
  std::vector<int64_t> dims{0}, shape(static_cast<size_t>(x.dim()), 1);
  for (int64_t d = 2; d < x.dim(); ++d) dims.push_back(d);
  shape[1] = x.size(1);
  const double local = static_cast<double>(x.numel() / x.size(1));
  // The global count and mean, then the global variance from the deviations
  // (two passes: steadier than E[x^2] - E[x]^2). Differentiable all-reduces:
  // every replica's loss depends on every replica's samples.
  at::Tensor sum = all_reduce(x.sum(dims));
  at::Tensor count = at::full({1}, local, x.options().dtype(at::kDouble));
  dp.allreduce(count);
  const double n = count.item<double>();
  at::Tensor mean = sum / n;
  at::Tensor centred = x - mean.view(shape);
  at::Tensor var = all_reduce((centred * centred).sum(dims)) / n;
  at::Tensor y = centred * at::rsqrt(var + eps).view(shape);
  if (weight.defined()) y = y * weight.to(y.scalar_type()).view(shape);
  if (bias.defined()) y = y + bias.to(y.scalar_type()).view(shape);
  {
    c10::NoGradGuard no_grad;
    if (running_mean.defined())
      running_mean.mul_(1 - momentum).add_(mean.detach().to(running_mean.scalar_type()), momentum);
    if (running_var.defined())
      running_var.mul_(1 - momentum)
          .add_((var.detach() * (n / std::max(n - 1, 1.0))).to(running_var.scalar_type()), momentum);
  }
  return low ? y.to(input.scalar_type()) : y;
}

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
    num_batches_tracked.add_(1);
    return sync_batch_norm(x, weight, bias, running_mean, running_var, momentum_, eps_, dp_);
  }

  // The partition's cost profile (a one-rank context, no mesh) leaves an
  // earlier binding as it is; a runtime at dp 1 drops it (a communicator of
  // a runtime gone must not be used).
  void bind(const ModuleContext& ctx) override {
    if (!ctx.mesh) return;
    dp_size_ = ctx.axis_size("dp");
    dp_ = dp_size_ > 1 ? ctx.comm("dp") : Comm();
  }
  // Nothing split: its parameters are replicated, their gradients summed over dp as any.
  std::vector<std::pair<std::string, Param>> placements() const override { return {}; }

  at::Tensor weight, bias, running_mean, running_var, num_batches_tracked;

 private:
  double eps_, momentum_;
  int dp_size_ = 1;
  Comm dp_;
};
TORCH_MODULE(SyncBatchNorm);

namespace sync_norm_detail {

using mode_key_detail::kModeKey;
using mode_key_detail::Normal;

// A converted BatchNorm once its node is bound at dp > 1.
struct Bound {
  Comm dp;
  int dp_size = 1;
};

struct Registry {
  std::mutex mutex;
  // Marked by convert_sync_batchnorm(), held weakly (as the plan's registry).
  std::map<const torch::nn::Module*, std::weak_ptr<torch::nn::Module>> modules;
  // Bound: each module's running_mean (or, without running statistics, its
  // weight), the tensor its batch_norm call is known by.
  mode_key_detail::ByTensor<Bound> tensors;
  bool marked(const torch::nn::Module* m) {
    auto it = modules.find(m);
    if (it == modules.end()) return false;
    if (it->second.expired()) {
      modules.erase(it);
      return false;
    }
    return true;
  }
};
// One per process across plugins (as tp_plan.hpp's registry).
inline namespace registry_v1 {
__attribute__((visibility("default"))) inline Registry& registry() {
  static Registry r;
  return r;
}
}  // namespace registry_v1

inline bool is_batch_norm(const torch::nn::Module* m) {
  return dynamic_cast<const torch::nn::BatchNorm1dImpl*>(m) || dynamic_cast<const torch::nn::BatchNorm2dImpl*>(m) ||
         dynamic_cast<const torch::nn::BatchNorm3dImpl*>(m);
}
// The tensor a converted module's batch_norm call is known by.
inline at::Tensor key_of(torch::nn::Module& m) {
  auto buffers = m.named_buffers(/*recurse=*/false);
  if (const at::Tensor* t = buffers.find("running_mean"); t && t->defined()) return *t;
  auto params = m.named_parameters(/*recurse=*/false);
  if (const at::Tensor* t = params.find("weight"); t && t->defined()) return *t;
  return at::Tensor();
}

inline at::Tensor batch_norm_op(const at::Tensor& input, const c10::optional<at::Tensor>& weight,
                                const c10::optional<at::Tensor>& bias, const c10::optional<at::Tensor>& running_mean,
                                const c10::optional<at::Tensor>& running_var, bool training, double momentum,
                                double eps, bool cudnn_enabled) {
  Normal n;
  auto get = [](const c10::optional<at::Tensor>& t) { return t ? *t : at::Tensor(); };
  const at::Tensor key = running_mean && running_mean->defined() ? *running_mean : get(weight);
  std::optional<Bound> bound;
  if (key.defined()) {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    if (const Bound* b = r.tensors.find(key)) bound = *b;
  }
  // Only converted BatchNorms are acted on: another one in the node (a
  // tp-planned node's, say) runs as LibTorch runs it, at every tp.
  if (!bound) return at::batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps, cudnn_enabled);
  if (training && bound->dp_size > 1)
    return sync_batch_norm(input, get(weight), get(bias), get(running_mean), get(running_var), momentum, eps, bound->dp);
  if (input.scalar_type() != at::kBFloat16 && input.scalar_type() != at::kHalf)
    return at::batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps, cudnn_enabled);
  // A 16-bit input (bf16 / fp16 runs, fp32 statistics buffers): computed in fp32, returned in its dtype.
  auto f32 = [&](const c10::optional<at::Tensor>& t) {
    return t && t->defined() ? c10::optional<at::Tensor>(t->to(at::kFloat)) : c10::optional<at::Tensor>();
  };
  const bool float_stats = !running_mean || !running_mean->defined() || running_mean->scalar_type() == at::kFloat;
  if (!float_stats)
    return at::batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps, cudnn_enabled);
  return at::batch_norm(input.to(at::kFloat), f32(weight), f32(bias), running_mean, running_var, training, momentum, eps,
                        cudnn_enabled)
      .to(input.scalar_type());
}

inline void register_kernels() {
  static std::once_flag once;
  std::call_once(once, [] {
    mode_key_detail::ensure_fallthrough();
    if (mode_key_detail::has_kernel("batch_norm")) return;  // another shared object's, over the same registry
    static torch::Library aten(torch::Library::IMPL, "aten", kModeKey, __FILE__, __LINE__);
    aten.impl("batch_norm", TORCH_FN(batch_norm_op));
  });
}

}  // namespace sync_norm_detail

// Marks every torch::nn::BatchNorm{1,2,3}d inside `root` (not root itself)
// to synchronise its batch statistics over dp when smp runs its node, as
// torch.nn.SyncBatchNorm.convert_sync_batchnorm does; the program's modules
// and their source stay as they are. Call it before the runtime is made.
// Returns how many it marked; a BatchNorm with neither running statistics
// nor affine parameters is refused by name (smp knows a call by one of them).
inline int convert_sync_batchnorm(torch::nn::Module& root) {
  using namespace sync_norm_detail;
  int n = 0;
  for (const auto& item : root.named_modules("", /*include_self=*/false)) {
    if (!is_batch_norm(item.value().get())) continue;
    if (!key_of(*item.value()).defined())
      throw Error("convert_sync_batchnorm: '" + item.key() + "' has neither running statistics nor affine "
                  "parameters, by which smp would know its batch_norm call");
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    r.modules.insert_or_assign(item.value().get(), std::weak_ptr<torch::nn::Module>(item.value()));
    ++n;
  }
  return n;
}

// The converted BatchNorm modules inside `root` (a node's module), bound to
// ctx's dp group at dp > 1: whether the node holds some (smp acts on their
// batch_norm calls: synchronised at dp > 1 in training, in fp32 for a 16-bit
// input). The partition's cost profile (a one-rank context, no mesh) leaves
// an earlier binding as it is; a runtime at dp 1 binds it without a
// communicator (one of a runtime gone must not be used).
inline bool bind_converted_batch_norms(torch::nn::Module& root, const ModuleContext& ctx) {
  using namespace sync_norm_detail;
  const int dp = ctx.axis_size("dp");
  bool any = false;
  Registry& r = registry();
  for (const auto& m : root.modules(/*include_self=*/true)) {
    std::lock_guard<std::mutex> lock(r.mutex);
    if (!r.marked(m.get())) continue;
    any = true;
    if (!ctx.mesh) continue;
    r.tensors.put(key_of(*m), Bound{dp > 1 ? ctx.comm("dp") : Comm(), dp});
  }
  if (any) register_kernels();
  return any;
}

}  // namespace smp::sdk
