// Activation checkpointing of a call: the same gradients as the plain call
// (inputs and parameters), and the same random draws when the call is seeded.
#include "memory/activation_checkpoint.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

namespace {

struct Grads {
  at::Tensor out, x, w;
};

Grads run(bool checkpoint, int chained) {
  at::manual_seed(1);
  at::Tensor w = at::randn({8, 8}).requires_grad_(true);
  at::Tensor x = at::randn({4, 8}).requires_grad_(true);
  // Dropout seeded per call, as the executor seeds module calls.
  smp::ModuleCall call = [w](const std::vector<at::Tensor>& in) {
    at::manual_seed(7);
    return std::vector<at::Tensor>{at::dropout(in[0].matmul(w).tanh(), 0.3, true)};
  };
  at::Tensor h = x * 2;
  for (int i = 0; i < chained; ++i) h = checkpoint ? smp::checkpointed(call, {h})[0] : call({h})[0];
  torch::autograd::backward({h.pow(2).sum()});
  return {h.detach(), x.grad(), w.grad()};
}

TEST(ActivationCheckpoint, SameOutputsAndGradientsAsThePlainCall) {
  for (int chained : {1, 3}) {
    Grads plain = run(false, chained), ckpt = run(true, chained);
    EXPECT_TRUE(at::equal(plain.out, ckpt.out)) << chained;
    ASSERT_TRUE(ckpt.x.defined()) << chained;
    ASSERT_TRUE(ckpt.w.defined()) << chained;
    EXPECT_TRUE(at::equal(plain.x, ckpt.x)) << chained << "\n" << (plain.x - ckpt.x).abs().max();
    EXPECT_TRUE(at::equal(plain.w, ckpt.w)) << chained << "\n" << (plain.w - ckpt.w).abs().max();
  }
}

}  // namespace
