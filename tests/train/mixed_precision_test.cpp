// Mixed precision's pieces: the dynamic loss scale (back off on overflow, never below
// the minimum, grow after a window of good steps, a bad step restarts the window) and
// the fp32 master weights (the parameter becomes the compute dtype in place, the master
// keeps fp32, copy_to_params rounds the master into the parameter).
#include "optim/mixed_precision.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

namespace {

smp::LossScaleOptions opts(double initial, double min, int64_t window) {
  smp::LossScaleOptions o;
  o.initial = initial;
  o.min = min;
  o.window = window;
  return o;
}

TEST(DynamicLossScaler, OverflowSkipsTheStepAndHalvesTheScale) {
  smp::DynamicLossScaler s(opts(1024, 1, 1000));
  EXPECT_TRUE(s.update(true));
  EXPECT_EQ(s.scale(), 1024);
  EXPECT_FALSE(s.update(false));
  EXPECT_EQ(s.scale(), 512);
  EXPECT_FALSE(s.update(false));
  EXPECT_EQ(s.scale(), 256);
  EXPECT_EQ(s.skipped(), 2);
}

TEST(DynamicLossScaler, NeverBacksOffBelowTheMinimum) {
  smp::DynamicLossScaler s(opts(4, 2, 1000));
  EXPECT_FALSE(s.update(false));
  EXPECT_EQ(s.scale(), 2);
  EXPECT_FALSE(s.update(false));
  EXPECT_EQ(s.scale(), 2);
  EXPECT_EQ(s.skipped(), 2);
}

TEST(DynamicLossScaler, GrowsAfterAWindowOfGoodStepsAndAnOverflowRestartsIt) {
  smp::DynamicLossScaler s(opts(8, 1, 3));
  s.update(true);
  s.update(true);
  EXPECT_EQ(s.scale(), 8);
  s.update(true);
  EXPECT_EQ(s.scale(), 16);  // third good step in a row
  s.update(true);
  s.update(true);
  s.update(false);  // 8: the window restarts
  EXPECT_EQ(s.scale(), 8);
  s.update(true);
  s.update(true);
  EXPECT_EQ(s.scale(), 8);
  s.update(true);
  EXPECT_EQ(s.scale(), 16);
}

TEST(MasterWeights, ParametersBecomeTheComputeDtypeMastersStayFp32) {
  at::Tensor p = at::tensor({1.0f + 1.0f / 1024, -3.0f, 0.1f}).requires_grad_(true);
  const at::Tensor before = p.detach().clone();
  smp::MasterWeights mw({p}, at::kBFloat16);
  EXPECT_EQ(p.scalar_type(), at::kBFloat16);
  EXPECT_TRUE(p.requires_grad());
  ASSERT_EQ(mw.masters().size(), 1u);
  EXPECT_EQ(mw.masters()[0].scalar_type(), at::kFloat);
  EXPECT_TRUE(at::equal(mw.masters()[0], before));  // exact: not rounded through bf16
  EXPECT_EQ(mw.bytes(), 3 * 4);
  // An update smaller than bf16's resolution at 1.0 survives in the master.
  mw.masters()[0].add_(at::full({3}, 1.0f / 1024));
  mw.copy_to_params();
  EXPECT_FLOAT_EQ(mw.masters()[0][0].item<float>(), 1.0f + 2.0f / 1024);
  EXPECT_FLOAT_EQ(p[0].item<float>(), at::tensor({1.0f + 2.0f / 1024}).to(at::kBFloat16).item<float>());
}

TEST(MasterWeights, ComputeDtypeOfEachPrecision) {
  EXPECT_EQ(smp::compute_dtype(smp::Precision::Fp32), at::kFloat);
  EXPECT_EQ(smp::compute_dtype(smp::Precision::Bf16), at::kBFloat16);
  EXPECT_EQ(smp::compute_dtype(smp::Precision::Fp16), at::kHalf);
}

}  // namespace
