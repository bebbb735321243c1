// The zero-bubble backward split (core/src/pipeline/backward_split.cpp): its
// input pass and weight pass together give exactly one ordinary backward's
// gradients, and the weight pass runs none of the input pass's work again.

#include "pipeline/backward_split.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <functional>

namespace smp {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// y = 2x, counting its backward calls: it sits on the path from the loss to
// the stage input, so an input pass runs it and a weight pass must not.
int scale_backward_calls = 0;
struct CountingScale : torch::autograd::Function<CountingScale> {
  static at::Tensor forward(AutogradContext*, const at::Tensor& x) { return x * 2; }
  static variable_list backward(AutogradContext*, variable_list g) {
    ++scale_backward_calls;
    return {g[0] * 2};
  }
};

struct Params {
  std::vector<at::Tensor> all;
  at::Tensor w1, b1, gamma, beta, w2;
};

Params make_params() {
  at::manual_seed(7);
  Params p;
  p.w1 = at::randn({16, 8}).requires_grad_(true);
  p.b1 = at::randn({16}).requires_grad_(true);
  p.gamma = at::randn({16}).requires_grad_(true);
  p.beta = at::randn({16}).requires_grad_(true);
  p.w2 = at::randn({16, 16}).requires_grad_(true);
  p.all = {p.w1, p.b1, p.gamma, p.beta, p.w2};
  return p;
}

// A stage: input x [4, 8] -> linear -> gelu -> scale -> layer norm -> linear
// -> the same linear again (a weight used twice) -> output [4, 16].
at::Tensor stage(const Params& p, const at::Tensor& x) {
  at::Tensor h = at::gelu(at::linear(x, p.w1, p.b1));
  h = CountingScale::apply(h);
  h = at::layer_norm(h, {16}, p.gamma, p.beta);
  h = at::linear(h, p.w2);
  return at::linear(at::tanh(h), p.w2);
}

struct Grads {
  at::Tensor input;
  std::vector<at::Tensor> params;
};

// Runs `body` on fresh parameters and input, returns the gradients.
Grads run(const std::function<at::Tensor(const std::vector<at::Tensor>& roots, const std::vector<at::Tensor>& grads,
                                         const at::Tensor& x)>& body,
          bool extra_root = false) {
  Params p = make_params();
  at::Tensor x = at::randn({4, 8}).requires_grad_(true);
  at::Tensor y = stage(p, x);
  std::vector<at::Tensor> roots{y}, grads{at::randn({4, 16})};
  if (extra_root) {  // a root that reaches parameters only (an auxiliary loss on a weight)
    roots.push_back((p.w2 * p.w2).sum());
    grads.push_back(at::full({}, 0.5));
  }
  Grads out;
  out.input = body(roots, grads, x);
  for (const auto& t : p.all) out.params.push_back(t.grad());
  return out;
}

at::Tensor full_backward(const std::vector<at::Tensor>& roots, const std::vector<at::Tensor>& grads,
                         const at::Tensor& x) {
  torch::autograd::backward(roots, grads);
  return x.grad();
}

void expect_same(const Grads& a, const Grads& b) {
  ASSERT_TRUE(a.input.defined() && b.input.defined());
  EXPECT_TRUE(at::allclose(a.input, b.input, 1e-6, 1e-6)) << (a.input - b.input).abs().max().item<float>();
  ASSERT_EQ(a.params.size(), b.params.size());
  for (size_t i = 0; i < a.params.size(); ++i) {
    ASSERT_TRUE(a.params[i].defined() && b.params[i].defined()) << "parameter " << i;
    EXPECT_TRUE(at::allclose(a.params[i], b.params[i], 1e-6, 1e-6))
        << "parameter " << i << ": " << (a.params[i] - b.params[i]).abs().max().item<float>();
  }
}

TEST(BackwardSplit, InputThenWeightPassEqualsOneBackward) {
  for (bool extra_root : {false, true}) {
    SCOPED_TRACE(extra_root ? "with a parameter-only root" : "one root");
    const Grads reference = run(full_backward, extra_root);
    BackwardSplit::Stats stats;
    const Grads split = run(
        [&](const std::vector<at::Tensor>& roots, const std::vector<at::Tensor>& grads, const at::Tensor& x) {
          BackwardSplit s;
          at::Tensor gx = s.input_pass(roots, grads, {x})[0];
          EXPECT_FALSE(x.grad().defined());  // returned, not accumulated
          s.weight_pass();
          stats = s.stats();
          return gx;
        },
        extra_root);
    expect_same(reference, split);
    EXPECT_GT(stats.frontier_nodes, 0);
    EXPECT_GT(stats.released_nodes, 0);  // the input side's saved tensors were freed after the input pass
    EXPECT_GT(stats.weight_roots, 0);
  }
}

TEST(BackwardSplit, InputPassLeavesParameterGradientsAlone) {
  Params p = make_params();
  at::Tensor x = at::randn({4, 8}).requires_grad_(true);
  at::Tensor y = stage(p, x);
  BackwardSplit s;
  auto gx = s.input_pass({y}, {at::ones_like(y)}, {x});
  ASSERT_TRUE(gx[0].defined());
  for (const auto& t : p.all) EXPECT_FALSE(t.grad().defined());
  s.weight_pass();
  for (const auto& t : p.all) EXPECT_TRUE(t.grad().defined());
}

// The point of the split: a node between the loss and the stage input runs
// once over both passes (a weight pass that started again from the loss, as
// autograd::backward(inputs = parameters) does, would run it twice).
TEST(BackwardSplit, WeightPassRunsNothingOfTheInputPassAgain) {
  scale_backward_calls = 0;
  run(full_backward);
  EXPECT_EQ(scale_backward_calls, 1);

  scale_backward_calls = 0;
  run([](const std::vector<at::Tensor>& roots, const std::vector<at::Tensor>& grads, const at::Tensor& x) {
    BackwardSplit s;
    at::Tensor gx = s.input_pass(roots, grads, {x})[0];
    EXPECT_EQ(scale_backward_calls, 1);
    s.weight_pass();
    return gx;
  });
  EXPECT_EQ(scale_backward_calls, 1);

  // What the executor did before the split: autograd::grad for the input,
  // then autograd::backward from the root again with the parameters as inputs.
  scale_backward_calls = 0;
  Params p = make_params();
  at::Tensor x = at::randn({4, 8}).requires_grad_(true);
  at::Tensor y = stage(p, x);
  at::Tensor g = at::randn({4, 16});
  torch::autograd::grad({y}, {x}, {g}, /*retain_graph=*/true);
  torch::autograd::backward({y}, {g}, false, false, p.all);
  EXPECT_EQ(scale_backward_calls, 2);
}

// A first stage: no received input, so there is no input gradient to compute:
// the input pass leaves every gradient alone and the weight pass runs the whole
// backward (the ZB-H1 plan schedules that stage's BW as its whole backward).
TEST(BackwardSplit, WithoutInputsTheWeightPassIsTheWholeBackward) {
  auto no_input = [](bool split) {
    Params p = make_params();
    at::Tensor x = at::randn({4, 8});  // data, not a received activation
    at::Tensor y = stage(p, x);
    at::Tensor g = at::randn({4, 16});
    if (split) {
      BackwardSplit s;
      EXPECT_TRUE(s.input_pass({y}, {g}, {}).empty());
      EXPECT_TRUE(s.stats().whole_in_weight_pass);
      for (const auto& t : p.all) EXPECT_FALSE(t.grad().defined());
      s.weight_pass();
      for (const auto& t : p.all) EXPECT_TRUE(t.grad().defined());
    } else {
      torch::autograd::backward({y}, {g});
    }
    std::vector<at::Tensor> out;
    for (const auto& t : p.all) out.push_back(t.grad());
    return out;
  };
  auto a = no_input(false), b = no_input(true);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(at::allclose(a[i], b[i], 1e-6, 1e-6)) << "parameter " << i;
}

TEST(BackwardSplit, PassesOutOfOrderAreAnError) {
  BackwardSplit s;
  EXPECT_ANY_THROW(s.weight_pass());
}

}  // namespace
}  // namespace smp
