#include "optimizers.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

namespace smp_optim {

using smp::sdk::Error;

Sgd::Sgd(const smp::sdk::OptimizerSetup& s) : params_(s.params), decay_(s.weight_decay), weight_decay_(s.weight_decay_rate) {
  smp::sdk::expect_optimizer_keys(s, {"momentum", "dampening", "nesterov", "l2", "kernels"});
  kernels_ = kernels_of(smp::sdk::optimizer_get<std::string>(s, "kernels", "auto"));
  momentum_ = smp::sdk::optimizer_get(s, "momentum", 0.0);
  dampening_ = smp::sdk::optimizer_get(s, "dampening", 0.0);
  nesterov_ = smp::sdk::optimizer_get(s, "nesterov", false);
  l2_ = smp::sdk::optimizer_get(s, "l2", 0.0);
  if (!(l2_ >= 0)) throw Error("optimizer.l2: expected a number >= 0, got " + std::to_string(l2_));
  if (!(momentum_ >= 0)) throw Error("optimizer.momentum: expected a number >= 0, got " + std::to_string(momentum_));
  if (nesterov_ && (momentum_ <= 0 || dampening_ != 0))
    throw Error("optimizer.nesterov = true needs optimizer.momentum > 0 and optimizer.dampening = 0");
  if (momentum_ > 0)
    for (const auto& p : params_) momentum_buffer_.push_back(at::zeros_like(p).detach());
  // Without momentum the foreach update is one pass already (p -= lr scale g).
  if (momentum_ > 0) check_fused_available(kernels_, params_, SMP_OPTIM_HAS_FUSED_SGD, "SGD", "2.3");
}

void Sgd::step(const smp::sdk::OptimizerUpdate& u) {
  c10::NoGradGuard no_grad;
  std::vector<std::pair<size_t, Kernels>> multi;  // the tensors for multi-tensor kernels
  for (size_t i = 0; i < params_.size(); ++i) {
    at::Tensor& p = params_[i];
    const at::Tensor& grad = u.grads.at(i);
    if (!grad.defined()) continue;
    const Kernels k = kernels_for(kernels_, p.device(), momentum_ > 0 && SMP_OPTIM_HAS_FUSED_SGD);
    if (k != Kernels::PerTensor) {
      multi.emplace_back(i, k);
      continue;
    }
    if (weight_decay_ > 0 && decay_.at(i)) p.mul_(1.0 - u.lr * weight_decay_);
    if (momentum_ == 0 && l2_ == 0) {  // p -= lr (scale g): one pass, the scale folded into the step size
      p.add_(grad.scalar_type() == p.scalar_type() ? grad : grad.to(p.scalar_type()), -u.lr * u.grad_scale);
      continue;
    }
    at::Tensor g = grad.to(p.scalar_type()).mul(u.grad_scale);
    if (l2_ > 0) g.add_(p, l2_);  // torch.optim.SGD's weight_decay: on the gradient, every parameter
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
  if (multi.empty()) return;
  for (const Group& group : multi_tensor_groups(multi, params_, decay_)) {
    const std::vector<at::Tensor> p = pick(params_, group.index);
    if (weight_decay_ > 0 && group.decay) at::_foreach_mul_(p, 1.0 - u.lr * weight_decay_);  // decoupled
    if (momentum_ == 0 && l2_ == 0) {  // as above: the scale folded into the step size
      at::_foreach_add_(p, scaled_gradients(u.grads, group.index, p[0].scalar_type(), 1.0), -u.lr * u.grad_scale);
      continue;
    }
    std::vector<at::Tensor> g = scaled_gradients(u.grads, group.index, p[0].scalar_type(), u.grad_scale);
    // The fused kernel (with momentum) adds l2 itself; every other path here adds it.
    const bool fused = group.kernels == Kernels::Fused && momentum_ > 0;
    if (l2_ > 0 && !fused) g = at::_foreach_add(g, p, l2_);  // a copy: .grad is read only
    if (momentum_ == 0) {
      at::_foreach_add_(p, g, -u.lr);
      continue;
    }
    const std::vector<at::Tensor> buf = pick(momentum_buffer_, group.index);
    if (group.kernels == Kernels::Fused) {
#if SMP_OPTIM_HAS_FUSED_SGD
      // One pass: p, g, buf read, p, buf written (the first step buf = g).
      at::_fused_sgd_(p, g, buf, /*weight_decay=*/l2_, momentum_, u.lr, dampening_, nesterov_, /*maximize=*/false,
                      /*is_first_step=*/u.step == 1);
      continue;
#endif
    }
    if (u.step == 1) {
      for (size_t j = 0; j < buf.size(); ++j) buf[j].copy_(g[j]);
    } else {
      at::_foreach_mul_(buf, momentum_);
      at::_foreach_add_(buf, g, 1.0 - dampening_);
    }
    if (nesterov_) {
      if (u.grad_scale == 1.0 && l2_ == 0) g = at::_foreach_mul(g, 1.0);  // g + momentum buf into a copy: .grad is read only
      at::_foreach_add_(g, buf, momentum_);
      at::_foreach_add_(p, g, -u.lr);
    } else {
      at::_foreach_add_(p, buf, -u.lr);
    }
  }
}

std::vector<smp::sdk::OptimizerState> Sgd::state() {
  std::vector<smp::sdk::OptimizerState> out;
  for (size_t i = 0; i < momentum_buffer_.size(); ++i) out.push_back({i, "momentum", momentum_buffer_[i]});
  return out;
}

}  // namespace smp_optim
