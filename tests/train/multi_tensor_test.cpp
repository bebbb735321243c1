// The optimizers' multi-tensor paths (smp_optim's [optimizer] kernels, used on
// CUDA) and the multi-tensor gradient norm, on the CPU where LibTorch has the
// same kernels: _foreach_* everywhere (1.13 too), the fused AdamW / SGD kernels
// from 2.4. The foreach path is the per-tensor ATen formula with each op over
// a group of tensors, so on the CPU it equals the per-tensor path bit for bit;
// the fused kernels compute the same update in another order (bounds a few
// times what was measured on 2.11: 2.4e-7 for AdamW, 1.2e-7 for SGD, after 5
// steps of unit-scale parameters; the foreach paths were 0 there too, run from
// this plugin's sources built against pip torch 2.11 by hand). Gradients are
// read, never written (the ABI's "read only"), whatever the path.
#include <smp/error.h>
#include <smp/plugin_registry.h>

#include "optim/grad_norm.h"
#include "plugin/optimizer_instance.h"
#include "train/smp_optim_instance.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/version.h>

#include <cmath>
#include <memory>

namespace {

constexpr bool kFusedOnCpu = TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4);

using smp_test::make;

// The textbook AdamW step (decoupled decay) in ATen ops, for one parameter: the per-tensor path's formula.
void reference_step(at::Tensor& p, at::Tensor& m, at::Tensor& v, const at::Tensor& g, double lr, int64_t t,
                    bool decay) {
  const double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, wd = 0.1;
  if (decay) p.mul_(1.0 - lr * wd);
  m.mul_(beta1).add_(g, 1.0 - beta1);
  v.mul_(beta2).addcmul_(g, g, 1.0 - beta2);
  const double bc1 = 1.0 - std::pow(beta1, static_cast<double>(t));
  const double bc2 = 1.0 - std::pow(beta2, static_cast<double>(t));
  at::Tensor denom = v.div(bc2).sqrt_().add_(eps);
  p.addcdiv_(m, denom, -lr / bc1);
}

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

// AdamW through `kernels` against the textbook update over 5 steps: float and
// double tensors, matrices decayed, a bf16 gradient of an fp32 tensor, scales
// 0.25 and 1. Returns the largest difference; the gradients are unchanged.
double adamw_against_textbook(const std::string& kernels) {
  at::manual_seed(7);
  std::vector<at::Tensor> params = {at::randn({5, 7}), at::randn({7}), at::randn({3, 4}, at::kDouble),
                                    at::randn({300, 70}), at::randn({6, 2})};
  std::vector<at::Tensor> ref, m, v;
  for (auto& p : params) ref.push_back(p.clone()), m.push_back(at::zeros_like(p)), v.push_back(at::zeros_like(p));
  auto adam = make("adamw", {{"beta1", 0.9}, {"beta2", 0.95}, {"eps", 1e-8}, {"kernels", kernels}}, params, 0.1);
  double worst = 0;
  for (int64_t t = 1; t <= 5; ++t) {
    const double scale = t % 2 ? 0.25 : 1.0;
    std::vector<at::Tensor> grads;
    for (auto& p : params) grads.push_back(at::randn_like(p));
    grads[4] = grads[4].to(at::kBFloat16);  // a 16-bit gradient of an fp32 master
    std::vector<at::Tensor> before;
    for (auto& g : grads) before.push_back(g.clone());
    adam->step(1e-2, scale, grads, t);
    for (size_t i = 0; i < params.size(); ++i) {
      EXPECT_TRUE(at::equal(grads[i], before[i])) << kernels << ": gradient " << i << " written at step " << t;
      at::Tensor g = grads[i].to(params[i].scalar_type()).mul(scale);
      reference_step(ref[i], m[i], v[i], g, 1e-2, t, params[i].dim() >= 2);
      worst = std::max(worst, max_abs_diff(params[i], ref[i]));
    }
  }
  return worst;
}

TEST(MultiTensorAdamW, ForeachEqualsThePerTensorFormulaBitwise) {
  EXPECT_EQ(adamw_against_textbook("foreach"), 0.0);
}

TEST(MultiTensorAdamW, FusedIsWithinRoundingOfThePerTensorFormula) {
  if (!kFusedOnCpu) {
    // Refused by name where the LibTorch has no fused CPU kernel.
    try {
      adamw_against_textbook("fused");
      FAIL() << "kernels = fused was accepted on the CPU of LibTorch " << TORCH_VERSION;
    } catch (const smp::Error& e) {
      EXPECT_NE(std::string(e.what()).find("optimizer.kernels = \"fused\": LibTorch"), std::string::npos) << e.what();
    }
    GTEST_SKIP() << "LibTorch " << TORCH_VERSION << " has no fused AdamW kernel for the CPU (2.4 and later)";
  }
  EXPECT_LT(adamw_against_textbook("fused"), 1e-6);  // 2.4e-7 measured (2.11)
}

