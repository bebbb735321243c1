// One module created from a plugin's module kind, called over at::Tensors.
#pragma once

#include <smp/abi.h>
#include <smp/batch.h>
#include <smp/plugin_registry.h>

#include "mesh/placement.h"

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <memory>
#include <string>
#include <vector>

namespace smp::sdk {
struct InitSpec;  // smp/sdk/init.hpp
}

namespace smp {

struct ModuleParameter {
  std::string name;  // "<module key>.<local name>", e.g. "blocks.0.attn.q.weight"
  at::Tensor tensor;
  Placements placements;
  // Deferred init (ABI 2.2): the tensor has no storage yet, this says how to
  // fill it (see ShardedParameters, which fills only the dp shard). Else null.
  std::shared_ptr<const sdk::InitSpec> init;
  // ABI 2.6 SMP_PARAM_FLAG_BUFFER: state the module updates itself, never
  // trained (requires_grad false); checkpointed, and sent from the first
  // data-parallel replica to the others before each step.
  bool buffer = false;
};

// The context a module is created under, for the runtime and the cost
// profiler alike. The strings are borrowed: they must outlive the create call.
// mesh null = a one-rank mesh.
// memory_json: what the memory manager asks of the module ("{}": nothing); borrowed like the strings.
// extensions: the context's chain (SMP_EXTENSION_JOB_TABLES), borrowed likewise.
smp_module_context module_context(const std::string& key, uint64_t init_seed, smp_mesh* mesh,
                                  const std::string& parallel_json,
                                  const c10::Device& device = c10::Device(c10::kCPU),
                                  const char* memory_json = "{}",
                                  const smp_extension_base* extensions = nullptr);

// What a module is created with, in C++ terms (the plugin layer makes the
// smp_module_context and its extensions from it).
struct ModuleSetup {
  uint64_t init_seed = 0;
  smp_mesh* mesh = nullptr;  // the job's groups (ProcessGroups::handle); null: one rank
  std::string parallel_json = "{}";
  c10::Device device = c10::Device(c10::kCPU);
  std::string memory_json = "{}";  // what the memory manager asks of the module
  std::string tables_json;         // the job's plugin tables (SMP_EXTENSION_JOB_TABLES); empty: none
};

// What a loaded kind declares it can do (its SMP_MEMORY_FEATURE_* bits).
bool kind_defers_init(const PluginRegistry& registry, const std::string& kind);
bool kind_recomputes_attention_core(const PluginRegistry& registry, const std::string& kind);
// Whether its `method` can be fed one new position at a time: it works position
// by position or keeps a KV cache (SMP_INFERENCE_POSITIONWISE / _DECODE).
bool kind_decodes(const PluginRegistry& registry, const std::string& kind, const std::string& method);

class ModuleInstance {
 public:
  // A module of the loaded kind `kind`, from the plugin that provides it.
  // Errors name the plugin, the kind and the node; an unknown kind is refused naming it.
  ModuleInstance(const PluginRegistry& registry, const std::string& kind, std::string key,
                 const std::string& config_json, const ModuleSetup& setup);
  // Errors name the plugin, the kind and the node.
  ModuleInstance(const smp_module_kind* kind, std::string plugin, std::string key, const std::string& config_json,
                 const smp_module_context& context);
  ~ModuleInstance();
  ModuleInstance(const ModuleInstance&) = delete;
  ModuleInstance& operator=(const ModuleInstance&) = delete;

  std::vector<at::Tensor> call(const std::string& node_name, const std::string& method,
                               const std::vector<at::Tensor>& inputs, size_t n_outputs, bool training,
                               uint64_t rng_seed, const DecodePositions* decode = nullptr);

  const std::vector<ModuleParameter>& parameters() const { return params_; }
  const std::string& key() const { return key_; }
  const std::string& kind_name() const { return kind_name_; }

 private:
  struct SetupContext;
  std::string where(const std::string& node, const std::string& call) const;
  const smp_module_kind* kind_;
  std::string plugin_, key_, kind_name_;
  c10::Device device_;  // the context's: a call seeds its default generator (CUDA)
  smp_module* module_ = nullptr;
  std::vector<ModuleParameter> params_;
};

}  // namespace smp
