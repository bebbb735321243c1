// Everything a plugin author includes: the descriptor builder and the export macro.
//
//   #include <smp/sdk/plugin.hpp>
//   SMP_PLUGIN(smp::sdk::PluginBuilder("myplugin", "1.0.0").module<MyLayer>("my_layer"))
#pragma once

#include <smp/sdk/adapter.hpp>
#include <smp/sdk/module.hpp>
#include <smp/sdk/optimizer.hpp>
#include <smp/sdk/partition.hpp>

#include <torch/version.h>

#include <deque>
#include <utility>
#include <string>
#include <vector>

namespace smp::sdk {

// Throws Error naming the sizes when config cannot be split axis_size ways.
using RuleCheckFn = void (*)(const Json& config, int axis_size);
using TpCheckFn = RuleCheckFn;  // ABI 1 name
// Throws Error naming the key when the plugin's table of the job holds a key
// it does not know or a bad value ({} when the job has no such table).
using TableCheckFn = void (*)(const Json& table);

class PluginBuilder {
 public:
  PluginBuilder(std::string name, std::string version) : name_(std::move(name)), version_(std::move(version)) {}
  PluginBuilder(const PluginBuilder&) = delete;
  PluginBuilder(PluginBuilder&&) = default;

  template <class T>
  // memory_features: SMP_MEMORY_FEATURE_* bits the kind honours (ModuleContext::memory).
  PluginBuilder& module(const std::string& kind, uint32_t memory_features = 0) {
    smp_module_kind k{};
    k.struct_size = SMP_MODULE_KIND_STRUCT_SIZE;
    k.memory_features = memory_features;  // for hosts before 2.5
    k.name = keep(kind);
    if (memory_features) {
      smp_kind_memory m{};
      m.struct_size = SMP_KIND_MEMORY_STRUCT_SIZE;
      m.kind = k.name;
      m.features = memory_features;
      kind_memory_.push_back(m);
    }
    k.create = &detail::ModuleKindTable<T>::create;
    k.forward = &detail::ModuleKindTable<T>::forward;
    k.parameters = &detail::ModuleKindTable<T>::parameters;
    k.destroy = &detail::ModuleKindTable<T>::destroy;
    kinds_.push_back(k);
    return *this;
  }

  // What a registered kind does outside training (ABI 2.7): SMP_INFERENCE_*
  // flags for one method, or every method when `method` is empty.
  PluginBuilder& inference(const std::string& kind, uint32_t flags, const std::string& method = "") {
    kind_inference(kind, method).flags |= flags;
    return *this;
  }
  // The method's output `output` is left sharded over mesh `axis` along `dim`
  // (a vocabulary-parallel head's logits): the host gathers it for a program.
  PluginBuilder& sharded_output(const std::string& kind, const std::string& method, int32_t output,
                                const std::string& axis, int32_t dim) {
    smp_kind_inference& k = kind_inference(kind, method);
    k.sharded_output = output;
    k.shard_axis = keep(axis);
    k.shard_dim = dim;
    return *this;
  }

  // A module kind made by a function instead of a class's constructor: the
  // function may hold state (a program's own modules, see torch_module.hpp).
  PluginBuilder& module(const std::string& kind, ModuleFactory factory, uint32_t memory_features = 0) {
    module<Module>(kind, memory_features);
    smp_module_kind& k = kinds_.back();
    k.state = &module_factories_.emplace_back(std::move(factory));  // ModuleKindTable<Module>::create calls it
    return *this;
  }

  // An adapter made by a function (it may hold state: a program's model description).
  PluginBuilder& adapter(const std::string& name, AdapterFactory factory) {
    adapter<Adapter>(name);
    smp_model_adapter& a = adapters_.back();
    a.state = &adapter_factories_.emplace_back(std::move(factory));
    return *this;
  }

