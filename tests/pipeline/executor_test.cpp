// The Executor on one rank, over real smp_nn modules: a schedule's forwards and
// backwards accumulate the gradient of the summed loss (LossNormalizer's seed)
// and report the loss sums; checked against the same computation written
// directly in ATen, for a per-sample mean loss and for a masked sum.
#include <smp/model_graph.h>
#include "plugin/plugin_tables.h"
#include <smp/plugin_registry.h>
#include <smp/stage_plan.h>

#include "graph_node.h"
#include "pipeline/executor.h"
#include "schedule/schedule.h"
#include "plugin/module_instance.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

namespace {

using smp_test::node;

struct Outcome {
  smp::ExecutorResult result;
  at::Tensor weight, weight_grad, bias;
};

// x [4 per microbatch, 3] -> linear(3 -> 5) -> loss, M microbatches on one rank.
Outcome run(smp::PluginRegistry& reg, bool masked_sum, int microbatches, const at::Tensor& x, const at::Tensor& y) {
  smp::ModelGraph g;
  g.inputs = {"x", "y"};
  g.nodes.push_back(node("fc", "linear", R"({"in": 3, "out": 5})", {"x"}, {"h"}));
  if (masked_sum) {
    g.nodes.push_back(node("loss", "cross_entropy", R"({"reduction": "sum"})", {"h", "y"}, {"sum", "count"}));
    g.loss = "sum", g.loss_reduction = smp::ModelGraph::LossReduction::Sum, g.loss_count = "count";
  } else {
    g.nodes.push_back(node("loss", "mse_loss", "{}", {"h", "y"}, {"loss"}));
    g.loss = "loss";
  }
  const int64_t per_mb = x.size(0) / microbatches;
  smp::StagePlan plan = smp::StagePlan::build(g, {0, 0}, 1, 1);
  std::map<std::string, std::shared_ptr<smp::ModuleInstance>> modules;
  const std::string none = "{}";
  for (const auto& n : g.nodes)
    modules[n.name] = std::make_shared<smp::ModuleInstance>(smp::PluginTables(reg).module_kind(n.kind), reg.provider(n.kind), n.name,
                                                            n.config_json, smp::module_context(n.name, 7, nullptr, none));
  smp::LossNormalizer loss(g.loss_reduction, per_mb);
  smp::ExecutorSetup setup;
  setup.graph = &g;
  setup.plan = &plan;
  setup.modules = &modules;
  setup.loss = &loss;
  setup.batch = [&](int64_t, int mb, bool) {
    return std::vector<at::Tensor>{x.narrow(0, mb * per_mb, per_mb), y.narrow(0, mb * per_mb, per_mb)};
  };
  smp::Executor ex(setup);
  Outcome r;
  r.result = ex.run(smp::make_schedule("1f1b", 1, microbatches), 0, true);
  for (const auto& p : modules.at("fc")->parameters())
    if (p.name == "fc.weight") r.weight = p.tensor, r.weight_grad = p.tensor.grad().clone();
    else if (p.name == "fc.bias") r.bias = p.tensor.detach().clone();
  return r;
}

struct ExecutorTest : ::testing::Test {
  smp::PluginRegistry reg;
  void SetUp() override { reg.load("smp_nn"); }
};

TEST_F(ExecutorTest, MeanLossAccumulatesTheGradientOfTheSummedLoss) {
  at::Tensor x = at::randn({8, 3}), y = at::randn({8, 5});
  Outcome r = run(reg, false, 4, x, y);
  EXPECT_EQ(r.result.losses, 4);
  // Reference: sum over microbatches of (samples x per-sample-mean loss).
  at::Tensor w = r.weight.detach().clone().requires_grad_(true);
  at::Tensor ref = at::zeros({});
  double loss_sum = 0;
  for (int mb = 0; mb < 4; ++mb) {
    at::Tensor h = at::linear(x.narrow(0, 2 * mb, 2), w, r.bias);
    at::Tensor l = at::mse_loss(h, y.narrow(0, 2 * mb, 2));
    loss_sum += 2 * l.item<double>();
    ref = ref + 2 * l;
  }
  ref.backward();
  EXPECT_NEAR(r.result.loss.loss, loss_sum, 1e-4);
  EXPECT_EQ(r.result.loss.items, 8.0);
  EXPECT_TRUE(at::allclose(r.weight_grad, w.grad(), 1e-4, 1e-5));
}

TEST_F(ExecutorTest, MaskedSumLossCountsItsTokens) {
  at::Tensor x = at::randn({8, 3});
  at::Tensor y = at::randint(5, {8}, at::kLong);
  y[1] = -100, y[2] = -100, y[6] = -100;  // microbatches of 2 hold 1, 1, 2, 1 counted tokens
  Outcome r = run(reg, true, 4, x, y);
  at::Tensor w = r.weight.detach().clone().requires_grad_(true);
  at::Tensor ref = at::cross_entropy_loss(at::linear(x, w, r.bias), y, {}, at::Reduction::Sum, -100);
  ref.backward();
  EXPECT_NEAR(r.result.loss.loss, ref.item<double>(), 1e-4);
  EXPECT_EQ(r.result.loss.items, 5.0);
  EXPECT_TRUE(at::allclose(r.weight_grad, w.grad(), 1e-4, 1e-5));
}

}  // namespace
