// The job's configuration as types, read once from a validated Config
// (JobConfig::from): the runtime and the training loop read these fields, not
// string keys. The fields, their types and defaults are generated from the key
// lists in config_keys.h, which the schema is generated from too: a key is
// added there, once.
#pragma once

#include <smp/config.h>
#include <smp/config_keys.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

// Exported from libsmp_core (built with hidden visibility): the public API.
#pragma GCC visibility push(default)
namespace smp {

using Strings = std::vector<std::string>;
using Ints = std::vector<int64_t>;
using DeviceList = std::vector<int>;                                     // a CUDA index per local rank
using AxisSizes = std::vector<std::pair<std::string, int>>;              // name -> size, in name order
using AxisJoins = std::vector<std::pair<std::string, std::vector<std::string>>>;  // name -> dimensions

enum class Precision { Fp32, Bf16, Fp16 };
const char* to_string(Precision p);  // "fp32", "bf16", "fp16"

// Auto is resolved by JobConfig::from: the CPU unless this build has CUDA and
// a device is present.
enum class DeviceKind { Auto, Cpu, Cuda };
const char* to_string(DeviceKind d);  // "auto", "cpu", "cuda"

#define SMP_CONFIG_FIELD(field, key, type, check, def, presence, doc) type field = def;

struct ParallelConfig {
  SMP_PARALLEL_KEYS(SMP_CONFIG_FIELD)
  // after resolve_layout: dp derived; placement names every dimension, slowest first
};

// The memory manager's options (parallel.zero / memory.*; see core/src/memory/).
// zero is the stage whichever key gave it (memory.shard by name resolves to it).
struct MemoryConfig {
  SMP_MEMORY_KEYS(SMP_CONFIG_FIELD)
};

struct TrainConfig {
  SMP_TRAIN_KEYS(SMP_CONFIG_FIELD)
  int64_t bucket_bytes() const { return static_cast<int64_t>(bucket_mb * 1024 * 1024); }
};

struct RunConfig {
  SMP_RUN_KEYS(SMP_CONFIG_FIELD)
  int64_t trace_first() const { return trace_steps.at(0); }  // 1-based, inclusive
  int64_t trace_last() const { return trace_steps.at(1); }
};

struct CommConfig {
  SMP_COMM_KEYS(SMP_CONFIG_FIELD)
  int64_t shm_slot_bytes() const { return static_cast<int64_t>(shm_mb * 1024 * 1024); }
};

struct PluginsConfig {
  SMP_PLUGINS_KEYS(SMP_CONFIG_FIELD)
};

#undef SMP_CONFIG_FIELD

struct JobConfig {
  ParallelConfig parallel;
  MemoryConfig memory;
  TrainConfig train;
  RunConfig run;
  CommConfig comm;
  PluginsConfig plugins;
  std::string adapter;                         // model.adapter ("" = the first loaded)
  nlohmann::json model = nlohmann::json::object();      // [model] without "adapter", for the adapter
  nlohmann::json partition = nlohmann::json::object();  // [partition], for the strategy
  // [optimizer], for train.optimizer's kind; for "adamw" with train.beta1,
  // beta2 and eps filled in where the table does not give them.
  nlohmann::json optimizer = nlohmann::json::object();
  nlohmann::json parallel_json = nlohmann::json::object();  // [parallel], for modules
  // The tables loaded plugins own (SMP_EXTENSION_CONFIG), by name, as given:
  // each checked by its plugin once the plugins are loaded.
  nlohmann::json plugin_tables = nlohmann::json::object();
  std::string origin;                          // the file, for messages
  // The config these were read from by from() (layout resolved, overrides
  // applied): what Runtime::config() returns and a checkpoint records. The
  // runtime holds this one object; every part reads the typed fields above.
  std::optional<Config> source;

  // From a config whose layout is resolved (Config::resolve_layout). run.device
  // "auto" is the CPU unless this build has CUDA and a device is present;
  // "cuda" in a build without CUDA is an error naming run.device.
  static JobConfig from(const Config& config);
};

}  // namespace smp
#pragma GCC visibility pop
