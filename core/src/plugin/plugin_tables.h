// The registry's C tables, for the plugin layer only: plugin/ is the one part of
// the core that speaks the C ABI (tests/layering checks that only it includes
// smp/abi.h). Everything above it uses the C++ instances made from these
// (ModuleInstance, OptimizerInstance, AdapterInstance, the partition strategy
// and rule calls) and never sees a C struct.
#pragma once

#include <smp/abi.h>
#include <smp/plugin_registry.h>

#include <string>

namespace smp {

class PluginTables {
 public:
  explicit PluginTables(const PluginRegistry& registry) : r_(registry) {}
  // nullptr when no loaded plugin provides it.
  const smp_module_kind* module_kind(const std::string& kind) const;
  const smp_model_adapter* adapter(const std::string& name) const;
  const smp_partition_strategy* partitioner(const std::string& name) const;
  const smp_optimizer_kind* optimizer(const std::string& name) const;
  // The rule mapping `kind` on mesh axis `axis` ("tp", "ep").
  const smp_rule* rule(const std::string& axis, const std::string& kind) const;

 private:
  const PluginRegistry& r_;
};

}  // namespace smp
