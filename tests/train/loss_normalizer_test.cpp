// LossNormalizer: one mean over the step from per-sample means or from sums
// with counts, whatever the microbatching.
#include "graph/loss_normalizer.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

namespace {

using smp::LossNormalizer;
using smp::LossSums;
using Reduction = smp::ModelGraph::LossReduction;

TEST(LossNormalizer, MeanLossesWeighTheirSamples) {
  LossNormalizer n(Reduction::Mean, 4);
  EXPECT_EQ(n.seed(), 4.0);  // backward from 4 x the mean = the microbatch's sum
  LossSums s;
  n.add(s, at::scalar_tensor(2.0), {});
  n.add(s, at::scalar_tensor(3.0), {});
  EXPECT_DOUBLE_EQ(s.loss, 20.0);
  EXPECT_DOUBLE_EQ(s.items, 8.0);
  EXPECT_DOUBLE_EQ(LossNormalizer::mean(s), 2.5);
  EXPECT_DOUBLE_EQ(LossNormalizer::grad_scale(s), 1.0 / 8);
}

TEST(LossNormalizer, SumLossesAreDividedByTheStepsCount) {
  // Two microbatches of masked tokens: a sum of 10 over 2 tokens, 12 over 6.
  LossNormalizer n(Reduction::Sum, 4);
  EXPECT_EQ(n.seed(), 1.0);
  LossSums s;
  n.add(s, at::scalar_tensor(10.0), at::scalar_tensor(2.0));
  n.add(s, at::scalar_tensor(12.0), at::scalar_tensor(6.0));
  EXPECT_DOUBLE_EQ(LossNormalizer::mean(s), 22.0 / 8);  // the mean of means would be (5 + 2) / 2 = 3.5
  EXPECT_DOUBLE_EQ(LossNormalizer::grad_scale(s), 1.0 / 8);
  LossSums none;
  EXPECT_EQ(LossNormalizer::mean(none), 0.0);  // nothing counted: 0, not NaN
  EXPECT_EQ(LossNormalizer::grad_scale(none), 0.0);
}

}  // namespace
