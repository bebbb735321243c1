// GELU's tanh form on contiguous float arrays, one pass each way (the
// smp_nn_kernels library; see gelu_kernels.cpp for the arithmetic).
#pragma once

#include <cstdint>

namespace smp_nn::kernels {

// y[i] = gelu_tanh(x[i]) = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3).
void gelu_tanh_forward(const float* x, float* y, int64_t n);
// dx[i] = g[i] * gelu_tanh'(x[i]).
void gelu_tanh_backward(const float* g, const float* x, float* dx, int64_t n);

}  // namespace smp_nn::kernels
