// Loads plugin shared objects through the ABI and indexes what they provide.
#pragma once

#include <smp/plugin_source.h>

#include <nlohmann/json.hpp>

#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

// The C tables a plugin registers (smp/abi.h), by name only: the registry keeps
// them, and only the core's plugin layer (PluginTables, plugin/plugin_tables.h)
// reads them; everything else goes through its C++ instances.
struct smp_module_kind;
struct smp_model_adapter;
struct smp_partition_strategy;
struct smp_optimizer_kind;
struct smp_rule;
struct smp_config_table;

// Exported from libsmp_core (built with hidden visibility): the public API.
#pragma GCC visibility push(default)
namespace smp {

class PluginTables;

struct PluginInfo {
  std::string path;
  std::string name;
  std::string version;
  uint32_t abi_major = 0;
  uint32_t abi_minor = 0;
  std::string torch_version;
  std::vector<std::string> module_kinds, adapters, partitioners, optimizers;
  std::vector<std::string> rules;  // "<axis>:<kind>", e.g. "tp:linear"
  std::vector<std::string> tables;  // configuration tables it owns (SMP_EXTENSION_CONFIG), e.g. "tp"
};

// What a rule's distributed kind splits over its axis, for the memory model:
// fractions of a node's parameter and activation bytes.
struct MemorySplit {
  double params = 1.0, activations = 1.0;
};

// What a kind does outside training (SMP_EXTENSION_INFERENCE, ABI 2.7), for one method.
struct KindInference {
  uint32_t flags = 0;        // SMP_INFERENCE_* bits
  int sharded_output = -1;   // an output left sharded over shard_axis along shard_dim; -1: none
  std::string shard_axis;
  int shard_dim = 0;
};

class PluginRegistry {
 public:
  PluginRegistry();
  ~PluginRegistry();
  PluginRegistry(const PluginRegistry&) = delete;
  PluginRegistry& operator=(const PluginRegistry&) = delete;

  // Loads a plugin given by path (contains '/') or by file name ("gpt.so" or
  // "gpt"), searched in SMP_PLUGIN_PATH, then the install's plugin folder.
  // Loading the same file twice is a no-op. Refusals throw smp::Error naming the
  // file and the versions involved; the registry is left unchanged.
  const PluginInfo& load(const std::string& path_or_name);
  // The same, but a plugin providing a capability that a loaded plugin already
  // provides is not loaded: returns nullptr (the standard plugins yield so to a
  // user's replacement). Every other refusal throws as load() does.
  const PluginInfo* load_unless_provided(const std::string& path_or_name);
  // Registers a plugin defined in the program (no shared object, no dlopen):
  // its entry is called like a file's exported smp_plugin_entry, and the
  // descriptor gets the same checks and refusals. PluginInfo::path is
  // "in process: <label>"; a label already registered is refused.
  const PluginInfo& add(const std::string& label, const PluginEntry& entry);
  // A file or an in-process plugin, whichever `source` is.
  const PluginInfo& load_source(const PluginSource& source);

  // Where a name is looked for, in order.
  static std::vector<std::string> search_path();
  // The file a name resolves to; throws listing the folders searched.
  static std::string resolve(const std::string& path_or_name);

  // Whether a loaded plugin provides each capability.
  bool has_module_kind(const std::string& kind) const;
  bool has_adapter(const std::string& name) const;
  bool has_partitioner(const std::string& name) const;
  bool has_optimizer(const std::string& name) const;
  // Whether a rule maps `kind` on mesh axis `axis` ("tp", "ep").
  bool has_rule(const std::string& axis, const std::string& kind) const;
  // The memory contract (SMP_EXTENSION_MEMORY, or the 2.1 fields of a plugin
  // without it): SMP_MEMORY_FEATURE_* bits of a kind (0 if unknown), and what a
  // rule splits (everything when it does not say).
  uint32_t memory_features(const std::string& kind) const;
  MemorySplit memory_split(const std::string& axis, const std::string& kind) const;
  // What `kind` declares for `method` (its declarations for every method, and
  // for this one); nothing for a kind that declares nothing.
  KindInference inference(const std::string& kind, const std::string& method) const;
  // The job's plugin tables (Config::plugin_tables), each checked by the plugin
  // that declares it; every declared table is checked, "{}" when not given.
  // Returns them all by name (the modules' SMP_EXTENSION_JOB_TABLES). Throws
  // naming `origin` and the table when none declares it or its owner refuses it.
  nlohmann::json check_tables(const nlohmann::json& given, const std::string& origin) const;
  // The plugin that registered a capability, for messages ("" if none).
  std::string provider(const std::string& capability_name) const;
  // type: "module kind", "adapter", "partition strategy", "optimizer", "config table" or "<axis> rule" ("tp rule").
  std::string provider(const std::string& type, const std::string& name) const;

  std::vector<std::string> module_kinds() const;
  std::vector<std::string> adapters() const;
  std::vector<std::string> partitioners() const;
  std::vector<std::string> optimizers() const;
  // In load order. A deque: references returned by load() stay valid.
  const std::deque<PluginInfo>& plugins() const { return infos_; }

 private:
  friend class PluginTables;  // the C tables, for the plugin layer only
  struct Library;
  const PluginInfo* load(const std::string& path_or_name, bool unless_provided);
  const PluginInfo* admit(const smp_plugin_descriptor* d, const std::string& path, bool unless_provided);
  void check_capabilities(const smp_plugin_descriptor* d, PluginInfo& info, const std::string& who) const;
  void register_capabilities(const smp_plugin_descriptor* d, const PluginInfo& info);
  std::vector<std::unique_ptr<Library>> libraries_;
  std::vector<PluginEntry> entries_;  // in-process plugins' entries: they keep their descriptors alive
  std::deque<PluginInfo> infos_;
  std::map<std::string, const smp_module_kind*> kinds_;
  std::map<std::string, const smp_model_adapter*> adapters_;
  std::map<std::string, const smp_partition_strategy*> partitioners_;
  std::map<std::string, const smp_rule*> rules_;  // by "<axis>:<kind>"
  std::map<std::string, const smp_optimizer_kind*> optimizers_;
  std::map<std::string, const smp_config_table*> tables_;
  std::map<std::string, uint32_t> features_;    // by module kind
  std::map<std::string, MemorySplit> splits_;   // by "<axis>:<kind>"
  std::map<std::string, KindInference> inference_;  // by "<kind>:<method>" ("<kind>:" for every method)
  std::map<std::string, std::string> providers_;  // "kind:x" / "adapter:x" / ... -> plugin name
};

}  // namespace smp
#pragma GCC visibility pop
