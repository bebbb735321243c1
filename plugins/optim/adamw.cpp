#include "optimizers.h"

#include "multi_tensor.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <cmath>

namespace smp_optim {

using smp::sdk::Error;

AdamW::AdamW(const smp::sdk::OptimizerSetup& s)
    : params_(s.params), decay_(s.weight_decay), weight_decay_(s.weight_decay_rate) {
  smp::sdk::expect_optimizer_keys(s, {"beta1", "beta2", "eps", "l2", "kernels"});
  kernels_ = kernels_of(smp::sdk::optimizer_get<std::string>(s, "kernels", "auto"));
  check_fused_available(kernels_, params_, SMP_OPTIM_HAS_FUSED_ADAMW, "AdamW", "2.0");
  beta1_ = smp::sdk::optimizer_get(s, "beta1", 0.9);
  beta2_ = smp::sdk::optimizer_get(s, "beta2", 0.95);
  eps_ = smp::sdk::optimizer_get(s, "eps", 1e-8);
  l2_ = smp::sdk::optimizer_get(s, "l2", 0.0);
  if (!(l2_ >= 0)) throw Error("optimizer.l2: expected a number >= 0, got " + std::to_string(l2_));
  if (!(beta1_ >= 0 && beta1_ < 1) || !(beta2_ >= 0 && beta2_ < 1))
    throw Error("optimizer.beta1 / beta2: expected numbers in [0, 1), got " + std::to_string(beta1_) + " / " +
                std::to_string(beta2_));
  if (!(eps_ > 0)) throw Error("optimizer.eps: expected a positive number, got " + std::to_string(eps_));
  for (const auto& p : params_) {
    exp_avg_.push_back(at::zeros_like(p).detach());
    exp_avg_sq_.push_back(at::zeros_like(p).detach());
  }
}

namespace {

struct Coefficients {
  float decay, beta1, beta2, one_minus_beta1, one_minus_beta2, inv_bc2, eps, step_size, grad_scale, l2;
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
    const float gi = g[i] * c.grad_scale + c.l2 * p[i];  // Adam's coupled weight decay (l2), 0 for AdamW
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

void AdamW::step(const smp::sdk::OptimizerUpdate& u) {
  c10::NoGradGuard no_grad;
  const double lr = u.lr, t = static_cast<double>(u.step);
  const double bc1 = 1.0 - std::pow(beta1_, t), bc2 = 1.0 - std::pow(beta2_, t);
  std::vector<std::pair<size_t, Kernels>> multi;  // the tensors for multi-tensor kernels
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!u.grads.at(i).defined()) continue;
    const Kernels k = kernels_for(kernels_, params_[i].device(), SMP_OPTIM_HAS_FUSED_ADAMW);
    if (k != Kernels::PerTensor) {
      multi.emplace_back(i, k);
      continue;
    }
    at::Tensor p = params_[i].detach();  // updated in place, outside autograd
    const at::Tensor& g = u.grads[i];
    const double decay = weight_decay_ > 0 && decay_.at(i) ? 1.0 - lr * weight_decay_ : 1.0;
    if (fusable(p, g, exp_avg_[i], exp_avg_sq_[i])) {
      const Coefficients c{static_cast<float>(decay),          static_cast<float>(beta1_),
                           static_cast<float>(beta2_),         static_cast<float>(1.0 - beta1_),
                           static_cast<float>(1.0 - beta2_),   static_cast<float>(1.0 / bc2),
                           static_cast<float>(eps_),           static_cast<float>(lr / bc1),
                           static_cast<float>(u.grad_scale),   static_cast<float>(l2_)};
      adamw_fp32(p.data_ptr<float>(), g.data_ptr<float>(), exp_avg_[i].data_ptr<float>(),
                 exp_avg_sq_[i].data_ptr<float>(), p.numel(), c);
      continue;
    }
    at::Tensor gs = g.to(p.scalar_type());  // a 16-bit gradient of an fp32 master
    if (u.grad_scale != 1.0) gs = gs.mul(u.grad_scale);
    if (l2_ > 0) gs = gs.add(p, l2_);
    if (decay != 1.0) p.mul_(decay);
    exp_avg_[i].mul_(beta1_).add_(gs, 1.0 - beta1_);
    exp_avg_sq_[i].mul_(beta2_).addcmul_(gs, gs, 1.0 - beta2_);
    at::Tensor denom = exp_avg_sq_[i].div(bc2).sqrt_().add_(eps_);
    p.addcdiv_(exp_avg_[i], denom, -lr / bc1);
  }
  if (multi.empty()) return;
  std::vector<at::Tensor> params;
  params.reserve(params_.size());
  for (const auto& p : params_) params.push_back(p.detach());
  for (const Group& group : multi_tensor_groups(multi, params, decay_)) {
    const std::vector<at::Tensor> p = pick(params, group.index), m = pick(exp_avg_, group.index),
                                  v = pick(exp_avg_sq_, group.index);
    std::vector<at::Tensor> g = scaled_gradients(u.grads, group.index, p[0].scalar_type(), u.grad_scale);
    const bool decayed = weight_decay_ > 0 && group.decay;
    if (l2_ > 0) g = at::_foreach_add(g, p, l2_);  // the fused AdamW kernel has no coupled decay: the formula below
    if (group.kernels == Kernels::Fused && l2_ == 0) {
#if SMP_OPTIM_HAS_FUSED_ADAMW
      // One pass: p, g, m, v read, p, m, v written. The kernel takes the step
      // count as a float tensor per parameter, on their device (one, shared).
      const at::Tensor step = at::full({}, t, p[0].options().dtype(at::kFloat));
      const std::vector<at::Tensor> steps(p.size(), step);
      at::_fused_adamw_(p, g, m, v, /*max_exp_avg_sqs=*/{}, steps, lr, beta1_, beta2_,
                        decayed ? weight_decay_ : 0.0, eps_, /*amsgrad=*/false, /*maximize=*/false);
      continue;
#endif
    }
    // The per-tensor ATen formula above, each op one kernel over the group.
    if (decayed) at::_foreach_mul_(p, 1.0 - lr * weight_decay_);
    at::_foreach_mul_(m, beta1_);
    at::_foreach_add_(m, g, 1.0 - beta1_);
    at::_foreach_mul_(v, beta2_);
    at::_foreach_addcmul_(v, g, g, 1.0 - beta2_);
    std::vector<at::Tensor> denom = at::_foreach_div(v, bc2);
    at::_foreach_sqrt_(denom);
    at::_foreach_add_(denom, eps_);
    at::_foreach_addcdiv_(p, m, denom, -lr / bc1);
  }
}

std::vector<smp::sdk::OptimizerState> AdamW::state() {
  std::vector<smp::sdk::OptimizerState> out;
  for (size_t i = 0; i < params_.size(); ++i) {
    out.push_back({i, "exp_avg", exp_avg_[i]});
    out.push_back({i, "exp_avg_sq", exp_avg_sq_[i]});
  }
  return out;
}

}  // namespace smp_optim
