// smp_optim's optimizer `kind` over `params`, as the core makes it: decay on
// matrices only, the plugin loaded once per test program. For the optimizer
// tests (optimizer_test.cpp, multi_tensor_test.cpp).
#pragma once

#include <smp/plugin_registry.h>
#include "plugin/plugin_tables.h"

#include "plugin/optimizer_instance.h"

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <vector>

namespace smp_test {

inline std::unique_ptr<smp::OptimizerInstance> make(const std::string& kind, const nlohmann::json& config,
                                                    const std::vector<at::Tensor>& params, double weight_decay) {
  static smp::PluginRegistry registry;
  if (!smp::PluginTables(registry).optimizer(kind)) registry.load("smp_optim");
  std::vector<bool> decay;
  for (const auto& p : params) decay.push_back(p.dim() >= 2);
  return std::make_unique<smp::OptimizerInstance>(smp::PluginTables(registry).optimizer(kind), "smp_optim", config.dump(), params, decay,
                                                  weight_decay);
}

}  // namespace smp_test
