// ModelGraph::validate names the adapter, node and value at fault; the graph
// builder behind the host table turns adapter calls into a ModelGraph.
#include <smp/error.h>
#include <smp/model_graph.h>

#include "plugin/host_api.h"

#include "plugin/graph_builder.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace {

smp::GraphNode node(const std::string& name, std::vector<std::string> in, std::vector<std::string> out,
                    const std::string& kind = "linear", const std::string& shared = "",
                    const std::string& config = "{}") {
  smp::GraphNode n;
  n.name = name;
  n.kind = kind;
  n.config_json = config;
  n.method = "forward";
  n.inputs = std::move(in);
  n.outputs = std::move(out);
  n.shared_key = shared;
  return n;
}

// tokens -> embed -> h0 -> block -> h1 -> head(tied to embed) -> logits -> loss(+targets)
smp::ModelGraph valid_graph() {
  smp::ModelGraph g;
  g.inputs = {"tokens", "targets"};
  g.nodes = {node("embed", {"tokens"}, {"h0"}, "embedding", "wte"),
             node("blocks.0", {"h0"}, {"h1"}, "block"),
             node("head", {"h1"}, {"logits"}, "embedding", "wte"),
             node("loss", {"logits", "targets"}, {"loss"}, "cross_entropy")};
  g.loss = "loss";
  return g;
}

// Expects validate() to throw an smp::Error mentioning every needle.
void expect_invalid(const smp::ModelGraph& g, const std::vector<std::string>& needles) {
  try {
    g.validate("toy");
    ADD_FAILURE() << "graph accepted";
  } catch (const smp::Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("adapter 'toy'"), std::string::npos) << m;
    for (const auto& n : needles) EXPECT_NE(m.find(n), std::string::npos) << "'" << n << "' missing from: " << m;
  }
}

TEST(ModelGraph, AValidGraphPasses) {
  smp::ModelGraph g = valid_graph();
  EXPECT_NO_THROW(g.validate("toy"));
  auto p = g.producers();
  EXPECT_EQ(p.at("tokens"), -1);
  EXPECT_EQ(p.at("targets"), -1);
  EXPECT_EQ(p.at("h1"), 1);
  EXPECT_EQ(p.at("loss"), 3);
  auto c = g.consumers();
  ASSERT_EQ(c.size(), 4u);
  EXPECT_EQ(c[0], std::vector<int>{1});
  EXPECT_EQ(c[1], std::vector<int>{2});
  EXPECT_EQ(c[2], std::vector<int>{3});
  EXPECT_TRUE(c[3].empty());
  EXPECT_EQ(g.nodes[0].module_key(), "wte");
  EXPECT_EQ(g.nodes[1].module_key(), "blocks.0");
}

TEST(ModelGraph, ConsumersListEachConsumerOnce) {
  smp::ModelGraph g;
  g.inputs = {"x"};
  g.nodes = {node("a", {"x"}, {"y"}), node("b", {"y", "y"}, {"z"}), node("c", {"y", "z"}, {"loss"})};
  g.loss = "loss";
  ASSERT_NO_THROW(g.validate("toy"));
  auto c = g.consumers();
  EXPECT_EQ(c[0], (std::vector<int>{1, 2}));
  EXPECT_EQ(c[1], std::vector<int>{2});
}

TEST(ModelGraph, RefusesAnInputDeclaredTwice) {
  auto g = valid_graph();
  g.inputs.push_back("tokens");
  expect_invalid(g, {"input 'tokens'", "twice"});
}

TEST(ModelGraph, RefusesADuplicateNodeName) {
  auto g = valid_graph();
  g.nodes[1].name = "embed";
  expect_invalid(g, {"node name 'embed'", "twice"});
}

TEST(ModelGraph, RefusesANodeWithoutOutputs) {
  auto g = valid_graph();
  g.nodes.insert(g.nodes.begin() + 1, node("probe", {"h0"}, {}));
  expect_invalid(g, {"node 'probe'", "no outputs"});
}

TEST(ModelGraph, RefusesAValueReadBeforeItIsProduced) {
  auto g = valid_graph();
  std::swap(g.nodes[1], g.nodes[2]);  // head now reads h1 before blocks.0 produces it
  expect_invalid(g, {"node 'head'", "value 'h1'", "execution order"});
}

TEST(ModelGraph, RefusesAnUnknownValue) {
  auto g = valid_graph();
  g.nodes[1].inputs = {"h0", "mask"};
  expect_invalid(g, {"node 'blocks.0'", "value 'mask'"});
}

TEST(ModelGraph, RefusesAValueProducedTwice) {
  auto g = valid_graph();
  g.nodes[2].outputs = {"h1"};
  expect_invalid(g, {"value 'h1'", "produced twice", "'head'"});
}

