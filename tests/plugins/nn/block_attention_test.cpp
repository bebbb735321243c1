// The blockwise attention of context parallelism (smp_nn/block_attention.hpp)
// against whole attention: each rank's queries (its two load-balanced chunks)
// over every rank's key/value block, in ring order, merged by log-sum-exp,
// give whole attention's output and, through autograd, its gradients, for
// causal and non-causal masks, several sequence lengths and cp 1, 2 and 4.
#include <smp_nn/block_attention.hpp>

#include <gtest/gtest.h>

#include "plugins/nn/whole_attention.h"

#include <cmath>
#include <limits>
#include <vector>

namespace {

using at::Tensor;

using smp_test::whole_attention;

struct Case {
  int64_t seq;
  int64_t cp;
  bool causal;
};

// Each rank's output, merged over the ring's blocks, scattered back to the
// tokens' positions.
Tensor ring_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Case& c, double scale) {
  std::vector<Tensor> positions;
  for (int64_t r = 0; r < c.cp; ++r) positions.push_back(smp_nn::context_parallel_positions(c.seq, c.cp, r, "parallel.cp"));
  Tensor out = at::zeros_like(q);
  for (int64_t r = 0; r < c.cp; ++r) {
    const Tensor qr = q.index_select(2, positions[r]);
    smp_nn::BlockAttention acc;
    for (int64_t step = 0; step < c.cp; ++step) {  // the ring: the block of rank r - step arrives at step
      const int64_t from = ((r - step) % c.cp + c.cp) % c.cp;
      const smp_nn::BlockAttention b =
          smp_nn::block_attention(qr, k.index_select(2, positions[from]), v.index_select(2, positions[from]),
                                  positions[r], positions[from], c.causal, scale);
      acc = step == 0 ? b : smp_nn::merge(acc, b);
    }
    out = out.index_copy(2, positions[r], acc.out);
  }
  return out;
}

TEST(BlockAttention, TheRingOfBlocksGivesWholeAttentionAndItsGradients) {
  const std::vector<Case> cases = {{8, 1, true},  {8, 2, true},  {8, 4, true},  {24, 2, true}, {24, 3, true},
                                   {16, 4, false}, {12, 2, false}, {32, 4, true}};
  for (const Case& c : cases) {
    SCOPED_TRACE("seq " + std::to_string(c.seq) + " cp " + std::to_string(c.cp) + (c.causal ? " causal" : " full"));
    at::manual_seed(17);
    const int64_t b = 2, h = 3, d = 8;
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    const Tensor q0 = at::randn({b, h, c.seq, d}, at::kDouble), k0 = at::randn({b, h, c.seq, d}, at::kDouble),
                 v0 = at::randn({b, h, c.seq, d}, at::kDouble), g = at::randn({b, h, c.seq, d}, at::kDouble);
    const Tensor q1 = q0.clone().requires_grad_(), k1 = k0.clone().requires_grad_(), v1 = v0.clone().requires_grad_();
    const Tensor q2 = q0.clone().requires_grad_(), k2 = k0.clone().requires_grad_(), v2 = v0.clone().requires_grad_();
    const Tensor whole = whole_attention(q1, k1, v1, c.causal, scale);
    const Tensor ring = ring_attention(q2, k2, v2, c, scale);
    (whole * g).sum().backward();
    (ring * g).sum().backward();
    // Double precision: the two orders of summation agree to rounding.
    EXPECT_LT((ring - whole).abs().max().item<double>(), 1e-12);
    EXPECT_LT((q2.grad() - q1.grad()).abs().max().item<double>(), 1e-12);
    EXPECT_LT((k2.grad() - k1.grad()).abs().max().item<double>(), 1e-12);
    EXPECT_LT((v2.grad() - v1.grad()).abs().max().item<double>(), 1e-12);
    EXPECT_FALSE(ring.isnan().any().item<bool>());
  }
}

// A block that hides every key from some query (the causal mask, a later
// block) leaves that query's merged result untouched, NaN-free.
TEST(BlockAttention, ABlockThatHidesEveryKeyChangesNothing) {
  at::manual_seed(3);
  const Tensor q = at::randn({1, 1, 2, 4}), k = at::randn({1, 1, 2, 4}), v = at::randn({1, 1, 2, 4});
  const Tensor early = at::arange(0, 2, at::kLong), late = at::arange(2, 4, at::kLong);
  const smp_nn::BlockAttention seen = smp_nn::block_attention(q, k, v, early, early, true, 0.5);
  const smp_nn::BlockAttention hidden = smp_nn::block_attention(q, k, v, early, late, true, 0.5);
  EXPECT_TRUE(at::isinf(hidden.lse).all().item<bool>());
  EXPECT_EQ(hidden.out.abs().max().item<float>(), 0.0f);
  const smp_nn::BlockAttention merged = smp_nn::merge(seen, hidden);
  EXPECT_TRUE(at::allclose(merged.out, seen.out));
  EXPECT_TRUE(at::allclose(merged.lse, seen.lse));
  const smp_nn::BlockAttention none = smp_nn::merge(hidden, hidden);
  EXPECT_FALSE(none.out.isnan().any().item<bool>());
}

// The load-balanced split: rank r holds chunks r and 2 cp - 1 - r; every
// position exactly once over the ranks; a sequence that does not cut into
// 2 cp chunks is refused naming the key.
TEST(BlockAttention, TheLoadBalancedSplitCoversEveryPositionOnce) {
  const Tensor r0 = smp_nn::context_parallel_positions(8, 2, 0, "parallel.cp");
  const Tensor r1 = smp_nn::context_parallel_positions(8, 2, 1, "parallel.cp");
  EXPECT_TRUE(at::equal(r0, at::tensor({0, 1, 6, 7}, at::kLong)));
  EXPECT_TRUE(at::equal(r1, at::tensor({2, 3, 4, 5}, at::kLong)));
  EXPECT_TRUE(at::equal(std::get<0>(at::cat({r0, r1}).sort()), at::arange(8, at::kLong)));
  try {
    smp_nn::context_parallel_positions(12, 4, 0, "parallel.cp");
    FAIL() << "a sequence of 12 at cp 4 was accepted";
  } catch (const smp::sdk::Error& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.cp = 4: the sequence of 12 tokens does not cut into 2 x 4 = 8"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
