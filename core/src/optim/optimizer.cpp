#include "optim/optimizer.h"

#include <ATen/core/Tensor.h>
#include <ATen/ops/zeros_like.h>
#include <c10/core/GradMode.h>

#include <cmath>

namespace smp {

AdamW::AdamW(std::vector<at::Tensor> params, AdamWOptions options, std::vector<bool> decay)
    : decay_(std::move(decay)), opt_(options) {
  if (decay_.empty())
    for (auto& p : params) decay_.push_back(p.dim() >= 2);
  for (auto& p : params) {
    params_.push_back(p);
    exp_avg_.push_back(at::zeros_like(p).detach());
    exp_avg_sq_.push_back(at::zeros_like(p).detach());
  }
}

namespace {

struct Coefficients {
  float decay, beta1, beta2, one_minus_beta1, one_minus_beta2, inv_bc2, eps, step_size, grad_scale;
};

// One pass per element. Built for AVX2+FMA and for the baseline ISA; the
// loader picks the clone the CPU supports (GCC function multi-versioning).
// sqrt vectorizes because this file is compiled with -fno-math-errno.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx2,fma", "default")))
#endif
void adamw_fp32(float* __restrict p, const float* __restrict g, float* __restrict m, float* __restrict v, int64_t n,
                Coefficients c) {
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i] * c.grad_scale;
    const float mi = c.beta1 * m[i] + c.one_minus_beta1 * gi;
    const float vi = c.beta2 * v[i] + c.one_minus_beta2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] = p[i] * c.decay - c.step_size * mi / (std::sqrt(vi * c.inv_bc2) + c.eps);
  }
}

bool fusable(const at::Tensor& p, const at::Tensor& g, const at::Tensor& m, const at::Tensor& v) {
  for (const at::Tensor* t : {&p, &g, &m, &v})
    if (t->scalar_type() != at::kFloat || !t->is_contiguous() || !t->device().is_cpu()) return false;
  return g.numel() == p.numel();
}

}  // namespace

void AdamW::step(double lr, double grad_scale, const std::vector<at::Tensor>& grads) {
  c10::NoGradGuard no_grad;
  ++t_;
  const double bc1 = 1.0 - std::pow(opt_.beta1, static_cast<double>(t_));
  const double bc2 = 1.0 - std::pow(opt_.beta2, static_cast<double>(t_));
  for (size_t i = 0; i < params_.size(); ++i) {
    at::Tensor p = params_[i].detach();  // updated in place, outside autograd
    if (!grads.at(i).defined()) continue;
    const at::Tensor& g = grads[i];
    const double decay = opt_.weight_decay > 0 && decay_.at(i) ? 1.0 - lr * opt_.weight_decay : 1.0;
    if (fusable(p, g, exp_avg_[i], exp_avg_sq_[i])) {
      const Coefficients c{static_cast<float>(decay),
                           static_cast<float>(opt_.beta1),
                           static_cast<float>(opt_.beta2),
                           static_cast<float>(1.0 - opt_.beta1),
                           static_cast<float>(1.0 - opt_.beta2),
                           static_cast<float>(1.0 / bc2),
                           static_cast<float>(opt_.eps),
                           static_cast<float>(lr / bc1),
                           static_cast<float>(grad_scale)};
      adamw_fp32(p.data_ptr<float>(), g.data_ptr<float>(), exp_avg_[i].data_ptr<float>(),
                 exp_avg_sq_[i].data_ptr<float>(), p.numel(), c);
      continue;
    }
    at::Tensor gs = g.to(p.scalar_type());  // a 16-bit gradient of an fp32 master
    if (grad_scale != 1.0) gs = gs.mul(grad_scale);
    if (decay != 1.0) p.mul_(decay);
    exp_avg_[i].mul_(opt_.beta1).add_(gs, 1.0 - opt_.beta1);
    exp_avg_sq_[i].mul_(opt_.beta2).addcmul_(gs, gs, 1.0 - opt_.beta2);
    at::Tensor denom = exp_avg_sq_[i].div(bc2).sqrt_().add_(opt_.eps);
    p.addcdiv_(exp_avg_[i], denom, -lr / bc1);
  }
}

int64_t AdamW::state_bytes() const {
  int64_t b = 0;
  for (size_t i = 0; i < params_.size(); ++i) b += 2 * exp_avg_[i].numel() * exp_avg_[i].element_size();
  return b;
}

double LrSchedule::at(int64_t step) const {
  if (warmup > 0 && step < warmup) return lr * static_cast<double>(step + 1) / static_cast<double>(warmup);
  if (total <= warmup) return lr;
  double progress = static_cast<double>(step - warmup) / static_cast<double>(std::max<int64_t>(1, total - warmup));
  progress = std::min(1.0, std::max(0.0, progress));
  return min_lr + 0.5 * (lr - min_lr) * (1.0 + std::cos(M_PI * progress));
}

}  // namespace smp