  template <class T>
  PluginBuilder& adapter(const std::string& name) {
    smp_model_adapter a{};
    a.struct_size = SMP_MODEL_ADAPTER_STRUCT_SIZE;
    a.name = keep(name);
    a.create = &detail::AdapterTable<T>::create;
    a.describe = &detail::AdapterTable<T>::describe;
    a.batch = &detail::AdapterTable<T>::batch;
    a.destroy = &detail::AdapterTable<T>::destroy;
    adapters_.push_back(a);
    return *this;
  }

  PluginBuilder& partitioner(const std::string& name, PartitionFn fn) {
    smp_partition_strategy s{};
    s.struct_size = SMP_PARTITION_STRATEGY_STRUCT_SIZE;
    s.name = keep(name);
    s.state = reinterpret_cast<void*>(fn);
    s.partition = &partition_thunk;
    partitioners_.push_back(s);
    return *this;
  }

  // When mesh axis `axis` ("tp", "ep") has more than one rank, nodes of `kind`
  // become `dist_kind` (after `check` accepts their config). param_split /
  // activation_split: the fractions of the node's parameter and activation
  // bytes that dist_kind splits over the axis (for the memory model; default all).
  PluginBuilder& rule(const std::string& axis, const std::string& kind, const std::string& dist_kind,
                      RuleCheckFn check = nullptr, double param_split = 1.0, double activation_split = 1.0) {
    smp_rule r{};
    r.struct_size = SMP_RULE_STRUCT_SIZE;
    r.axis = keep(axis);
    r.kind = keep(kind);
    r.dist_kind = keep(dist_kind);
    r.state = reinterpret_cast<void*>(check);
    r.check = check ? &check_thunk : nullptr;
    r.param_split = param_split;  // for hosts before 2.5
    r.activation_split = activation_split;
    rules_.push_back(r);
    if (param_split != 1.0 || activation_split != 1.0) {
      smp_rule_memory m{};
      m.struct_size = SMP_RULE_MEMORY_STRUCT_SIZE;
      m.axis = r.axis;
      m.kind = r.kind;
      m.param_split = param_split;
      m.activation_split = activation_split;
      rule_memory_.push_back(m);
    }
    return *this;
  }
  // An optimizer kind (ABI 2.3), listed in the descriptor's SMP_EXTENSION_OPTIMIZERS extension.
  template <class T>
  PluginBuilder& optimizer(const std::string& name) {
    smp_optimizer_kind k{};
    k.struct_size = SMP_OPTIMIZER_KIND_STRUCT_SIZE;
    k.name = keep(name);
    k.state = const_cast<char*>(k.name);
    k.create = &detail::OptimizerKindTable<T>::create;
    k.step = &detail::OptimizerKindTable<T>::step;
    k.state_tensors = &detail::OptimizerKindTable<T>::state;
    k.destroy = &detail::OptimizerKindTable<T>::destroy;
    optimizers_.push_back(k);
    return *this;
  }

  // A table of the job configuration this plugin owns (ABI 2.5's
  // SMP_EXTENSION_CONFIG), e.g. [tp]: the core hands it to `check` once the
  // plugins are loaded, and modules read it with ModuleContext::table(name).
  PluginBuilder& config_table(const std::string& name, TableCheckFn check) {
    smp_config_table t{};
    t.struct_size = SMP_CONFIG_TABLE_STRUCT_SIZE;
    t.name = keep(name);
    t.state = reinterpret_cast<void*>(check);
    t.check = &table_check_thunk;
    tables_.push_back(t);
    return *this;
  }

  PluginBuilder& tp_rule(const std::string& kind, const std::string& dist_kind, RuleCheckFn check = nullptr,
                         double param_split = 1.0, double activation_split = 1.0) {
    return rule("tp", kind, dist_kind, check, param_split, activation_split);
  }

