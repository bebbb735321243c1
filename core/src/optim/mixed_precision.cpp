#include "optim/mixed_precision.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <spdlog/spdlog.h>

#include <algorithm>

namespace smp {

at::ScalarType compute_dtype(Precision p) {
  switch (p) {
    case Precision::Bf16: return at::kBFloat16;
    case Precision::Fp16: return at::kHalf;
    case Precision::Fp32: break;
  }
  return at::kFloat;
}

MasterWeights::MasterWeights(std::vector<at::Tensor> params, at::ScalarType compute) : params_(std::move(params)) {
  c10::NoGradGuard no_grad;
  masters_.reserve(params_.size());
  for (auto& p : params_) {
    masters_.push_back(p.detach().to(at::kFloat, /*non_blocking=*/false, /*copy=*/true));
    if (p.is_floating_point() && p.scalar_type() != compute) p.set_data(p.detach().to(compute));
  }
}

void MasterWeights::copy_to_params() {
  c10::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) params_[i].detach().copy_(masters_[i]);
}

int64_t MasterWeights::bytes() const {
  int64_t b = 0;
  for (const auto& m : masters_) b += m.numel() * static_cast<int64_t>(m.element_size());
  return b;
}

bool DynamicLossScaler::update(bool finite) {
  if (finite) {
    if (++good_ >= o_.window) {
      scale_ *= o_.growth;
      good_ = 0;
    }
    return true;
  }
  ++skipped_;
  good_ = 0;
  const double before = scale_;
  scale_ = std::max(o_.min, scale_ * o_.backoff);
  if (scale_ <= o_.min)
    spdlog::warn("fp16 loss scale {} after an overflow: it reached train.min_loss_scale ({}); gradients overflow "
                 "even unscaled (a diverging run, or a model that needs bf16)",
                 before == scale_ ? "stays at the minimum" : "collapsed to the minimum", o_.min);
  return false;
}

}  // namespace smp
