#include "plugin/optimizer_instance.h"

#include <smp/error.h>

#include "plugin/host_api.h"
#include "plugin/plugin_tables.h"

#include <cstdint>

namespace smp {

namespace {
const smp_optimizer_kind* known_optimizer(const PluginRegistry& registry, const std::string& name) {
  const smp_optimizer_kind* k = PluginTables(registry).optimizer(name);
  if (!k) throw Error("no loaded plugin provides the optimizer '" + name + "'");
  return k;
}
}  // namespace

OptimizerInstance::OptimizerInstance(const PluginRegistry& registry, const std::string& name,
                                     const std::string& config_json, const std::vector<at::Tensor>& params,
                                     const std::vector<bool>& decay, double weight_decay_rate)
    : OptimizerInstance(known_optimizer(registry, name), registry.provider("optimizer", name), config_json, params,
                        decay, weight_decay_rate) {}

OptimizerInstance::OptimizerInstance(const smp_optimizer_kind* kind, std::string plugin, const std::string& config_json,
                                     const std::vector<at::Tensor>& params, const std::vector<bool>& decay,
                                     double weight_decay_rate)
    : kind_(kind), plugin_(std::move(plugin)), name_(kind->name), params_(params) {
  std::vector<smp_tensor*> handles;
  for (const auto& p : params) handles.push_back(make_tensor_handle(p));
  std::vector<uint8_t> decays(params.size(), 0);
  for (size_t i = 0; i < params.size() && i < decay.size(); ++i) decays[i] = decay[i] ? 1 : 0;
  smp_optimizer_create_args args{};
  args.struct_size = SMP_OPTIMIZER_CREATE_ARGS_STRUCT_SIZE;
  args.config_json = config_json.c_str();
  args.params = handles.data();
  args.weight_decay = decays.data();
  args.n_params = handles.size();
  args.weight_decay_rate = weight_decay_rate;
  smp_error* err = kind_->create(kind_->state, &args, &optimizer_);
  for (smp_tensor* h : handles) host_api()->tensor_release(h);
  throw_if_error(err, where("create"));
  if (!optimizer_) throw Error(where("create") + ": returned no optimizer");
  state();  // checked once here, where a wrong shape is found before training
}

OptimizerInstance::~OptimizerInstance() {
  if (optimizer_) kind_->destroy(optimizer_);
}

std::string OptimizerInstance::where(const std::string& call) const {
  return "optimizer '" + name_ + "' (plugin '" + plugin_ + "') " + call;
}

void OptimizerInstance::step(double lr, double grad_scale, const std::vector<at::Tensor>& grads, int64_t step) {
  std::vector<smp_tensor*> handles(grads.size(), nullptr);
  for (size_t i = 0; i < grads.size(); ++i)
    if (grads[i].defined()) handles[i] = make_tensor_handle(grads[i]);
  smp_optimizer_step_args args{};
  args.struct_size = SMP_OPTIMIZER_STEP_ARGS_STRUCT_SIZE;
  args.grads = handles.data();
  args.n_grads = handles.size();
  args.lr = lr;
  args.grad_scale = grad_scale;
  args.step = step;
  smp_error* err = kind_->step(optimizer_, &args);
  for (smp_tensor* h : handles)
    if (h) host_api()->tensor_release(h);
  throw_if_error(err, where("step"));
}

std::vector<OptimizerInstance::State> OptimizerInstance::state() const {
  struct Collect {
    std::vector<State> out;
  } c;
  auto visit = [](void* user, size_t param, const char* name, smp_tensor* t) {
    static_cast<Collect*>(user)->out.push_back({param, name ? name : "", tensor_of(t)});
  };
  throw_if_error(kind_->state_tensors(optimizer_, visit, &c), where("state"));
  for (const State& s : c.out) {
    if (s.param >= params_.size())
      throw Error(where("state") + ": tensor '" + s.name + "' of parameter " + std::to_string(s.param) + " of " +
                  std::to_string(params_.size()));
    if (s.name.empty() || s.name.find('/') != std::string::npos)
      throw Error(where("state") + ": a state tensor needs a name without '/', got '" + s.name + "'");
    if (s.tensor.sizes() != params_[s.param].sizes())
      throw Error(where("state") + ": tensor '" + s.name + "' of parameter " + std::to_string(s.param) +
                  " has shape " + c10::str(s.tensor.sizes()) + ", the parameter " + c10::str(params_[s.param].sizes()));
  }
  return c.out;
}

int64_t OptimizerInstance::state_bytes() const {
  int64_t total = 0;
  for (const State& s : state()) total += s.tensor.numel() * static_cast<int64_t>(s.tensor.element_size());
  return total;
}

}  // namespace smp
