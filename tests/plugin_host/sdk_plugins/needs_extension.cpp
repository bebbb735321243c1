// An SDK plugin that cannot work without a host extension (a private type no
// core provides): the entry point must refuse such a host, naming it.
#include <smp/sdk/plugin.hpp>

namespace {
class Identity : public smp::sdk::Module {
 public:
  Identity(const smp::sdk::Json&, const smp::sdk::ModuleContext&) {}
  std::vector<at::Tensor> forward(const smp::sdk::Call& call) override { return {call.inputs.at(0)}; }
};
}  // namespace

SMP_PLUGIN(smp::sdk::PluginBuilder("needs_extension", "0.1.0")
               .require_host_extension(SMP_EXTENSION_PRIVATE_BASE + 42, "test.needed")
               .module<Identity>("needs_extension_identity"))
