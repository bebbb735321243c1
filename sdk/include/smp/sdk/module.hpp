// C++ module kinds over the ABI: derive from Module, register with PluginBuilder::module<T>.
#pragma once

#include <smp/sdk/collectives.hpp>
#include <smp/sdk/host.hpp>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace smp::sdk {

using Json = nlohmann::json;

// What a module knows about where it runs (a C++ view of smp_module_context).
struct ModuleContext {
  std::string node_name;
  uint64_t init_seed = 0;
  smp_device_type device_type = SMP_DEVICE_CPU;
  int device_index = 0;
  int tp_rank = 0;
  int tp_size = 1;
  Comm tp;
  bool sequence_parallel = false;

  static ModuleContext from(const smp_module_context* c) {
    ModuleContext m;
    if (!c) return m;
    m.node_name = c->node_name ? c->node_name : "";
    m.init_seed = c->init_seed;
    m.device_type = c->device_type;
    m.device_index = c->device_index;
    m.tp_rank = c->tp_rank;
    m.tp_size = c->tp_size;
    m.tp = Comm(c->tp_comm);
    if (c->struct_size >= SMP_STRUCT_SIZE(smp_module_context, sequence_parallel))
      m.sequence_parallel = c->sequence_parallel != 0;
    return m;
  }
};

struct Param {
  std::string name;
  at::Tensor tensor;
  int shard_dim = -1;
  bool tp_grad_sum = false;
};

struct Call {
  std::string method = "forward";
  std::vector<at::Tensor> inputs;
  bool training = false;
  uint64_t rng_seed = 0;
};

class Module {
 public:
  virtual ~Module() = default;
  virtual std::vector<at::Tensor> forward(const Call& call) = 0;
  virtual std::vector<Param> parameters() { return {}; }
};

// Reads a key of a node's JSON config with a message that names node and key.
template <class T>
T config_get(const Json& cfg, const char* key, const std::string& node) {
  if (!cfg.contains(key)) throw Error("node '" + node + "': config key '" + key + "' is missing");
  try {
    return cfg.at(key).get<T>();
  } catch (const std::exception&) {
    throw Error("node '" + node + "': config key '" + key + "' has the wrong type: " + cfg.at(key).dump());
  }
}
template <class T>
T config_get(const Json& cfg, const char* key, const std::string& node, T fallback) {
  return cfg.contains(key) ? config_get<T>(cfg, key, node) : fallback;
}

namespace detail {
struct ModuleBox {  // what smp_module* points to
  Module* impl;
};

template <class T>
struct ModuleKindTable {
  static smp_error* create(void*, const char* config_json, const smp_module_context* ctx, smp_module** out) {
    return guard([&] {
      Json cfg = (config_json && *config_json) ? Json::parse(config_json) : Json::object();
      auto* box = new ModuleBox{nullptr};
      try {
        box->impl = new T(cfg, ModuleContext::from(ctx));
      } catch (...) {
        delete box;
        throw;
      }
      *out = reinterpret_cast<smp_module*>(box);
    });
  }
  static smp_error* forward(smp_module* m, const smp_forward_args* a) {
    return guard([&] {
      Call call;
      if (a->method) call.method = a->method;
      call.inputs.reserve(a->n_inputs);
      for (size_t i = 0; i < a->n_inputs; ++i) call.inputs.push_back(aten(a->inputs[i]));
      call.training = a->training != 0;
      call.rng_seed = a->rng_seed;
      auto outs = reinterpret_cast<ModuleBox*>(m)->impl->forward(call);
      if (outs.size() != a->n_outputs)
        throw Error("method '" + call.method + "' produced " + std::to_string(outs.size()) +
                    " outputs, the graph expects " + std::to_string(a->n_outputs));
      for (size_t i = 0; i < outs.size(); ++i) a->outputs[i] = to_handle(outs[i]);
    });
  }
  static smp_error* parameters(smp_module* m, smp_param_visitor visit, void* user) {
    return guard([&] {
      for (auto& p : reinterpret_cast<ModuleBox*>(m)->impl->parameters()) {
        TensorRef h(p.tensor);
        smp_param_info info{};
        info.struct_size = SMP_STRUCT_SIZE(smp_param_info, tp_grad_sum);
        info.name = p.name.c_str();
        info.tensor = h.get();
        info.shard_dim = p.shard_dim;
        info.tp_grad_sum = p.tp_grad_sum ? 1 : 0;
        visit(user, &info);
      }
    });
  }
  static void destroy(smp_module* m) {
    auto* box = reinterpret_cast<ModuleBox*>(m);
    delete box->impl;
    delete box;
  }
};
}  // namespace detail

// A deterministic CPU generator for parameter initialisation: the same seed gives
// the same full tensor whatever the layout; shards are slices of it.
inline at::Generator init_generator(uint64_t seed);

}  // namespace smp::sdk

#include <ATen/CPUGeneratorImpl.h>

namespace smp::sdk {
inline at::Generator init_generator(uint64_t seed) { return at::detail::createCPUGenerator(seed); }
}  // namespace smp::sdk
