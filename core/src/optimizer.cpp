#include "optimizer.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <cmath>

namespace smp {

AdamW::AdamW(std::vector<at::Tensor> params, AdamWOptions options) : opt_(options) {
  for (auto& p : params) {
    if (!p.requires_grad()) continue;
    params_.push_back(p);
    exp_avg_.push_back(at::zeros_like(p).detach());
    exp_avg_sq_.push_back(at::zeros_like(p).detach());
  }
}

void AdamW::step(double lr) {
  c10::NoGradGuard no_grad;
  ++t_;
  const double bc1 = 1.0 - std::pow(opt_.beta1, static_cast<double>(t_));
  const double bc2 = 1.0 - std::pow(opt_.beta2, static_cast<double>(t_));
  for (size_t i = 0; i < params_.size(); ++i) {
    at::Tensor& p = params_[i];
    if (!p.grad().defined()) continue;
    const at::Tensor& g = p.grad();
    if (opt_.weight_decay > 0 && p.dim() >= 2) p.mul_(1.0 - lr * opt_.weight_decay);
    exp_avg_[i].mul_(opt_.beta1).add_(g, 1.0 - opt_.beta1);
    exp_avg_sq_[i].mul_(opt_.beta2).addcmul_(g, g, 1.0 - opt_.beta2);
    at::Tensor denom = (exp_avg_sq_[i] / bc2).sqrt_().add_(opt_.eps);
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
