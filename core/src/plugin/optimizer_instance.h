// One optimizer made from a plugin's optimizer kind (ABI 2.3), called over at::Tensors.
#pragma once

#include <smp/abi.h>
#include <smp/plugin_registry.h>

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

namespace smp {

class OptimizerInstance {
 public:
  // params: what it updates (see smp_optimizer_create_args); decay[i]:
  // whether params[i] is weight-decayed. Errors name the optimizer and plugin.
  OptimizerInstance(const smp_optimizer_kind* kind, std::string plugin, const std::string& config_json,
                    const std::vector<at::Tensor>& params, const std::vector<bool>& decay, double weight_decay_rate);
  // The loaded optimizer `name` (PluginRegistry::has_optimizer), from the plugin that provides it.
  OptimizerInstance(const PluginRegistry& registry, const std::string& name, const std::string& config_json,
                    const std::vector<at::Tensor>& params, const std::vector<bool>& decay, double weight_decay_rate);
  ~OptimizerInstance();
  OptimizerInstance(const OptimizerInstance&) = delete;
  OptimizerInstance& operator=(const OptimizerInstance&) = delete;

  // The update of params[i] from grad_scale x grads[i] (undefined = skip); step counts from 1.
  void step(double lr, double grad_scale, const std::vector<at::Tensor>& grads, int64_t step);

  struct State {
    size_t param;
    std::string name;
    at::Tensor tensor;  // the live tensor
  };
  // Its state tensors, as the plugin lists them (checked: one shape per parameter).
  std::vector<State> state() const;
  int64_t state_bytes() const;
  const std::string& name() const { return name_; }

 private:
  std::string where(const std::string& call) const;
  const smp_optimizer_kind* kind_;
  std::string plugin_, name_;
  smp_optimizer* optimizer_ = nullptr;
  std::vector<at::Tensor> params_;
};

}  // namespace smp
