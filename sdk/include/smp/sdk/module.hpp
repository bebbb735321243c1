// C++ module kinds over the ABI: derive from Module, register with PluginBuilder::module<T>.
#pragma once

#include <smp/sdk/collectives.hpp>
#include <smp/sdk/did_you_mean.hpp>
#include <smp/sdk/host.hpp>
#include <smp/sdk/init.hpp>
#include <smp/sdk/sequence.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace smp::sdk {

using Json = nlohmann::json;

// One axis of the rank's mesh (SMP_EXTENSION_MESH).
struct MeshAxis {
  std::string name;
  int size = 1, rank = 0;
  uint32_t flags = 0;  // smp_axis_flags
};

// What a module knows about where it runs (a C++ view of smp_module_context).
// The mesh answers for any axis; tp_rank/tp_size/tp/sequence_parallel are the
// tensor-parallel shorthands most layers use, filled from it.
struct ModuleContext {
  std::string node_name;
  uint64_t init_seed = 0;
  smp_device_type device_type = SMP_DEVICE_CPU;
  int device_index = 0;
  smp_mesh* mesh = nullptr;  // borrowed; null = one rank
  Json parallel = Json::object();  // the job's [parallel] table
  // What the memory manager asks of this module (ABI 2.1's memory_json):
  // {"recompute_attention_core": true}, for kinds that declare the feature.
  Json memory = Json::object();
  bool recompute_attention_core() const { return memory.value("recompute_attention_core", false); }
  // ABI 2.2: {"deferred_init": true} (the SDK handles it: InitStream draws are recorded, not made).
  bool deferred_init() const { return memory.value("deferred_init", false); }
  // The loaded plugins' tables of the job by name (ABI 2.5's
  // SMP_EXTENSION_JOB_TABLES), each checked by the plugin that declares it.
  Json tables = Json::object();
  // One of them, {} when the job does not give it (or the host is older than 2.5).
  Json table(const std::string& name) const {
    auto it = tables.find(name);
    return it == tables.end() ? Json::object() : *it;
  }
  int tp_rank = 0;
  int tp_size = 1;
  Comm tp;
  bool sequence_parallel = false;  // [tp] sequence_parallel (smp_tp's table), with tp > 1

  // This rank's position and the size of a named mesh axis ("tp", "ep", "dp",
  // or one the job declared, e.g. "cp").
  int axis_rank(const std::string& axis) const { return axis_info(axis).first; }
  int axis_size(const std::string& axis) const { return axis_info(axis).second; }
  // Every axis of the mesh, dimensions first (ABI 2.4's SMP_EXTENSION_MESH;
  // empty from a host without it).
  std::vector<MeshAxis> axes() const {
    std::vector<MeshAxis> out;
    const auto* ext =
        reinterpret_cast<const smp_mesh_extension*>(find_extension(host().extension_start, SMP_EXTENSION_MESH));
    if (!ext || ext->base.struct_size < SMP_MESH_EXTENSION_STRUCT_SIZE) return out;
    int32_t n = 0;
    check(ext->axis_count(mesh, &n));
    for (int32_t i = 0; i < n; ++i) {
      const char* name = nullptr;
      int32_t size = 1, rank = 0;
      uint32_t flags = 0;
      check(ext->axis_at(mesh, i, &name, &size, &rank, &flags));
      out.push_back({name ? name : "", size, rank, flags});
    }
    return out;
  }
  // The mesh's sequence axis (SMP_AXIS_SPLITS_SEQUENCE, ABI 2.8): which share
  // of every sample's sequence this rank holds; 0 of 1 when the job has none.
  // A kind with a rule for the axis computes on that share: its tokens sit at
  // context_parallel_positions(local length x size, size, index).
  SequenceShare sequence() const {
    SequenceShare s;
    if (!mesh) return s;
    for (const auto& a : axes())
      if (a.flags & SMP_AXIS_SPLITS_SEQUENCE) s = {a.name, a.rank, a.size};
    return s;
  }
  // The axis' communicator (the host makes every axis' before any module).
  Comm comm(const std::string& axis) const {
    if (axis == "tp" && tp.get()) return tp;
    smp_comm* c = nullptr;
    if (mesh) check(host().mesh_comm(mesh, axis.c_str(), &c));
    return Comm(c);
  }