  // The entry point refuses a host whose extension chain lacks `type`, with an
  // error naming `name` (an extension this plugin cannot work without).
  PluginBuilder& require_host_extension(uint32_t type, const std::string& name) {
    required_.emplace_back(type, name);
    return *this;
  }
  // Appends an extension to the descriptor's chain; `ext` must outlive the
  // plugin (a static) and start with smp_extension_base.
  PluginBuilder& extension(smp_extension_base* ext) {
    extensions_.push_back(ext);
    return *this;
  }
  const std::vector<std::pair<uint32_t, std::string>>& required_host_extensions() const { return required_; }
  const std::string& descriptor_name() const { return name_; }

  // Valid as long as the builder lives (the macro keeps it in a static).
  const smp_plugin_descriptor* descriptor() {
    point_at(kinds_, kind_ptrs_);
    point_at(adapters_, adapter_ptrs_);
    point_at(partitioners_, partitioner_ptrs_);
    point_at(rules_, rule_ptrs_);
    if (!optimizers_.empty()) {
      point_at(optimizers_, optimizer_ptrs_);
      optimizers_ext_ = smp_optimizers_extension{};
      optimizers_ext_.base = extension_base(SMP_OPTIMIZERS_EXTENSION_STRUCT_SIZE, SMP_EXTENSION_OPTIMIZERS);
      optimizers_ext_.kinds = optimizer_ptrs_.data();
      optimizers_ext_.n_kinds = optimizer_ptrs_.size();
      extensions_.push_back(&optimizers_ext_.base);
    }
    if (!tables_.empty()) {
      point_at(tables_, table_ptrs_);
      config_ext_ = smp_config_extension{};
      config_ext_.base = extension_base(SMP_CONFIG_EXTENSION_STRUCT_SIZE, SMP_EXTENSION_CONFIG);
      config_ext_.tables = table_ptrs_.data();
      config_ext_.n_tables = table_ptrs_.size();
      extensions_.push_back(&config_ext_.base);
    }
    // The memory contract as the 2.5 extension (the 2.1 fields say the same to older hosts).
    if (!kinds_.empty() || !rules_.empty()) {
      point_at(kind_memory_, kind_memory_ptrs_);
      point_at(rule_memory_, rule_memory_ptrs_);
      memory_ext_ = smp_memory_extension{};
      memory_ext_.base = extension_base(SMP_MEMORY_EXTENSION_STRUCT_SIZE, SMP_EXTENSION_MEMORY);
      memory_ext_.kinds = kind_memory_ptrs_.data();
      memory_ext_.n_kinds = kind_memory_ptrs_.size();
      memory_ext_.rules = rule_memory_ptrs_.data();
      memory_ext_.n_rules = rule_memory_ptrs_.size();
      extensions_.push_back(&memory_ext_.base);
    }
    if (!kind_inference_.empty()) {
      point_at(kind_inference_, kind_inference_ptrs_);
      inference_ext_ = smp_inference_extension{};
      inference_ext_.base = extension_base(SMP_INFERENCE_EXTENSION_STRUCT_SIZE, SMP_EXTENSION_INFERENCE);
      inference_ext_.kinds = kind_inference_ptrs_.data();
      inference_ext_.n_kinds = kind_inference_ptrs_.size();
      extensions_.push_back(&inference_ext_.base);
    }
    for (size_t i = 0; i + 1 < extensions_.size(); ++i) extensions_[i]->next = extensions_[i + 1];
    d_ = smp_plugin_descriptor{};
    d_.struct_size = SMP_PLUGIN_DESCRIPTOR_STRUCT_SIZE;
    d_.name = name_.c_str();
    d_.plugin_version = version_.c_str();
    d_.abi_major = SMP_ABI_VERSION_MAJOR;
    d_.abi_minor = SMP_ABI_VERSION_MINOR;
    d_.torch_version = TORCH_VERSION;
    d_.module_kinds = kind_ptrs_.data();
    d_.n_module_kinds = kind_ptrs_.size();
    d_.adapters = adapter_ptrs_.data();
    d_.n_adapters = adapter_ptrs_.size();
    d_.partitioners = partitioner_ptrs_.data();
    d_.n_partitioners = partitioner_ptrs_.size();
    d_.rules = rule_ptrs_.data();
    d_.n_rules = rule_ptrs_.size();
    d_.extension_start = extensions_.empty() ? nullptr : extensions_.front();
    return &d_;
  }

