// Rules per mesh axis rewrite the graph: with the standard plugins loaded, "tp"
// rules turn the smp_nn kinds into smp_tp's; a config that does not split
// names the node, the axis and the rule's plugin (or stays replicated when
// asked); tied nodes get one decision; an axis without rules changes nothing.
// Also the loss declarations the graph validates (mean; sum with its count).
#include "graph/parallel_rules.h"
#include "plugin/plugin_tables.h"

#include <smp/error.h>
#include <smp/model_graph.h>
#include <smp/plugin_registry.h>

#include <gtest/gtest.h>

#include "graph_node.h"

namespace {

using smp_test::node;

smp::ModelGraph small_model(int heads) {
  smp::ModelGraph g;
  g.inputs = {"ids", "targets"};
  g.nodes = {node("wte", "embedding", R"({"num": 16, "dim": 8})", {"ids"}, {"h0"}, "wte"),
             node("attn", "attention", R"({"hidden": 12, "heads": )" + std::to_string(heads) + "}", {"h0"}, {"h1"}),
             node("act", "relu", "{}", {"h1"}, {"h2"}),
             node("head", "embedding", R"({"num": 16, "dim": 8})", {"h2"}, {"logits"}, "wte"),
             node("loss", "cross_entropy", "{}", {"logits", "targets"}, {"loss"})};
  g.loss = "loss";
  return g;
}

struct Rules : ::testing::Test {
  smp::PluginRegistry reg;
  void SetUp() override {
    reg.load("smp_nn");
    reg.load("smp_tp");
  }
};

TEST_F(Rules, TpRulesSwapKindsAndTiedNodesStayOneModule) {
  smp::ModelGraph g = small_model(4);
  smp::apply_parallel_rules(g, reg, "tp", 2, false);
  EXPECT_EQ(g.nodes[0].kind, "vocab_parallel_embedding");
  EXPECT_EQ(g.nodes[1].kind, "parallel_attention");
  EXPECT_EQ(g.nodes[2].kind, "relu");  // no rule: replicated
  EXPECT_EQ(g.nodes[3].kind, g.nodes[0].kind);
  EXPECT_EQ(g.nodes[4].kind, "vocab_parallel_cross_entropy");
  ASSERT_NE(smp::PluginTables(reg).rule("tp", "linear"), nullptr);
  EXPECT_EQ(smp::PluginTables(reg).rule("ep", "linear"), nullptr);
}

TEST_F(Rules, AnAxisWithoutRulesChangesNothing) {
  smp::ModelGraph g = small_model(4);
  smp::apply_parallel_rules(g, reg, "ep", 2, false);
  for (const auto& n : g.nodes) EXPECT_EQ(n.kind, small_model(4).nodes[&n - &g.nodes[0]].kind);
}

TEST_F(Rules, AConfigThatDoesNotSplitNamesNodeAxisAndPlugin) {
  smp::ModelGraph g = small_model(3);
  try {
    smp::apply_parallel_rules(g, reg, "tp", 2, false);
    ADD_FAILURE() << "3 heads split 2 ways";
  } catch (const smp::Error& e) {
    const std::string m = e.what();
    for (const char* needle : {"node 'attn'", "parallel.tp = 2", "heads 3 not divisible by tp 2", "'smp_tp'",
                               "tp_replicate_indivisible"})
      EXPECT_NE(m.find(needle), std::string::npos) << needle << " missing from: " << m;
  }
  smp::ModelGraph kept = small_model(3);
  smp::apply_parallel_rules(kept, reg, "tp", 2, true);
  EXPECT_EQ(kept.nodes[1].kind, "attention");  // replicated, with a warning
}

TEST(LossDeclaration, ASumNeedsItsCountFromANode) {
  smp::ModelGraph g;
  g.inputs = {"x", "mask"};
  g.nodes = {node("f", "linear", "{}", {"x"}, {"y"}), node("loss", "ce", "{}", {"y"}, {"sum", "count"})};
  g.loss = "sum";
  g.loss_reduction = smp::ModelGraph::LossReduction::Sum;
  g.loss_count = "count";
  EXPECT_NO_THROW(g.validate("toy"));
  g.loss_count = "y";  // another node's output: the stage plan carries it to the loss
  EXPECT_NO_THROW(g.validate("toy"));
  g.loss_count = "mask";  // a graph input is not a count
  try {
    g.validate("toy");
    ADD_FAILURE() << "a graph input accepted as the count";
  } catch (const smp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("loss count value 'mask' is a graph input"), std::string::npos) << e.what();
  }
  g.loss_count = "nothing";
  EXPECT_THROW(g.validate("toy"), smp::Error);
}

}  // namespace
