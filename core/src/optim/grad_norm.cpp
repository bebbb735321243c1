#include "optim/grad_norm.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>
#include <torch/version.h>

#include <algorithm>
#include <map>
#include <string>
#include <utility>

// _foreach_norm's dtype argument (norms of 16-bit gradients in fp32).
#define SMP_FOREACH_NORM_DTYPE (TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4))

namespace smp {

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

// Whether _foreach_norm takes this dtype here (fp32 out, or its own dtype in fp32 / fp64).
bool foreach_norm_takes(at::ScalarType t) {
#if SMP_FOREACH_NORM_DTYPE
  return t == at::kFloat || t == at::kBFloat16 || t == at::kHalf;
#else
  return t == at::kFloat;
#endif
}

}  // namespace

double squared_norm(const std::vector<at::Tensor>& grads, const std::vector<bool>& counted, NormKernels kernels) {
  c10::NoGradGuard ng;
  double in_double = 0.0;
  std::vector<at::Tensor> norms;  // fp32, in the parameters' order
  std::map<std::pair<std::string, int>, std::vector<size_t>> groups;  // (device, dtype) -> positions in norms
  std::map<std::pair<std::string, int>, std::vector<at::Tensor>> members;
  for (size_t k = 0; k < grads.size(); ++k) {
    const at::Tensor& g = grads[k];
    if (!counted[k] || !g.defined()) continue;
    const bool multi = kernels == NormKernels::MultiTensor || (kernels == NormKernels::Auto && g.is_cuda());
    if (kernels == NormKernels::Auto && is_cpu_float(g)) {
      in_double += sum_of_squares(g);
      continue;
    }
    if (multi && foreach_norm_takes(g.scalar_type())) {
      const std::pair<std::string, int> key{g.device().str(), static_cast<int>(g.scalar_type())};
      groups[key].push_back(norms.size());
      members[key].push_back(g);
      norms.emplace_back();  // filled below
      continue;
    }
    norms.push_back(g.norm(2, at::kFloat));
  }
  for (auto& [key, list] : members) {
#if SMP_FOREACH_NORM_DTYPE
    const std::vector<at::Tensor> out = at::_foreach_norm(list, 2, at::kFloat);
#else
    const std::vector<at::Tensor> out = at::_foreach_norm(list, 2);
#endif
    const std::vector<size_t>& at_pos = groups[key];
    for (size_t j = 0; j < out.size(); ++j) norms[at_pos[j]] = out[j];
  }
  if (norms.empty()) return in_double;
  // On the CPU a norm is a CPU scalar; on a GPU stacked on the device (one copy back).
  return in_double + at::stack(norms).to(at::kDouble).pow(2).sum().item<double>();
}

}  // namespace smp