// "auto" on the CPU keeps the CPU's kernels: the same bits as "per_tensor".
TEST(MultiTensorAdamW, AutoOnTheCpuIsThePerTensorPath) {
  at::manual_seed(3);
  std::vector<at::Tensor> a = {at::randn({8, 9}), at::randn({9}, at::kDouble)};
  std::vector<at::Tensor> b = {a[0].clone(), a[1].clone()};
  auto auto_k = make("adamw", {{"kernels", "auto"}}, a, 0.1);
  auto per_k = make("adamw", {{"kernels", "per_tensor"}}, b, 0.1);
  for (int64_t t = 1; t <= 3; ++t) {
    std::vector<at::Tensor> g = {at::randn({8, 9}), at::randn({9}, at::kDouble)};
    auto_k->step(1e-2, 0.5, g, t);
    per_k->step(1e-2, 0.5, g, t);
  }
  EXPECT_TRUE(at::equal(a[0], b[0]));
  EXPECT_TRUE(at::equal(a[1], b[1]));
}

TEST(MultiTensorAdamW, UnknownKernelsAreRefusedByName) {
  try {
    make("adamw", {{"kernels", "apex"}}, {at::ones({2})}, 0.0);
    FAIL() << "kernels = apex was accepted";
  } catch (const smp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("optimizer.kernels: expected \"auto\", \"per_tensor\", \"foreach\" or "
                                         "\"fused\", got \"apex\""),
              std::string::npos)
        << e.what();
  }
}

// SGD through `kernels` against "per_tensor" over 4 steps: momentum 0, with
// dampening, Nesterov; decay on matrices; scales 0.5 and 1; a bf16 gradient.
double sgd_against_per_tensor(const std::string& kernels, const nlohmann::json& config) {
  at::manual_seed(11);
  std::vector<at::Tensor> a = {at::randn({4, 6}), at::randn({6}), at::randn({3, 3}, at::kDouble), at::randn({5, 2})};
  std::vector<at::Tensor> b;
  for (auto& p : a) b.push_back(p.clone());
  nlohmann::json with = config, per = config;
  with["kernels"] = kernels;
  per["kernels"] = "per_tensor";
  auto multi = make("sgd", with, a, 0.05), single = make("sgd", per, b, 0.05);
  double worst = 0;
  for (int64_t t = 1; t <= 4; ++t) {
    const double scale = t % 2 ? 0.5 : 1.0;
    std::vector<at::Tensor> grads;
    for (auto& p : a) grads.push_back(at::randn_like(p));
    grads[3] = grads[3].to(at::kBFloat16);
    std::vector<at::Tensor> before;
    for (auto& g : grads) before.push_back(g.clone());
    multi->step(0.1, scale, grads, t);
    single->step(0.1, scale, grads, t);
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_TRUE(at::equal(grads[i], before[i])) << kernels << ": gradient " << i << " written at step " << t;
      worst = std::max(worst, max_abs_diff(a[i], b[i]));
    }
  }
  return worst;
}

const std::vector<nlohmann::json>& sgd_configs() {
  static const std::vector<nlohmann::json> c = {
      nlohmann::json::object(),
      {{"momentum", 0.9}, {"dampening", 0.1}},
      {{"momentum", 0.9}, {"nesterov", true}},
  };
  return c;
}

TEST(MultiTensorSgd, ForeachEqualsThePerTensorPathBitwise) {
  for (const auto& config : sgd_configs()) EXPECT_EQ(sgd_against_per_tensor("foreach", config), 0.0) << config.dump();
}

TEST(MultiTensorSgd, FusedIsWithinRoundingOfThePerTensorPath) {
  if (!kFusedOnCpu) GTEST_SKIP() << "LibTorch " << TORCH_VERSION << " has no fused SGD kernel for the CPU (2.4 and later)";
  for (const auto& config : sgd_configs())
    EXPECT_LT(sgd_against_per_tensor("fused", config), 1e-6) << config.dump();  // 1.2e-7 measured (2.11)
}

// The gradient norm: one _foreach_norm per dtype equals a norm kernel per
// gradient bit for bit (per gradient the same reduction on the CPU, summed
// in the parameters' order whatever the grouping); "auto" on the CPU sums fp32
// gradients in double: all three within fp32 rounding of the sum in double.
TEST(MultiTensorNorm, ForeachNormEqualsThePerTensorNormsBitwise) {
  at::manual_seed(5);
  std::vector<at::Tensor> grads = {at::randn({70, 300}), at::randn({300}).to(at::kBFloat16), at::randn({5, 7}),
                                   at::Tensor(), at::randn({100000}), at::randn({33}).to(at::kBFloat16),
                                   at::randn({9, 9})};
  std::vector<bool> counted = {true, true, true, true, true, true, false};
  const double per = smp::squared_norm(grads, counted, smp::NormKernels::PerTensor);
  const double multi = smp::squared_norm(grads, counted, smp::NormKernels::MultiTensor);
  EXPECT_EQ(multi, per);
  const double automatic = smp::squared_norm(grads, counted, smp::NormKernels::Auto);
  EXPECT_NEAR(automatic, per, 2e-6 * per);
  double expect = 0;  // the definition, in double
  for (size_t k = 0; k < grads.size(); ++k)
    if (counted[k] && grads[k].defined()) expect += grads[k].to(at::kDouble).pow(2).sum().item<double>();
  // Relative to the sum in double, measured: auto 1.3e-10 (1.13 and 2.11);
  // the fp32 norms 4.1e-7 on 2.11 (its fp32 reduction), less on 1.13.
  EXPECT_NEAR(automatic, expect, 1e-6 * expect);
  EXPECT_NEAR(multi, expect, 2e-6 * expect);
  EXPECT_EQ(smp::squared_norm({at::Tensor()}, {true}, smp::NormKernels::MultiTensor), 0.0);
}

}  // namespace
