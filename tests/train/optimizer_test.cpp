// AdamW: the fused fp32 loop against the textbook update written in ATen ops,
// with the gradient scale applied on the fly and decay on matrices only; the
// learning-rate schedule's warm-up and cosine decay.
#include "optim/optimizer.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>

namespace {

// The textbook AdamW step (decoupled decay), for one parameter.
void reference_step(at::Tensor& p, at::Tensor& m, at::Tensor& v, const at::Tensor& g, double lr, int64_t t,
                    const smp::AdamWOptions& o, bool decay) {
  if (decay) p.mul_(1.0 - lr * o.weight_decay);
  m.mul_(o.beta1).add_(g, 1.0 - o.beta1);
  v.mul_(o.beta2).addcmul_(g, g, 1.0 - o.beta2);
  const double bc1 = 1.0 - std::pow(o.beta1, static_cast<double>(t));
  const double bc2 = 1.0 - std::pow(o.beta2, static_cast<double>(t));
  at::Tensor denom = (v / bc2).sqrt().add_(o.eps);
  p.addcdiv_(m, denom, -lr / bc1);
}

TEST(AdamW, MatchesTheTextbookUpdateWithGradScaleAndDecayOnMatrices) {
  smp::AdamWOptions o;
  o.weight_decay = 0.1;
  at::Tensor w = at::randn({5, 7}, at::kFloat).requires_grad_(true);   // decayed (a matrix)
  at::Tensor b = at::randn({7}, at::kFloat).requires_grad_(true);      // not decayed
  at::Tensor wd = at::randn({3, 4}, at::kDouble).requires_grad_(true); // the ATen path
  std::vector<at::Tensor> ref = {w.detach().clone(), b.detach().clone(), wd.detach().clone()};
  std::vector<at::Tensor> m, v;
  for (auto& r : ref) m.push_back(at::zeros_like(r)), v.push_back(at::zeros_like(r));
  smp::AdamW adam({w, b, wd}, o);
  const double scale = 0.25;
  for (int64_t t = 1; t <= 4; ++t) {
    std::vector<at::Tensor> params = {w, b, wd};
    for (size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = at::randn_like(params[i]).detach();
    adam.step(1e-2, scale, {w.grad(), b.grad(), wd.grad()});
    for (size_t i = 0; i < params.size(); ++i) {
      at::Tensor g = params[i].grad() * scale;
      reference_step(ref[i], m[i], v[i], g, 1e-2, t, o, params[i].dim() >= 2);
      const double tol = params[i].scalar_type() == at::kDouble ? 1e-12 : 1e-6;
      EXPECT_TRUE(at::allclose(params[i].detach(), ref[i], tol, tol)) << "parameter " << i << " step " << t;
    }
  }
  // .grad is read, never changed
  EXPECT_EQ(adam.state_bytes(), 2 * (35 * 4 + 7 * 4 + 12 * 8));
}

// Mixed precision: an fp32 master updated from a bf16 gradient equals the
// update from that gradient in fp32 (the optimizer upcasts, never rounds the state).
TEST(AdamW, UpdatesFp32MastersFromBf16Gradients) {
  smp::AdamWOptions o;
  at::Tensor master = at::randn({4, 6}, at::kFloat);
  at::Tensor ref = master.clone(), m = at::zeros_like(ref), v = at::zeros_like(ref);
  smp::AdamW adam({master}, o);
  for (int64_t t = 1; t <= 3; ++t) {
    at::Tensor g16 = at::randn({4, 6}, at::kFloat).to(at::kBFloat16);
    adam.step(1e-2, 0.5, {g16});
    reference_step(ref, m, v, g16.to(at::kFloat) * 0.5, 1e-2, t, o, true);
    EXPECT_TRUE(at::allclose(master, ref, 1e-6, 1e-6)) << "step " << t;
  }
  EXPECT_EQ(master.scalar_type(), at::kFloat);
}

TEST(LrSchedule, WarmupThenCosineToMinLr) {
  smp::LrSchedule s;
  s.lr = 1.0, s.min_lr = 0.1, s.warmup = 4, s.total = 14;
  EXPECT_DOUBLE_EQ(s.at(0), 0.25);
  EXPECT_DOUBLE_EQ(s.at(3), 1.0);
  EXPECT_DOUBLE_EQ(s.at(4), 1.0);                       // decay starts at 0
  EXPECT_NEAR(s.at(9), 0.1 + 0.45 * (1 + std::cos(M_PI * 0.5)), 1e-12);
  EXPECT_DOUBLE_EQ(s.at(14), 0.1);
  EXPECT_DOUBLE_EQ(s.at(100), 0.1);                     // clamped past the end
}

}  // namespace
