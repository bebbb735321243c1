#include "graph/parallel_rules.h"

#include <smp/axis_role.h>
#include <smp/error.h>
#include <smp/plugin_registry.h>

#include "plugin/axis_rule.h"

#include <spdlog/spdlog.h>

#include <set>

namespace smp {

namespace {

// The hints become this rank's share: the split fraction / axis_size, the rest whole.
void scale_hints(GraphNode& node, const MemorySplit& split, int axis_size) {
  const double ps = split.params, as = split.activations;
  node.param_bytes_hint *= (1.0 - ps) + ps / axis_size;
  node.activation_bytes_hint *= (1.0 - as) + as / axis_size;
  node.activation_fp32_extra_bytes_hint *= (1.0 - as) + as / axis_size;
  node.attention_core_bytes_hint *= (1.0 - as) + as / axis_size;
}

// The built-in model axis (tp), the one parallel.tp_replicate_indivisible is for.
bool tensor_parallel_axis(const std::string& axis) {
  const BuiltinAxis* b = builtin_axis(axis);
  return b && b->role == Role::Model;
}

}  // namespace

int apply_parallel_rules(ModelGraph& graph, const PluginRegistry& registry, const std::string& axis, int axis_size,
                         bool replicate_indivisible, bool every_node, const std::string& key) {
  int split = 0;
  std::set<std::string> replicated_kinds;
  std::map<std::string, std::string> decided;  // shared key -> kind, so tied nodes stay one module
  for (auto& node : graph.nodes) {
    if (!node.shared_key.empty()) {
      auto it = decided.find(node.shared_key);
      if (it != decided.end()) {
        const auto rule = AxisRule::find(registry, axis, node.kind);
        node.kind = it->second;
        if (rule && node.kind == rule->dist_kind())
          scale_hints(node, registry.memory_split(axis, rule->kind()), axis_size);
        continue;
      }
    }
    const auto rule = AxisRule::find(registry, axis, node.kind);
    if (!rule && every_node)
      throw Error(key + " = " + std::to_string(axis_size) + ": node '" + node.name + "' (kind '" + node.kind +
                  "' of plugin '" + registry.provider(node.kind) + "') has no \"" + axis +
                  "\" rule: the axis splits every sample's sequence, and only kinds whose plugin declares a rule for "
                  "it compute on a share of the sequence");
    if (!rule) {
      if (replicated_kinds.insert(node.kind).second)
        spdlog::debug("{}={}: no {} rule for module kind '{}': its nodes stay replicated", axis, axis_size, axis,
                      node.kind);
    } else {
      const std::string reason = rule->refusal(node.config_json, axis_size);
      if (reason.empty()) {
        node.kind = rule->dist_kind();
        scale_hints(node, registry.memory_split(axis, rule->kind()), axis_size);
        ++split;
      } else if (replicate_indivisible && !every_node) {
        spdlog::warn("node '{}' ({}): not split {} ways over {} ({}); replicated instead", node.name, node.kind,
                     axis_size, axis, reason);
      } else {
        throw Error("node '" + node.name + "' (kind '" + node.kind + "'): cannot be split for " +
                    (key.empty() ? "parallel." + axis : key) +
                    " = " + std::to_string(axis_size) + ": " + reason + " [rule from plugin '" +
                    registry.provider(axis + " rule", node.kind) + "'" +
                    (tensor_parallel_axis(axis) ? "; set parallel.tp_replicate_indivisible = true to replicate it instead" : "") +
                    "]");
      }
    }
    if (!node.shared_key.empty()) decided[node.shared_key] = node.kind;
  }
  return split;
}

}  // namespace smp
