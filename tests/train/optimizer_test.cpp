// The standard optimizers as the core runs them: smp_optim's kinds loaded
// through the ABI (2.3's optimizer extension) and driven by OptimizerInstance.
// AdamW: the fused fp32 loop against the textbook update written in ATen ops,
// with the gradient scale applied on the fly and decay on matrices only; SGD
// with momentum, dampening and Nesterov against PyTorch's formula; unknown
// keys refused by name. And the learning-rate schedule.
#include <smp/error.h>
#include <smp/plugin_registry.h>

#include "optim/lr_schedule.h"
#include "plugin/optimizer_instance.h"
#include "train/smp_optim_instance.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <memory>

namespace {

struct AdamWOptions {
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
};

using smp_test::make;

std::unique_ptr<smp::OptimizerInstance> adamw(const std::vector<at::Tensor>& params, const AdamWOptions& o) {
  return make("adamw", {{"beta1", o.beta1}, {"beta2", o.beta2}, {"eps", o.eps}}, params, o.weight_decay);
}

// The textbook AdamW step (decoupled decay), for one parameter.
void reference_step(at::Tensor& p, at::Tensor& m, at::Tensor& v, const at::Tensor& g, double lr, int64_t t,
                    const AdamWOptions& o, bool decay) {
  if (decay) p.mul_(1.0 - lr * o.weight_decay);
  m.mul_(o.beta1).add_(g, 1.0 - o.beta1);
  v.mul_(o.beta2).addcmul_(g, g, 1.0 - o.beta2);
  const double bc1 = 1.0 - std::pow(o.beta1, static_cast<double>(t));
  const double bc2 = 1.0 - std::pow(o.beta2, static_cast<double>(t));
  at::Tensor denom = (v / bc2).sqrt().add_(o.eps);
  p.addcdiv_(m, denom, -lr / bc1);
}

TEST(AdamW, MatchesTheTextbookUpdateWithGradScaleAndDecayOnMatrices) {
  AdamWOptions o;
  o.weight_decay = 0.1;
  at::Tensor w = at::randn({5, 7}, at::kFloat).requires_grad_(true);   // decayed (a matrix)
  at::Tensor b = at::randn({7}, at::kFloat).requires_grad_(true);      // not decayed
  at::Tensor wd = at::randn({3, 4}, at::kDouble).requires_grad_(true); // the ATen path
  std::vector<at::Tensor> ref = {w.detach().clone(), b.detach().clone(), wd.detach().clone()};
  std::vector<at::Tensor> m, v;
  for (auto& r : ref) m.push_back(at::zeros_like(r)), v.push_back(at::zeros_like(r));
  auto adam = adamw({w, b, wd}, o);
  const double scale = 0.25;
  for (int64_t t = 1; t <= 4; ++t) {
    std::vector<at::Tensor> params = {w, b, wd};
    for (size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = at::randn_like(params[i]).detach();
    adam->step(1e-2, scale, {w.grad(), b.grad(), wd.grad()}, t);
    for (size_t i = 0; i < params.size(); ++i) {
      at::Tensor g = params[i].grad() * scale;
      reference_step(ref[i], m[i], v[i], g, 1e-2, t, o, params[i].dim() >= 2);
      const double tol = params[i].scalar_type() == at::kDouble ? 1e-12 : 1e-6;
      EXPECT_TRUE(at::allclose(params[i].detach(), ref[i], tol, tol)) << "parameter " << i << " step " << t;
    }
  }
  // .grad is read, never changed; the state is two moments per tensor, by name
  EXPECT_EQ(adam->state_bytes(), 2 * (35 * 4 + 7 * 4 + 12 * 8));
  const auto state = adam->state();
  ASSERT_EQ(state.size(), 6u);
  EXPECT_EQ(state[0].name, "exp_avg");
  EXPECT_EQ(state[1].name, "exp_avg_sq");
  EXPECT_TRUE(at::allclose(state[2].tensor, m[1], 1e-6, 1e-6));
}

// Mixed precision: an fp32 master updated from a bf16 gradient equals the
// update from that gradient in fp32 (the optimizer upcasts, never rounds the state).
TEST(AdamW, UpdatesFp32MastersFromBf16Gradients) {
  AdamWOptions o;
  at::Tensor master = at::randn({4, 6}, at::kFloat);
  at::Tensor ref = master.clone(), m = at::zeros_like(ref), v = at::zeros_like(ref);
  auto adam = adamw({master}, o);
  for (int64_t t = 1; t <= 3; ++t) {
    at::Tensor g16 = at::randn({4, 6}, at::kFloat).to(at::kBFloat16);
    adam->step(1e-2, 0.5, {g16}, t);
    reference_step(ref, m, v, g16.to(at::kFloat) * 0.5, 1e-2, t, o, true);
    EXPECT_TRUE(at::allclose(master, ref, 1e-6, 1e-6)) << "step " << t;
  }
  EXPECT_EQ(master.scalar_type(), at::kFloat);
}

// PyTorch's SGD (buf = g on the first step, then momentum buf + (1 - dampening) g;
// Nesterov g + momentum buf), with decoupled decay on matrices.
TEST(Sgd, MomentumDampeningAndNesterovMatchTheFormula) {
  for (const bool nesterov : {false, true}) {
    const double momentum = 0.9, dampening = nesterov ? 0.0 : 0.1, wd = 0.05, lr = 0.1, scale = 0.5;
    at::Tensor w = at::randn({3, 5}, at::kFloat), b = at::randn({5}, at::kFloat);
    std::vector<at::Tensor> ref = {w.clone(), b.clone()}, buf(2);
    auto sgd = make("sgd", {{"momentum", momentum}, {"dampening", dampening}, {"nesterov", nesterov}}, {w, b}, wd);
    for (int64_t t = 1; t <= 4; ++t) {
      std::vector<at::Tensor> grads = {at::randn_like(w), at::randn_like(b)};
      sgd->step(lr, scale, grads, t);
      for (size_t i = 0; i < 2; ++i) {
        at::Tensor g = grads[i] * scale;
        if (i == 0) ref[i].mul_(1.0 - lr * wd);
        buf[i] = t == 1 ? g.clone() : buf[i] * momentum + g * (1.0 - dampening);
        ref[i].sub_((nesterov ? g + buf[i] * momentum : buf[i]) * lr);
      }
      EXPECT_TRUE(at::allclose(w, ref[0], 1e-6, 1e-6)) << "nesterov " << nesterov << " step " << t;
      EXPECT_TRUE(at::allclose(b, ref[1], 1e-6, 1e-6)) << "nesterov " << nesterov << " step " << t;
    }
    ASSERT_EQ(sgd->state().size(), 2u);
    EXPECT_EQ(sgd->state()[0].name, "momentum");
  }
  // Without momentum: p -= lr g, and no state.
  at::Tensor p = at::ones({4});
  auto plain = make("sgd", nlohmann::json::object(), {p}, 0.0);
  plain->step(0.5, 1.0, {at::full({4}, 2.0)}, 1);
  EXPECT_TRUE(at::allclose(p, at::zeros({4})));
  EXPECT_TRUE(plain->state().empty());
}

TEST(Sgd, UnknownAndContradictoryKeysAreRefusedByName) {
  at::Tensor p = at::ones({4});
  try {
    make("sgd", {{"momentun", 0.9}}, {p}, 0.0);
    FAIL() << "an unknown key was accepted";
  } catch (const smp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("optimizer.momentun: unknown key for the sgd optimizer (known: momentum, "
                                         "dampening, nesterov, l2, kernels)"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("optimizer 'sgd' (plugin 'smp_optim') create"), std::string::npos) << e.what();
  }
  EXPECT_THROW(make("sgd", {{"nesterov", true}}, {p}, 0.0), smp::Error);  // Nesterov needs momentum
  EXPECT_THROW(make("adamw", {{"beta1", 1.5}}, {p}, 0.0), smp::Error);
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
