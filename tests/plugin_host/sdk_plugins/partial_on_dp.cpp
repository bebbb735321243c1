// An SDK plugin whose parameter claims a partial gradient over "dp": the data
// axis already sums gradients, so the core must refuse it by name instead of
// summing it twice.
#include <smp/sdk/plugin.hpp>

#include <ATen/ATen.h>

namespace {
class PartialOnDp : public smp::sdk::Module {
 public:
  PartialOnDp(const smp::sdk::Json&, const smp::sdk::ModuleContext&) { w_ = at::ones({3}).requires_grad_(true); }
  std::vector<at::Tensor> forward(const smp::sdk::Call& call) override { return {call.inputs.at(0) * w_}; }
  std::vector<smp::sdk::Param> parameters() override {
    smp::sdk::Param p{"weight", w_};
    p.placements = {smp::sdk::Placement::partial_grad("dp")};
    return {p};
  }

 private:
  at::Tensor w_;
};
}  // namespace

SMP_PLUGIN(smp::sdk::PluginBuilder("partial_on_dp", "0.1.0").module<PartialOnDp>("partial_on_dp_kind"))