 private:
  const char* keep(const std::string& s) { return strings_.emplace_back(s).c_str(); }
  smp_kind_inference& kind_inference(const std::string& kind, const std::string& method) {
    for (auto& k : kind_inference_)
      if (kind == k.kind && method == (k.method ? k.method : "")) return k;
    smp_kind_inference k{};
    k.struct_size = SMP_KIND_INFERENCE_STRUCT_SIZE;
    k.kind = keep(kind);
    k.method = method.empty() ? nullptr : keep(method);
    k.sharded_output = -1;
    return kind_inference_.emplace_back(k);
  }
  template <class T>
  static void point_at(std::deque<T>& items, std::vector<const T*>& pointers) {
    for (auto& item : items) pointers.push_back(&item);
  }
  static smp_extension_base extension_base(size_t struct_size, uint32_t type) {
    smp_extension_base b{};
    b.struct_size = struct_size;
    b.type = type;
    b.version = 1;
    return b;
  }

  static smp_error* partition_thunk(void* state, const smp_partition_request* r) {
    return guard([&] {
      PartitionRequest req;
      req.graph = CostGraph::from(r->graph);
      req.num_stages = r->num_stages;
      if (r->options_json && *r->options_json) req.options = nlohmann::json::parse(r->options_json);
      req.tie_across_stages = r->tie_across_stages != 0;
      auto stages = reinterpret_cast<PartitionFn>(state)(req);
      if (stages.size() != req.graph.nodes.size())
        throw Error(SMP_ERR_INTERNAL, "partitioner returned " + std::to_string(stages.size()) +
                                          " stages for " + std::to_string(req.graph.nodes.size()) + " nodes");
      for (size_t i = 0; i < stages.size(); ++i) r->stage_of_node[i] = stages[i];
    });
  }
  static smp_error* check_thunk(void* state, const char* config_json, int32_t tp_size) {
    return guard([&] {
      Json cfg = (config_json && *config_json) ? Json::parse(config_json) : Json::object();
      reinterpret_cast<TpCheckFn>(state)(cfg, tp_size);
    });
  }

  static smp_error* table_check_thunk(void* state, const char* table_json) {
    return guard([&] {
      Json table = (table_json && *table_json) ? Json::parse(table_json) : Json::object();
      reinterpret_cast<TableCheckFn>(state)(table);
    });
  }

