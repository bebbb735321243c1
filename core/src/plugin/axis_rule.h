// A loaded plugin's rule for one mesh axis and module kind (smp_rule), in C++:
// the kind it rewrites a node to, and whether it accepts a node's config at an
// axis size. graph/'s apply_parallel_rules asks these; the C table stays here.
#pragma once

#include <smp/plugin_registry.h>

#include <optional>
#include <string>

namespace smp {

class AxisRule {
 public:
  // The rule mapping `kind` on `axis` ("tp", "ep", a job's axis); none if no plugin has one.
  static std::optional<AxisRule> find(const PluginRegistry& registry, const std::string& axis,
                                      const std::string& kind);
  std::string kind() const;       // the kind it maps from
  std::string dist_kind() const;  // and to
  // "" when the rule accepts a node of `config_json` split `axis_size` ways; else the plugin's reason.
  std::string refusal(const std::string& config_json, int axis_size) const;

 private:
  explicit AxisRule(const smp_rule* rule) : rule_(rule) {}
  const smp_rule* rule_;
};

}  // namespace smp
