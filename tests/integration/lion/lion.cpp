// A third party's optimizer, written against the SDK alone: Lion (Chen et al.
// 2023, "Symbolic Discovery of Optimization Algorithms"):
//   c = beta1 m + (1 - beta1) g;  p <- p (1 - lr wd) - lr sign(c);  m <- beta2 m + (1 - beta2) g
// [optimizer] keys beta1 (0.9), beta2 (0.99). Elementwise, so it runs on ZeRO's
// shard segments as on whole parameters.
#include <smp/sdk/plugin.hpp>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

namespace {

class Lion : public smp::sdk::Optimizer {
 public:
  explicit Lion(const smp::sdk::OptimizerSetup& s) : params_(s.params), decay_(s.weight_decay), wd_(s.weight_decay_rate) {
    smp::sdk::expect_optimizer_keys(s, {"beta1", "beta2"});
    beta1_ = smp::sdk::optimizer_get(s, "beta1", 0.9);
    beta2_ = smp::sdk::optimizer_get(s, "beta2", 0.99);
    for (const auto& p : params_) m_.push_back(at::zeros_like(p).detach());
  }
  void step(const smp::sdk::OptimizerUpdate& u) override {
    c10::NoGradGuard no_grad;
    for (size_t i = 0; i < params_.size(); ++i) {
      if (!u.grads[i].defined()) continue;
      at::Tensor p = params_[i].detach();
      at::Tensor g = u.grads[i].to(p.scalar_type()).mul(u.grad_scale);
      at::Tensor c = m_[i].mul(beta1_).add_(g, 1.0 - beta1_);
      if (wd_ > 0 && decay_[i]) p.mul_(1.0 - u.lr * wd_);
      p.add_(c.sign_(), -u.lr);
      m_[i].mul_(beta2_).add_(g, 1.0 - beta2_);
    }
  }
  std::vector<smp::sdk::OptimizerState> state() override {
    std::vector<smp::sdk::OptimizerState> out;
    for (size_t i = 0; i < m_.size(); ++i) out.push_back({i, "exp_avg", m_[i]});
    return out;
  }

 private:
  std::vector<at::Tensor> params_, m_;
  std::vector<bool> decay_;
  double wd_, beta1_, beta2_;
};

}  // namespace

SMP_PLUGIN(smp::sdk::PluginBuilder("lion", "0.1.0").optimizer<Lion>("lion"))
