#include "plugin/adapter_instance.h"

#include <smp/error.h>

#include "plugin/extension.h"
#include "plugin/graph_builder.h"
#include "plugin/host_api.h"
#include "plugin/plugin_tables.h"

namespace smp {

struct AdapterInstance::Handle {
  const smp_model_adapter* table = nullptr;
  smp_adapter* instance = nullptr;
  ~Handle() {
    if (instance) table->destroy(instance);
  }
};

AdapterInstance::AdapterInstance(const PluginRegistry& registry, std::string name, const std::string& model_json,
                                 const std::string& parallel_json, uint64_t seed, const std::string& origin)
    : handle_(std::make_unique<Handle>()) {
  if (name.empty())
    for (const auto& info : registry.plugins())
      if (!info.adapters.empty()) {
        name = info.adapters.front();
        break;
      }
  if (name.empty()) throw Error("no model adapter: pass --plugin <adapter.so> (none of the loaded plugins provides one)");
  handle_->table = PluginTables(registry).adapter(name);
  if (!handle_->table) throw Error("model.adapter: no adapter named '" + name + "' is loaded");
  name_ = name;
  plugin_ = registry.provider("adapter", name);
  smp_adapter_context ctx{};
  ctx.struct_size = SMP_ADAPTER_CONTEXT_STRUCT_SIZE;
  ctx.seed = seed;
  ctx.parallel_json = parallel_json.c_str();
  throw_if_error(handle_->table->create(handle_->table->state, model_json.c_str(), &ctx, &handle_->instance),
                 where() + " create from [model] of " + origin);
}

AdapterInstance::~AdapterInstance() = default;

std::string AdapterInstance::where() const { return "adapter '" + name_ + "' (plugin '" + plugin_ + "')"; }

ModelGraph AdapterInstance::describe() const {
  GraphBuilder builder;
  throw_if_error(handle_->table->describe(handle_->instance, builder.handle()), where() + " describe");
  ModelGraph graph = std::move(builder.graph());
  graph.validate(name_);
  return graph;
}

std::vector<at::Tensor> AdapterInstance::batch(const BatchRequest& request, size_t n_inputs) const {
  smp_batch_request req{};
  req.struct_size = SMP_BATCH_REQUEST_STRUCT_SIZE;
  req.split = request.split == DataSplit::Train ? SMP_SPLIT_TRAIN : SMP_SPLIT_VALIDATION;
  req.step = request.step;
  req.global_batch = request.global_batch;
  req.first_sample = request.first_sample;
  req.num_samples = request.num_samples;
  std::vector<smp_axis_coord> coords;
  for (const DataAxis& a : request.axes) {
    smp_axis_coord c{};
    c.struct_size = SMP_AXIS_COORD_STRUCT_SIZE;
    c.axis = a.axis.c_str();
    c.flags = role_flag(a.role);
    c.index = a.index;
    c.size = a.size;
    coords.push_back(c);
  }
  auto axes = make_extension<smp_batch_axes_extension>(SMP_EXTENSION_BATCH_AXES, SMP_BATCH_AXES_EXTENSION_STRUCT_SIZE);
  axes.axes = coords.data();
  axes.n_axes = coords.size();
  req.extension_start = &axes.base;
  std::vector<smp_tensor*> out(n_inputs, nullptr);
  smp_error* err = handle_->table->batch(handle_->instance, &req, out.data(), out.size());
  std::vector<at::Tensor> result;
  for (auto* h : out)
    if (h) {
      result.push_back(tensor_of(h));
      host_api()->tensor_release(h);
    }
  throw_if_error(err, where() + " batch");
  if (result.size() != n_inputs)
    throw Error(where() + " batch returned " + std::to_string(result.size()) + " tensors for " +
                std::to_string(n_inputs) + " inputs");
  return result;
}

}  // namespace smp
