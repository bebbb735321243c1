// An example third-party plugin: the module kind "example_scale".
//
//   config: {"factor": 2.0}   (optional, default 1.0)
//   forward: y = w * x, w a learnable scalar initialised to factor
//
// Everything a plugin needs comes from the SDK (smp/sdk/plugin.hpp) and
// LibTorch; it never links libsmp_core. Gradients flow through the module as
// through any LibTorch code: dL/dx = w * dL/dy, dL/dw = sum(x * dL/dy).
#include <smp/sdk/plugin.hpp>

#include <ATen/ATen.h>

namespace {

class Scale : public smp::sdk::Module {
 public:
  Scale(const smp::sdk::Json& config, const smp::sdk::ModuleContext& ctx) : node_(ctx.node_name) {
    double factor = smp::sdk::config_get<double>(config, "factor", node_, 1.0);
    weight_ = at::full({}, factor, at::kFloat).set_requires_grad(true);
  }

  std::vector<at::Tensor> forward(const smp::sdk::Call& call) override {
    if (call.method != "forward")
      throw smp::sdk::Error(SMP_ERR_UNSUPPORTED, "example_scale '" + node_ + "' has no method '" + call.method + "'");
    if (call.inputs.size() != 1)
      throw smp::sdk::Error("example_scale '" + node_ + "' takes 1 input, got " + std::to_string(call.inputs.size()));
    return {call.inputs[0] * weight_};
  }

  std::vector<smp::sdk::Param> parameters() override { return {{"weight", weight_}}; }

 private:
  std::string node_;
  at::Tensor weight_;
};

}  // namespace

SMP_PLUGIN(smp::sdk::PluginBuilder("example_scale", "1.0.0").module<Scale>("example_scale"))
