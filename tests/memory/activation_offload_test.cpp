// Activation offload's mechanism on the CPU (the job config refuses
// memory.offload there; CUDA's streams and pinned copies run in the GPU check,
// CudaJobs.OffloadedActivationsEqualKeptOnes): checkpointed calls that keep
// their inputs in the offload's host copies give the same outputs and
// gradients as checkpointing alone, the host bytes are counted, a prefetch
// loads a slot back before its backward, and the originals are not held.
#include "memory/activation_checkpoint.h"
#include "memory/activation_offload.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

namespace {

struct Grads {
  at::Tensor out, x, w;
};

Grads run(smp::ActivationOffload* offload, int microbatches) {
  at::manual_seed(1);
  at::Tensor w = at::randn({8, 8}).requires_grad_(true);
  smp::ModuleCall call = [w](const std::vector<at::Tensor>& in) {
    at::manual_seed(7);
    return std::vector<at::Tensor>{at::dropout(in[0].matmul(w).tanh(), 0.3, true)};
  };
  at::Tensor x = at::randn({microbatches, 4, 8}).requires_grad_(true);
  std::vector<at::Tensor> losses;
  for (int mb = 0; mb < microbatches; ++mb) {
    at::Tensor h = x[mb] * 2;
    for (int layer = 0; layer < 3; ++layer)
      h = smp::checkpointed(call, {h}, offload ? offload->stash(mb, 0) : nullptr)[0];
    losses.push_back(h.pow(2).sum());
  }
  std::vector<at::Tensor> outs;
  for (int mb = microbatches - 1; mb >= 0; --mb) {
    if (offload && mb > 0) offload->prefetch(mb - 1, 0);  // the next backward's inputs, a horizon of 1
    torch::autograd::backward({losses[mb]});
    outs.push_back(losses[mb].detach());
  }
  return {at::stack(outs), x.grad(), w.grad()};
}

TEST(ActivationOffload, SameOutputsAndGradientsAsKeepingTheInputs) {
  smp::ActivationOffload offload(c10::Device(c10::kCPU), 1);
  Grads kept = run(nullptr, 3), off = run(&offload, 3);
  EXPECT_TRUE(at::equal(kept.out, off.out));
  EXPECT_TRUE(at::equal(kept.x, off.x)) << (kept.x - off.x).abs().max();
  EXPECT_TRUE(at::equal(kept.w, off.w)) << (kept.w - off.w).abs().max();
  EXPECT_EQ(offload.offloaded(), 9);  // 3 layers x 3 microbatches
  // All nine inputs (4 x 8 fp32) were in host memory at once, and all came back.
  EXPECT_EQ(offload.host_peak_bytes(), 9 * 4 * 8 * 4);
  EXPECT_EQ(offload.host_bytes(), 0);
}

TEST(ActivationOffload, KeepsACopyNotTheOriginalAndLoadsOnPrefetch) {
  for (bool offloaded : {false, true}) {
    smp::ActivationOffload offload(c10::Device(c10::kCPU), 2);
    at::Tensor w = at::randn({8, 8}).requires_grad_(true);
    smp::ModuleCall call = [w](const std::vector<at::Tensor>& in) {
      return std::vector<at::Tensor>{in[0].matmul(w)};
    };
    at::Tensor leaf = at::randn({4, 8}).requires_grad_(true);
    at::Tensor h = leaf * 1;  // an activation: a non-leaf the caller drops after forward
    c10::weak_intrusive_ptr<c10::TensorImpl> weak(h.getIntrusivePtr());
    const at::Tensor expected = h.detach().t().matmul(at::ones({4, 8}));
    at::Tensor y = smp::checkpointed(call, {h}, offloaded ? offload.stash(0, 0) : nullptr)[0];
    h.reset();
    // Checkpointing alone keeps the activation itself; offload keeps a host copy.
    EXPECT_EQ(weak.expired(), offloaded);
    EXPECT_EQ(offload.host_bytes(), offloaded ? 4 * 8 * 4 : 0);
    offload.prefetch(0, 0);
    offload.prefetch(0, 0);  // idempotent
    offload.prefetch(5, 1);  // nothing stashed there: nothing happens
    torch::autograd::backward({y.sum()});
    EXPECT_TRUE(at::allclose(w.grad(), expected));
    EXPECT_TRUE(at::allclose(leaf.grad(), at::ones({4, 8}).matmul(w.detach().t())));
    EXPECT_EQ(offload.host_bytes(), 0);
    offload.clear();
    EXPECT_EQ(offload.host_peak_bytes(), 0);
  }
}

TEST(ActivationOffload, RefusesAHorizonBelowOne) {
  EXPECT_THROW(smp::ActivationOffload(c10::Device(c10::kCPU), 0), std::exception);
}

}  // namespace