  // The device this module's parameters and buffers live on (the rank's device).
  at::Device device() const {
    return device_type == SMP_DEVICE_CUDA ? at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(device_index))
                                          : at::Device(at::kCPU);
  }

  static ModuleContext from(const smp_module_context* c) {
    ModuleContext m;
    if (!c) return m;
    if (c->struct_size < SMP_MODULE_CONTEXT_STRUCT_SIZE_2_0)
      throw Error("module context struct_size " + std::to_string(c->struct_size) + " is smaller than ABI 2.0's " +
                  std::to_string(SMP_MODULE_CONTEXT_STRUCT_SIZE_2_0));
    m.node_name = c->node_name ? c->node_name : "";
    m.init_seed = c->init_seed;
    m.device_type = c->device_type;
    m.device_index = c->device_index;
    m.mesh = c->mesh;
    if (c->parallel_json && *c->parallel_json) m.parallel = Json::parse(c->parallel_json);
    if (SMP_HAS_FIELD(c, smp_module_context, memory_json) && c->memory_json && *c->memory_json)  // 2.1
      m.memory = Json::parse(c->memory_json);
    if (SMP_HAS_FIELD(c, smp_module_context, extension_start)) {  // 2.5
      const auto* t = reinterpret_cast<const smp_job_tables_extension*>(
          find_extension(c->extension_start, SMP_EXTENSION_JOB_TABLES));
      if (t && t->base.struct_size >= SMP_JOB_TABLES_EXTENSION_STRUCT_SIZE && t->tables_json && *t->tables_json)
        m.tables = Json::parse(t->tables_json);
    }
    std::tie(m.tp_rank, m.tp_size) = m.axis_info("tp");
    if (m.tp_size > 1) m.tp = m.comm("tp");
    m.sequence_parallel = m.tp_size > 1 && m.table("tp").value("sequence_parallel", false);
    return m;
  }

 private:
  std::pair<int, int> axis_info(const std::string& axis) const {
    if (axis == "tp" && !mesh) return {tp_rank, tp_size};  // set by hand (tests) or one rank
    int32_t r = 0, n = 1;
    check(host().mesh_axis(mesh, axis.c_str(), &r, &n));
    return {r, n};
  }
};

// Where a parameter lives on one mesh axis (see smp_placement).
struct Placement {
  std::string axis;
  smp_placement_kind kind = SMP_PLACEMENT_REPLICATE;
  int dim = -1;
  static Placement shard(const std::string& axis, int dim) { return {axis, SMP_PLACEMENT_SHARD, dim}; }
  static Placement partial_grad(const std::string& axis) { return {axis, SMP_PLACEMENT_PARTIAL_GRAD, -1}; }
  static Placement replicate(const std::string& axis) { return {axis, SMP_PLACEMENT_REPLICATE, -1}; }
};

struct Param {
  std::string name;
  at::Tensor tensor;
  // Tensor-parallel shorthands (kept from ABI 1): shard_dim >= 0 is
  // Placement::shard("tp", shard_dim); tp_grad_sum is Placement::partial_grad("tp").
  int shard_dim = -1;
  bool tp_grad_sum = false;
  std::vector<Placement> placements;  // any other axis (an expert: shard("ep", 0))
  // State the module updates itself in forward (a running statistic), not
  // trained: saved in checkpoints, sent from the first data-parallel replica
  // to the others before each step (ABI 2.6, SMP_PARAM_FLAG_BUFFER).
  bool buffer = false;

  // Every placement, the shorthands included.
  std::vector<Placement> all_placements() const {
    std::vector<Placement> all = placements;
    if (shard_dim >= 0) all.push_back(Placement::shard("tp", shard_dim));
    if (tp_grad_sum) all.push_back(Placement::partial_grad("tp"));
    return all;
  }
};

// A decoding call's positions (ABI 2.7 SMP_EXTENSION_DECODE): sample i's
// inputs are its positions [start[i], start[i] + s). A kind that keeps a KV
// cache writes these positions into it and attends each to the kept positions
// up to itself; a call without a Decode frees the cache.
struct Decode {
  std::vector<int64_t> start;  // one per sample
  int64_t capacity = 0;        // positions the cache holds
};