  std::string name_, version_;
  std::deque<std::string> strings_;
  std::deque<ModuleFactory> module_factories_;    // smp_module_kind::state of factory kinds
  std::deque<AdapterFactory> adapter_factories_;  // smp_model_adapter::state of factory adapters
  std::deque<smp_module_kind> kinds_;
  std::deque<smp_model_adapter> adapters_;
  std::deque<smp_partition_strategy> partitioners_;
  std::deque<smp_rule> rules_;
  std::deque<smp_optimizer_kind> optimizers_;
  std::vector<const smp_optimizer_kind*> optimizer_ptrs_;
  smp_optimizers_extension optimizers_ext_{};
  std::deque<smp_config_table> tables_;
  std::vector<const smp_config_table*> table_ptrs_;
  smp_config_extension config_ext_{};
  std::deque<smp_kind_memory> kind_memory_;
  std::deque<smp_rule_memory> rule_memory_;
  std::vector<const smp_kind_memory*> kind_memory_ptrs_;
  std::vector<const smp_rule_memory*> rule_memory_ptrs_;
  smp_memory_extension memory_ext_{};
  std::deque<smp_kind_inference> kind_inference_;
  std::vector<const smp_kind_inference*> kind_inference_ptrs_;
  smp_inference_extension inference_ext_{};
  std::vector<std::pair<uint32_t, std::string>> required_;
  std::vector<smp_extension_base*> extensions_;
  std::vector<const smp_module_kind*> kind_ptrs_;
  std::vector<const smp_model_adapter*> adapter_ptrs_;
  std::vector<const smp_partition_strategy*> partitioner_ptrs_;
  std::vector<const smp_rule*> rule_ptrs_;
  smp_plugin_descriptor d_{};
};

namespace detail {
// Checks the host before anything else touches it. A host of another major:
// the descriptor goes back untouched, for the host to refuse by name (the
// version prefix of the descriptor is the same in every major).
enum class HostCheck { Accept, OtherMajor, Refuse };
inline HostCheck check_host(const smp_host_api* host, smp_error** error) {
  if (error) *error = nullptr;
  if (!host) return HostCheck::Refuse;
  if (host->abi_major != SMP_ABI_VERSION_MAJOR) return HostCheck::OtherMajor;
  // Features, not the minor: the 2.0 table is what the SDK calls without a
  // check; a function added later is checked where it is called (SMP_HAS_FIELD).
  if (host->struct_size < SMP_HOST_API_STRUCT_SIZE_2_0) {
    if (error)
      *error = host->error_create(
          SMP_ERR_UNSUPPORTED, ("plugin needs a host table of at least " + std::to_string(SMP_HOST_API_STRUCT_SIZE_2_0) +
                                " bytes (ABI 2.0's), host has " + std::to_string(host->struct_size))
                                   .c_str());
    return HostCheck::Refuse;
  }
  host_slot() = host;
  return HostCheck::Accept;
}
// The host extensions the builder requires: an error naming the first missing one.
inline bool has_required_extensions(const PluginBuilder& b, const smp_host_api* host, smp_error** error) {
  for (const auto& [type, name] : b.required_host_extensions())
    if (!find_extension(host->extension_start, type)) {
      if (error)
        *error = host->error_create(SMP_ERR_UNSUPPORTED,
                                    ("plugin needs the host extension '" + name + "' (type " + std::to_string(type) +
                                     "), which this smp core (ABI " + std::to_string(host->abi_major) + "." +
                                     std::to_string(host->abi_minor) + ") does not provide")
                                        .c_str());
      return false;
    }
  return true;
}
}  // namespace detail
}  // namespace smp::sdk

#define SMP_PLUGIN_EXPORT extern "C" __attribute__((visibility("default")))

// Defines the plugin's one entry symbol from a PluginBuilder expression.
#define SMP_PLUGIN(builder_expr)                                                                 \
  SMP_PLUGIN_EXPORT const smp_plugin_descriptor* smp_plugin_entry(const smp_host_api* host,      \
                                                                  smp_error** error) {           \
    using ::smp::sdk::detail::HostCheck;                                                         \
    const HostCheck verdict = ::smp::sdk::detail::check_host(host, error);                       \
    if (verdict == HostCheck::Refuse) return nullptr;                                            \
    try {                                                                                        \
      static ::smp::sdk::PluginBuilder smp_plugin_builder_instance = std::move(builder_expr);    \
      static const smp_plugin_descriptor* smp_plugin_descriptor_instance =                       \
          smp_plugin_builder_instance.descriptor();                                              \
      if (verdict == HostCheck::OtherMajor) return smp_plugin_descriptor_instance;               \
      if (!::smp::sdk::detail::has_required_extensions(smp_plugin_builder_instance, host, error))\
        return nullptr;                                                                          \
      return smp_plugin_descriptor_instance;                                                     \
    } catch (const std::exception& e) {                                                          \
      if (error && verdict == HostCheck::Accept)                                                 \
        *error = host->error_create(SMP_ERR_INTERNAL, ::smp::sdk::plugin_exception_message(e).c_str()); \
      return nullptr;                                                                            \
    }                                                                                            \
  }
