// A plugin of ABI 2.0 (abi20/abi_2_0_plugin.c: pure C, descriptor minor 0,
// every struct of its 2.0 size, later fields poisoned) loads into this core and
// runs: its module kind makes a module whose parameter the core takes, and
// whose forward computes; its rule of minor 0 counts as splitting everything.
#include <smp/error.h>
#include "plugin/plugin_tables.h"
#include <smp/model_graph.h>
#include <smp/plugin_registry.h>

#include "graph/parallel_rules.h"
#include "plugin/module_instance.h"

#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <string>
#include <vector>

namespace {

const std::string kPlugin = std::string(SMP_TEST_PLUGIN_DIR) + "/abi_2_0_plugin.so";

struct Abi20Plugin : ::testing::Test {
  smp::PluginRegistry reg;
  const smp::PluginInfo* info = nullptr;
  void SetUp() override { info = &reg.load(kPlugin); }
};

TEST_F(Abi20Plugin, LoadsWithItsMinorAndTwoZeroStructSizes) {
  EXPECT_EQ(info->name, "abi_2_0_plugin");
  EXPECT_EQ(info->abi_major, 2u);
  EXPECT_EQ(info->abi_minor, 0u);
  EXPECT_EQ(info->module_kinds, std::vector<std::string>{"abi20_scale"});
  EXPECT_EQ(info->rules, std::vector<std::string>{"tp:abi20_scale"});
  const smp_module_kind* kind = smp::PluginTables(reg).module_kind("abi20_scale");
  ASSERT_NE(kind, nullptr);
  EXPECT_EQ(kind->struct_size, SMP_MODULE_KIND_STRUCT_SIZE_2_0);
  const smp_rule* rule = smp::PluginTables(reg).rule("tp", "abi20_scale");
  ASSERT_NE(rule, nullptr);
  EXPECT_EQ(rule->struct_size, SMP_RULE_STRUCT_SIZE_2_0);
}

TEST_F(Abi20Plugin, ItsModuleHasItsParameterAndComputes) {
  const std::string key = "scale";
  smp::ModuleInstance m(smp::PluginTables(reg).module_kind("abi20_scale"), info->name, key, "{}",
                        smp::module_context(key, 1, nullptr, "{}"));
  // The parameter, reported with a 2.0 smp_param_info and no placements.
  ASSERT_EQ(m.parameters().size(), 1u);
  const smp::ModuleParameter& p = m.parameters()[0];
  EXPECT_EQ(p.name, "scale.weight");
  EXPECT_EQ(p.tensor.sizes().vec(), std::vector<int64_t>{4});
  EXPECT_EQ(p.tensor.scalar_type(), at::kFloat);
  EXPECT_TRUE(p.tensor.requires_grad());  // the core makes a floating parameter a leaf that learns
  EXPECT_EQ(p.init, nullptr) << "the host read smp_param_info.init past a 2.0 struct_size";
  const at::Tensor weight = at::tensor({0.5f, 1.f, 1.5f, 2.f});
  EXPECT_TRUE(at::equal(p.tensor.detach(), weight)) << p.tensor;

  // forward(x) = x * weight over the last dimension, computed by the plugin in C.
  const at::Tensor x = at::arange(8, at::kFloat).reshape({2, 4}) - 3;
  std::vector<at::Tensor> out = m.call(key, "forward", {x}, 1, true, 0);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].sizes(), x.sizes());
  EXPECT_TRUE(at::equal(out[0], x * weight)) << out[0];

  // A value the host changes is what the plugin computes with next.
  {
    c10::NoGradGuard no_grad;
    p.tensor.mul_(2);
  }
  EXPECT_TRUE(at::equal(m.call(key, "forward", {x}, 1, false, 0)[0], x * weight * 2));

  // Its errors come back as smp::Error naming the plugin, the kind and the node.
  try {
    m.call("scale_node", "forward", {at::ones({3})}, 1, true, 0);
    ADD_FAILURE() << "an input whose last dimension is not 4 was accepted";
  } catch (const smp::Error& e) {
    const std::string what = e.what();
    for (const char* needle : {"abi_2_0_plugin", "abi20_scale", "scale_node", "last dimension must be 4"})
      EXPECT_NE(what.find(needle), std::string::npos) << needle << " missing from: " << what;
  }
}

TEST_F(Abi20Plugin, ItsRuleOfMinorZeroSplitsEverything) {
  // The rule's param_split / activation_split lie past its 2.0 struct_size
  // (and hold 0 there): the core must not read them, a rule of minor 0 splits
  // a node's parameters and activations entirely.
  smp::ModelGraph g;
  g.inputs = {"x"};
  smp::GraphNode n;
  n.name = "scale", n.kind = "abi20_scale", n.config_json = "{}", n.method = "forward";
  n.inputs = {"x"}, n.outputs = {"y"};
  n.param_bytes_hint = 100, n.activation_bytes_hint = 40;
  g.nodes = {n};
  g.loss = "y";
  smp::apply_parallel_rules(g, reg, "tp", 2, false);
  EXPECT_EQ(g.nodes[0].kind, "abi20_scale");
  EXPECT_DOUBLE_EQ(g.nodes[0].param_bytes_hint, 50);
  EXPECT_DOUBLE_EQ(g.nodes[0].activation_bytes_hint, 20);
}

}  // namespace