TEST(ModelGraph, RefusesAValueThatShadowsAnInput) {
  auto g = valid_graph();
  g.nodes[0].outputs = {"targets"};
  expect_invalid(g, {"value 'targets'", "produced twice"});
}

TEST(ModelGraph, RefusesSharedNodesThatDifferInKind) {
  auto g = valid_graph();
  g.nodes[2].kind = "linear";
  expect_invalid(g, {"'embed'", "'head'", "key 'wte'"});
}

TEST(ModelGraph, RefusesSharedNodesThatDifferInConfig) {
  auto g = valid_graph();
  g.nodes[2].config_json = R"({"vocab": 7})";
  expect_invalid(g, {"'embed'", "'head'", "key 'wte'", "config"});
}

TEST(ModelGraph, RefusesAMissingLoss) {
  auto g = valid_graph();
  g.loss.clear();
  expect_invalid(g, {"no loss"});
}

TEST(ModelGraph, RefusesALossNoNodeProduces) {
  auto g = valid_graph();
  g.loss = "total";
  expect_invalid(g, {"loss value 'total'", "never produced"});
}

// ---- The builder behind smp_graph_builder, through the host table ----------

TEST(GraphBuilder, BuildsTheGraphAnAdapterDescribes) {
  const smp_host_api* h = smp::host_api();
  smp::GraphBuilder b;
  smp::throw_if_error(h->graph_add_input(b.handle(), "x"), "input");
  const char* in[] = {"x"};
  const char* out[] = {"loss"};
  smp_graph_node n{};
  n.struct_size = SMP_GRAPH_NODE_STRUCT_SIZE;
  n.name = "blocks.0.mlp";
  n.kind = "mlp";
  n.config_json = nullptr;  // -> "{}"
  n.method = nullptr;       // -> "forward"
  n.inputs = in;
  n.n_inputs = 1;
  n.outputs = out;
  n.n_outputs = 1;
  n.shared_key = nullptr;
  n.flops_hint = 10;
  n.param_bytes_hint = 20;
  n.activation_bytes_hint = 30;
  smp::throw_if_error(h->graph_add_node(b.handle(), &n), "node");
  smp::throw_if_error(h->graph_set_loss(b.handle(), "loss"), "loss");
  smp::throw_if_error(h->graph_set_flops_per_sample(b.handle(), 123.0), "flops");

  const smp::ModelGraph& g = b.graph();
  EXPECT_NO_THROW(g.validate("builder"));
  ASSERT_EQ(g.nodes.size(), 1u);
  EXPECT_EQ(g.inputs, std::vector<std::string>{"x"});
  EXPECT_EQ(g.nodes[0].name, "blocks.0.mlp");
  EXPECT_EQ(g.nodes[0].config_json, "{}");
  EXPECT_EQ(g.nodes[0].method, "forward");
  EXPECT_EQ(g.nodes[0].shared_key, "");
  EXPECT_EQ(g.nodes[0].flops_hint, 10);
  EXPECT_EQ(g.nodes[0].activation_bytes_hint, 30);
  EXPECT_EQ(g.loss, "loss");
  EXPECT_EQ(g.flops_per_sample, 123.0);
}

TEST(GraphBuilder, BadCallsReturnErrorsNamingTheProblem) {
  const smp_host_api* h = smp::host_api();
  smp::GraphBuilder b;
  auto message = [](smp_error* e) {
    EXPECT_NE(e, nullptr);
    return smp::consume_error(e);
  };
  EXPECT_NE(message(h->graph_add_input(b.handle(), "")).find("empty name"), std::string::npos);
  EXPECT_NE(message(h->graph_add_node(b.handle(), nullptr)).find("null node"), std::string::npos);
  EXPECT_NE(message(h->graph_add_input(nullptr, "x")).find("null graph builder"), std::string::npos);

  smp_graph_node small{};
  small.struct_size = SMP_STRUCT_SIZE(smp_graph_node, n_outputs);
  small.name = "old";
  small.kind = "k";
  std::string m = message(h->graph_add_node(b.handle(), &small));
  EXPECT_NE(m.find("struct_size " + std::to_string(small.struct_size)), std::string::npos) << m;

  smp_graph_node nokind{};
  nokind.struct_size = SMP_GRAPH_NODE_STRUCT_SIZE;
  nokind.name = "blocks.1";
  m = message(h->graph_add_node(b.handle(), &nokind));
  EXPECT_NE(m.find("'blocks.1' has no kind"), std::string::npos) << m;
  EXPECT_TRUE(b.graph().nodes.empty());
}

}  // namespace
