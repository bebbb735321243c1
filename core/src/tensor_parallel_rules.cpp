#include "tensor_parallel_rules.h"

#include <smp/error.h>
#include <smp/host_api.h>
#include <smp/plugin_registry.h>

#include <spdlog/spdlog.h>

#include <set>

namespace smp {

void apply_tensor_parallel_rules(ModelGraph& graph, const PluginRegistry& registry, int tp_size,
                                 bool replicate_indivisible) {
  std::set<std::string> replicated_kinds;
  std::map<std::string, std::string> decided;  // shared key -> kind, so tied nodes stay one module
  for (auto& node : graph.nodes) {
    if (!node.shared_key.empty()) {
      auto it = decided.find(node.shared_key);
      if (it != decided.end()) {
        node.kind = it->second;
        continue;
      }
    }
    const smp_tp_rule* rule = registry.tp_rule(node.kind);
    if (!rule) {
      if (replicated_kinds.insert(node.kind).second)
        spdlog::info("tp={}: no tensor-parallel rule for module kind '{}': its nodes stay replicated", tp_size,
                     node.kind);
    } else {
      std::string reason;
      if (rule->check) reason = consume_error(rule->check(rule->state, node.config_json.c_str(), tp_size));
      if (reason.empty()) {
        node.kind = rule->dist_kind;
      } else if (replicate_indivisible) {
        spdlog::warn("node '{}' ({}): not split {} ways ({}); replicated instead", node.name, node.kind, tp_size, reason);
      } else {
        throw Error("node '" + node.name + "' (kind '" + node.kind + "'): cannot be split for parallel.tp = " +
                    std::to_string(tp_size) + ": " + reason + " [rule from plugin '" + registry.provider("tp rule", node.kind) +
                    "'; set parallel.tp_replicate_indivisible = true to replicate it instead]");
      }
    }
    if (!node.shared_key.empty()) decided[node.shared_key] = node.kind;
  }
}

}  // namespace smp
