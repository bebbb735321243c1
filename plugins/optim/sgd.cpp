#include "optimizers.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

namespace smp_optim {

using smp::sdk::Error;

Sgd::Sgd(const smp::sdk::OptimizerSetup& s) : params_(s.params), decay_(s.weight_decay), weight_decay_(s.weight_decay_rate) {
  smp::sdk::expect_optimizer_keys(s, {"momentum", "dampening", "nesterov"});
  momentum_ = smp::sdk::optimizer_get(s, "momentum", 0.0);
  dampening_ = smp::sdk::optimizer_get(s, "dampening", 0.0);
  nesterov_ = smp::sdk::optimizer_get(s, "nesterov", false);
  if (!(momentum_ >= 0)) throw Error("optimizer.momentum: expected a number >= 0, got " + std::to_string(momentum_));
  if (nesterov_ && (momentum_ <= 0 || dampening_ != 0))
    throw Error("optimizer.nesterov = true needs optimizer.momentum > 0 and optimizer.dampening = 0");
  if (momentum_ > 0)
    for (const auto& p : params_) momentum_buffer_.push_back(at::zeros_like(p).detach());
}

void Sgd::step(const smp::sdk::OptimizerUpdate& u) {
  c10::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    at::Tensor& p = params_[i];
    const at::Tensor& grad = u.grads.at(i);
    if (!grad.defined()) continue;
    if (weight_decay_ > 0 && decay_.at(i)) p.mul_(1.0 - u.lr * weight_decay_);
    if (momentum_ == 0) {  // p -= lr (scale g): one pass, the scale folded into the step size
      p.add_(grad.scalar_type() == p.scalar_type() ? grad : grad.to(p.scalar_type()), -u.lr * u.grad_scale);
      continue;
    }
    at::Tensor g = grad.to(p.scalar_type()).mul(u.grad_scale);
    if (momentum_ > 0) {
      at::Tensor& buf = momentum_buffer_[i];
      if (u.step == 1)
        buf.copy_(g);
      else
        buf.mul_(momentum_).add_(g, 1.0 - dampening_);
      g = nesterov_ ? g.add(buf, momentum_) : buf;
    }
    p.add_(g, -u.lr);
  }
}

std::vector<smp::sdk::OptimizerState> Sgd::state() {
  std::vector<smp::sdk::OptimizerState> out;
  for (size_t i = 0; i < momentum_buffer_.size(); ++i) out.push_back({i, "momentum", momentum_buffer_[i]});
  return out;
}

}  // namespace smp_optim
