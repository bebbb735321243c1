// How the standard optimizers run their update (the [optimizer] key `kernels`):
//   "auto"        CPU tensors per tensor (the fp32 loop, else ATen ops, as
//                 before); CUDA tensors through LibTorch's fused kernel where
//                 it has one (AdamW: 2.0, SGD with momentum: 2.3), else its
//                 multi-tensor `_foreach_*` kernels.
//   "per_tensor"  every tensor on its own (the CPU's kernels everywhere).
//   "foreach"     the `_foreach_*` kernels (LibTorch 1.13 has them, on the
//                 CPU too): the per-tensor ATen formula, a kernel per op
//                 over a whole group of tensors.
//   "fused"       `_fused_adamw_` / `_fused_sgd_`: one pass over parameter,
//                 gradient and state (CUDA from 2.0 / 2.3, the CPU from 2.4).
// Multi-tensor groups are tensors of one device, dtype and decay flag, cut
// into chunks of at most kChunkBytes of parameters: the gradients scaled by
// grad_scale (the fused kernels would otherwise unscale .grad in place, which
// the ABI forbids: grads are read only) and the foreach path's denominators
// are scratch of one chunk's size, not of the model's.
#pragma once

#include <ATen/ATen.h>
#include <torch/version.h>

#include <map>
#include <string>
#include <tuple>
#include <vector>

#define SMP_OPTIM_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

// LibTorch's fused optimizer kernels: AdamW on CUDA from 2.1 (2.0 may have
// had only _fused_adam_; not checked, so 2.0 takes the foreach path), SGD on
// CUDA from 2.3 (its _fused_sgd_), both on the CPU from 2.4.
#define SMP_OPTIM_HAS_FUSED_ADAMW SMP_OPTIM_TORCH_AT_LEAST(2, 1)
#define SMP_OPTIM_HAS_FUSED_SGD SMP_OPTIM_TORCH_AT_LEAST(2, 3)
#define SMP_OPTIM_HAS_FUSED_CPU SMP_OPTIM_TORCH_AT_LEAST(2, 4)

namespace smp_optim {

enum class Kernels { Auto, PerTensor, Foreach, Fused };

// The `kernels` key's value (default "auto"); errors name the key and the values.
Kernels kernels_of(const std::string& value);
const char* to_string(Kernels k);

// What one tensor on `device` runs through under `asked` (Auto resolved):
// has_fused = whether this LibTorch has the optimizer's fused kernel (on CUDA).
Kernels kernels_for(Kernels asked, const at::Device& device, bool has_fused);

// Refuses "fused" where this LibTorch has no fused kernel for a parameter's
// device (the CPU's from 2.4); optimizer and cuda_since (the version with
// its CUDA kernel) for the message.
void check_fused_available(Kernels asked, const std::vector<at::Tensor>& params, bool has_fused_cuda,
                           const char* optimizer, const char* cuda_since);

// Parameter bytes per chunk of a multi-tensor group (64 MiB): the scratch the
// scaled gradients and AdamW's foreach denominators take at most.
constexpr int64_t kChunkBytes = int64_t{64} << 20;

// Tensor indices grouped for multi-tensor kernels: one device, one dtype, one
// decay flag per group, each group cut into chunks of at most kChunkBytes (in
// the order of the indices given).
struct Group {
  Kernels kernels;
  bool decay;
  std::vector<size_t> index;
};
std::vector<Group> multi_tensor_groups(const std::vector<std::pair<size_t, Kernels>>& members,
                                       const std::vector<at::Tensor>& params, const std::vector<bool>& decay);

// grads[i] for each i in `index`, in the parameters' dtype, times scale: the
// tensors themselves when nothing changes (scale 1, same dtype), else new
// ones (one multi-tensor multiply for those already of the dtype).
std::vector<at::Tensor> scaled_gradients(const std::vector<at::Tensor>& grads, const std::vector<size_t>& index,
                                         at::ScalarType dtype, double scale);

// The tensors of `all` at `index`.
std::vector<at::Tensor> pick(const std::vector<at::Tensor>& all, const std::vector<size_t>& index);

}  // namespace smp_optim
