// The global gradient norm's local part: the sum of the squares of this rank's
// counted gradients, in double. Per parameter, never per bucket (buckets differ
// between layouts whose norms must agree), summed in the parameters' order.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace smp {

enum class NormKernels {
  // CPU fp32 contiguous gradients: sum_of_squares (one pass in double, the same
  // whatever the thread count); the other CPU gradients PerTensor; CUDA
  // gradients MultiTensor.
  Auto,
  // One norm kernel per gradient, in fp32 whatever its dtype (a 16-bit norm
  // of a loss-scaled fp16 gradient overflows at 65504 long before any element does).
  PerTensor,
  // One _foreach_norm per group of gradients of one device and dtype (in fp32
  // where the LibTorch takes a dtype, 2.3 and later; before that fp32 and
  // fp64 gradients only, the others PerTensor): per gradient the same norm as
  // PerTensor's on the CPU (measured bitwise on 1.13 and 2.11).
  MultiTensor,
};

// sum over k with counted[k] and grads[k] defined of |grads[k]|², in double.
// The norms not taken in double go to double together (one stack, one sum,
// one wait), in the parameters' order whatever the grouping.
double squared_norm(const std::vector<at::Tensor>& grads, const std::vector<bool>& counted,
                    NormKernels kernels = NormKernels::Auto);

}  // namespace smp
