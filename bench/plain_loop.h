// What the plain LibTorch reference loops share (plain_gpt, plain_ncf): AdamW
// and the learning-rate schedule as smp's, and a clock.
#pragma once

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <vector>

namespace bench {

using Clock = std::chrono::steady_clock;

struct AdamW {  // smp's: decay on dim >= 2 tensors only
  std::vector<at::Tensor> params, m, v;
  double b1, b2, eps, wd;
  int64_t t = 0;
  AdamW(std::vector<at::Tensor> p, double b1_, double b2_, double eps_, double wd_)
      : params(std::move(p)), b1(b1_), b2(b2_), eps(eps_), wd(wd_) {
    for (auto& x : params) {
      m.push_back(at::zeros_like(x).detach());
      v.push_back(at::zeros_like(x).detach());
    }
  }
  void step(double lr) {
    c10::NoGradGuard ng;
    ++t;
    const double bc1 = 1.0 - std::pow(b1, static_cast<double>(t));
    const double bc2 = 1.0 - std::pow(b2, static_cast<double>(t));
    for (size_t i = 0; i < params.size(); ++i) {
      at::Tensor& p = params[i];
      const at::Tensor& g = p.grad();
      if (!g.defined()) continue;
      if (wd > 0 && p.dim() >= 2) p.mul_(1.0 - lr * wd);
      m[i].mul_(b1).add_(g, 1.0 - b1);
      v[i].mul_(b2).addcmul_(g, g, 1.0 - b2);
      at::Tensor denom = v[i].sqrt().div_(std::sqrt(bc2)).add_(eps);
      p.addcdiv_(m[i], denom, -lr / bc1);
    }
  }
};

inline double lr_at(int64_t step, double lr, double min_lr, int64_t warmup, int64_t total) {  // smp's LrSchedule
  if (warmup > 0 && step < warmup) return lr * static_cast<double>(step + 1) / static_cast<double>(warmup);
  if (total <= warmup) return lr;
  double progress = static_cast<double>(step - warmup) / static_cast<double>(std::max<int64_t>(1, total - warmup));
  progress = std::min(1.0, std::max(0.0, progress));
  return min_lr + 0.5 * (lr - min_lr) * (1.0 + std::cos(M_PI * progress));
}

inline double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// The per-step record both loops keep: losses, step times, and the mean step
// time over steps 2..N (the first excluded, the same rule as smp's run_training).
struct StepLog {
  std::vector<double> losses, step_seconds;
  double timed = 0;
  int64_t n_timed = 0;
  // Returns whether the step counts in the mean.
  bool add(int64_t step, int64_t steps, double seconds, double loss) {
    losses.push_back(loss);
    step_seconds.push_back(seconds);
    if (step == 0 && steps != 1) return false;
    timed += seconds;
    ++n_timed;
    return true;
  }
  double mean_step() const { return n_timed ? timed / static_cast<double>(n_timed) : 0.0; }
};

}  // namespace bench
