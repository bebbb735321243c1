// What the plain LibTorch reference loops share (plain_gpt, plain_ncf): AdamW
// and the learning-rate schedule as smp's, and a clock.
#pragma once

#include <smp/config.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>
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

// The [train] keys a plain loop reads, and its optimizer, from the job's config.
struct TrainKeys {
  int64_t batch, steps, warmup;
  double lr, min_lr, clip;
  static TrainKeys from(const smp::Config& c) {
    return {c.get_int("train.batch_size"), c.get_int("train.steps"),   c.get_int("train.warmup_steps"),
            c.get_double("train.lr"),      c.get_double("train.min_lr"), c.get_double("train.grad_clip")};
  }
};
inline AdamW adamw_of(std::vector<at::Tensor> params, const smp::Config& c) {
  return AdamW(std::move(params), c.get_double("train.beta1"), c.get_double("train.beta2"), c.get_double("train.eps"),
               c.get_double("train.weight_decay"));
}

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
  // The summary shaped like smp's: losses, step times, and `rate_key` (e.g.
  // "tokens_per_s") from `per_step` items per step.
  nlohmann::json summary(const std::string& rate_key, double per_step) const {
    const double step_s = mean_step();
    nlohmann::json j;
    j["losses"] = losses;
    j["final_loss"] = losses.empty() ? 0.0 : losses.back();
    j["step_seconds"] = step_s;
    j["step_seconds_each"] = step_seconds;
    j[rate_key] = step_s > 0 ? per_step / step_s : 0;
    j["threads"] = at::get_num_threads();
    return j;
  }
};

// Global-norm gradient clipping as one writes it by hand (torch's clip_grad_norm_).
inline void clip_grad_norm(const std::vector<at::Tensor>& params, double clip) {
  c10::NoGradGuard ng;
  std::vector<at::Tensor> norms;
  for (const auto& p : params) norms.push_back(at::norm(p.grad()));
  const double norm = at::stack(norms).norm().item<double>();
  if (clip > 0 && norm > clip)
    for (const auto& p : params) p.mutable_grad().mul_(clip / (norm + 1e-6));
}

}  // namespace bench
