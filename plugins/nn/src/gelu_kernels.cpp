#include <smp_nn/gelu_kernels.hpp>

#include <cstring>

// GELU's tanh form without a tanh: 0.5 (1 + tanh(u)) = sigmoid(2u), so
// gelu(x) = x s with s = 1 / (1 + exp(-v)), v = 2u, and
// gelu'(x) = s + x s (1 - s) v', v' = 2 sqrt(2/pi) (1 + 3 * 0.044715 x^2).
// The exp below is a plain loop GCC vectorizes (one rounding trick, one
// polynomial, an exponent add), where LibTorch's at::gelu calls a vectorized
// tanh of 1-ulp accuracy that costs several exps. Its error is a few ulp of s;
// it differs from at::gelu(x, "tanh") by a few float roundings, and for
// x < -9 it is nearer the exact value than 1 + tanh(u) (which rounds to 0).
// Built for x86-64-v3 (AVX2, FMA) and the baseline ISA; the loader picks the
// clone the CPU supports (GCC function multi-versioning).

namespace smp_nn::kernels {
namespace {

constexpr float kV1 = 1.5957691216057308f;  // 2 sqrt(2/pi)
constexpr float kV3 = kV1 * 0.044715f;

inline float bits_to_float(int32_t i) {
  float f;
  std::memcpy(&f, &i, sizeof f);
  return f;
}

// e^t for t in [-80, 80] (callers clamp: outside it s is 0 or 1 to float
// precision, and e^80 keeps 1 / (1 + e^t) a normal number). t = k ln2 + r with
// k = round(t / ln2) and |r| <= ln2 / 2 (ln2 in two parts, so r is exact to a
// few ulp); e^r = 1 + r + r^2 p(r) with p Cephes' fitted degree-5 polynomial;
// 2^k by adding k to the exponent bits.
inline float exp_clamped(float t) {
  constexpr float kLog2e = 1.44269504088896341f, kRound = 12582912.0f;  // 1.5 * 2^23
  constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
  const float kf = (t * kLog2e + kRound) - kRound;  // round to nearest
  const float r = (t - kf * kLn2Hi) - kf * kLn2Lo;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float er = p * r * r + r + 1.0f;
  return er * bits_to_float((static_cast<int32_t>(kf) + 127) << 23);
}

inline float sigmoid_of_v(float x) {
  const float v = x * (kV1 + kV3 * x * x);
  float t = -v;
  t = t < -80.0f ? -80.0f : t;
  t = t > 80.0f ? 80.0f : t;
  return 1.0f / (1.0f + exp_clamped(t));
}

}  // namespace

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("arch=x86-64-v3", "default")))
#endif
void gelu_tanh_forward(const float* __restrict x, float* __restrict y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * sigmoid_of_v(x[i]);
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("arch=x86-64-v3", "default")))
#endif
void gelu_tanh_backward(const float* __restrict g, const float* __restrict x, float* __restrict dx, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float xi = x[i], s = sigmoid_of_v(xi);
    const float dv = kV1 + 3.0f * kV3 * xi * xi;
    dx[i] = g[i] * (s + xi * s * (1.0f - s) * dv);
  }
}

}  // namespace smp_nn::kernels
