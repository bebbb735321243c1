#include "plugin/axis_rule.h"

#include "plugin/host_api.h"
#include "plugin/plugin_tables.h"

namespace smp {

std::optional<AxisRule> AxisRule::find(const PluginRegistry& registry, const std::string& axis,
                                       const std::string& kind) {
  const smp_rule* r = PluginTables(registry).rule(axis, kind);
  if (!r) return std::nullopt;
  return AxisRule(r);
}

std::string AxisRule::kind() const { return rule_->kind; }
std::string AxisRule::dist_kind() const { return rule_->dist_kind; }

std::string AxisRule::refusal(const std::string& config_json, int axis_size) const {
  if (!rule_->check) return "";
  return consume_error(rule_->check(rule_->state, config_json.c_str(), axis_size));
}

}  // namespace smp