struct Call {
  std::string method = "forward";
  std::vector<at::Tensor> inputs;
  bool training = false;
  uint64_t rng_seed = 0;
  const Decode* decode = nullptr;  // null: not a decoding call
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

// The first key of cfg outside `known` ("" if none); *names gets the known
// ones listed ("none" when there are none), for the message.
inline std::string first_unknown_key(const Json& cfg, std::initializer_list<const char*> known, std::string* names) {
  for (const char* k : known) *names += std::string(names->empty() ? "" : ", ") + k;
  if (names->empty()) *names = "none";
  if (!cfg.is_object()) return "";
  for (auto it = cfg.begin(); it != cfg.end(); ++it) {
    bool ok = false;
    for (const char* k : known) ok = ok || it.key() == k;
    if (!ok) return it.key();
  }
  return "";
}

// Refuses a node config key outside `known`, naming node, key and the known
// ones: no key is accepted and then ignored.
inline void expect_node_keys(const Json& cfg, std::initializer_list<const char*> known, const std::string& node) {
  std::string names;
  if (!cfg.is_object()) throw Error("node '" + node + "': the config must be a JSON object, got " + cfg.dump());
  const std::string bad = first_unknown_key(cfg, known, &names);
  if (!bad.empty())
    throw Error("node '" + node + "': unknown config key '" + bad + "' (known: " + names + ")" + did_you_mean(bad, known));
}
// The same for an adapter's [model] table: "model.<key>: unknown key for the <adapter> adapter".
inline void expect_model_keys(const Json& cfg, std::initializer_list<const char*> known, const std::string& adapter) {
  std::string names;
  const std::string bad = first_unknown_key(cfg, known, &names);
  if (!bad.empty())
    throw Error("model." + bad + ": unknown key for the " + adapter + " adapter (known: " + names + ")" +
                did_you_mean(bad, known));
}

// Reads key `key` of the job's [model] table, with errors naming "model.<key>".
template <class T>
T model_get(const Json& cfg, const char* key) {
  if (!cfg.contains(key)) throw Error(std::string("model.") + key + ": missing");
  try {
    return cfg.at(key).get<T>();
  } catch (const std::exception&) {
    throw Error(std::string("model.") + key + ": wrong type: " + cfg.at(key).dump());
  }
}
template <class T>
T model_get(const Json& cfg, const char* key, T fallback) {
  return cfg.contains(key) ? model_get<T>(cfg, key) : fallback;
}
// A positive integer key of [model] (a size, a count), or `fallback` when absent.
// `most` bounds what a count may be before a model is built from it: a
// layer count of 2^31 built layers until memory ran out, with no message.
inline int64_t model_positive(const Json& cfg, const char* key, int64_t fallback, int64_t most = int64_t{1} << 24) {
  if (!cfg.contains(key)) return fallback;
  const int64_t v = model_get<int64_t>(cfg, key);
  if (v <= 0) throw Error(std::string("model.") + key + ": expected a positive integer, got " + std::to_string(v));
  if (v > most)
    throw Error(std::string("model.") + key + ": " + std::to_string(v) + " is more than smp builds (" +
                std::to_string(most) + ")");
  return v;
}

namespace detail {
struct ModuleBox {  // what smp_module* points to
  Module* impl;
  std::unique_ptr<DeferredInit> deferred;  // the draws recorded under deferred init, else null
};

// Parameters are initialised from the CPU generator (so a parameter is the same
// on every device and in every layout); this moves those a module made on
// another device to the context's, in place (set_data, as torch.nn.Module.to
// does), so the module's own handles see the moved tensor. A deferred one
// (still without storage) moves without data.
inline void place_parameters(Module& m, const at::Device& device, const DeferredInit* deferred) {
  for (auto& p : m.parameters()) {
    if (!p.tensor.defined() || p.tensor.device() == device) continue;
    if (deferred && deferred->find(p.tensor))
      p.tensor.set_data(detail::storageless(p.tensor.sizes(), p.tensor.options().device(device)));
    else
      p.tensor.set_data(p.tensor.data().to(device));
  }
}

}  // namespace detail

// Makes a module of a kind registered with a function (PluginBuilder::module(kind, factory)).
using ModuleFactory = std::function<std::unique_ptr<Module>(const Json& config, const ModuleContext& context)>;

namespace detail {
template <class T>
struct ModuleKindTable {
  // T(config, context); for T = Module (abstract), the kind's state is its ModuleFactory.
  static smp_error* create(void* state, const char* config_json, const smp_module_context* ctx, smp_module** out) {
    return guard([&] {
      Json cfg = (config_json && *config_json) ? Json::parse(config_json) : Json::object();
      auto* box = new ModuleBox{nullptr};
      try {
        const ModuleContext mc = ModuleContext::from(ctx);
        if (mc.deferred_init()) box->deferred = std::make_unique<DeferredInit>();
        {
          DeferredInitScope scope(box->deferred.get());  // null: draws are made, not recorded
          if constexpr (std::is_abstract_v<T>) {
            auto made = (*static_cast<const ModuleFactory*>(state))(cfg, mc);
            if (!made) throw Error("node '" + mc.node_name + "': the factory made no module");
            box->impl = made.release();
          } else {
            box->impl = new T(cfg, mc);
          }
        }
        place_parameters(*box->impl, mc.device(), box->deferred.get());
      } catch (...) {
        delete box->impl;
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
      Decode decode;
      if (SMP_HAS_FIELD(a, smp_forward_args, extension_start))
        for (const smp_extension_base* e = a->extension_start; e; e = e->next)
          if (e->type == SMP_EXTENSION_DECODE && e->struct_size >= SMP_DECODE_EXTENSION_STRUCT_SIZE) {
            const auto* d = reinterpret_cast<const smp_decode_extension*>(e);
            decode.start.assign(d->start, d->start + d->n_samples);
            decode.capacity = d->capacity;
            call.decode = &decode;
          }
      auto outs = reinterpret_cast<ModuleBox*>(m)->impl->forward(call);
      if (outs.size() != a->n_outputs)
        throw Error("method '" + call.method + "' produced " + std::to_string(outs.size()) +
                    " outputs, the graph expects " + std::to_string(a->n_outputs));
      for (size_t i = 0; i < outs.size(); ++i) a->outputs[i] = to_handle(outs[i]);
    });
  }
  static smp_error* parameters(smp_module* m, smp_param_visitor visit, void* user) {
    return guard([&] {
      const ModuleBox* box = reinterpret_cast<ModuleBox*>(m);
      for (auto& p : box->impl->parameters()) {
        TensorRef h(p.tensor);
        const std::vector<Placement> all = p.all_placements();
        std::vector<smp_placement> placements(all.size());
        for (size_t i = 0; i < all.size(); ++i) {
          placements[i].struct_size = SMP_PLACEMENT_STRUCT_SIZE;
          placements[i].axis = all[i].axis.c_str();
          placements[i].kind = all[i].kind;
          placements[i].dim = all[i].dim;
        }
        smp_param_info info{};
        info.struct_size = SMP_PARAM_INFO_STRUCT_SIZE;
        info.name = p.name.c_str();
        info.tensor = h.get();
        info.placements = placements.data();
        info.n_placements = placements.size();
        info.flags = p.buffer ? SMP_PARAM_FLAG_BUFFER : 0u;
        smp_param_init init{};
        if (const InitSpec* spec = box->deferred ? box->deferred->find(p.tensor) : nullptr) {
          init.struct_size = SMP_PARAM_INIT_STRUCT_SIZE;
          init.kind = static_cast<smp_param_init_kind>(static_cast<int>(spec->kind));
          init.key = spec->key;
          init.value = spec->value;
          init.full_shape = spec->full.data();
          init.full_ndim = spec->full.size();
          init.slice_dim = static_cast<int32_t>(spec->slice.dim);
          init.slice_begin = spec->slice.begin;
          init.slice_length = spec->slice.length;
          info.init = &init;
        }
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

// A deterministic CPU generator seeded from a module's init_seed (sequential:
// to generate only a shard of a parameter, use smp/sdk/init.hpp's InitStream).
inline at::Generator init_generator(uint64_t seed);

}  // namespace smp::sdk

#include <ATen/CPUGeneratorImpl.h>

namespace smp::sdk {
inline at::Generator init_generator(uint64_t seed) { return at::detail::createCPUGenerator(seed); }
}  // namespace smp::sdk
