// The job's configuration as types, read once from a validated Config
// (JobConfig::from): the runtime and the training loop read these fields, not
// string keys. Adding a key means adding it to the schema (config.cpp) and here.
#pragma once

#include <smp/config.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

// Exported from libsmp_core (built with hidden visibility): the public API.
#pragma GCC visibility push(default)
namespace smp {

struct ParallelConfig {
  int pp = 1, dp = 1, tp = 1, ep = 1;
  int microbatches = 1;
  std::string schedule = "1f1b";
  int virtual_stages = 1;
  std::string partition = "balanced";
  std::string placement = "pp,dp,tp";  // every dimension, slowest first (after resolve_layout)
  std::vector<std::pair<std::string, int>> axes;  // the job's own dimensions (parallel.axes), in name order
  std::vector<std::pair<std::string, std::vector<std::string>>> flatten;  // derived joins (parallel.flatten)
  bool sequence_parallel = false;
  bool tie_across_stages = true;
  bool tp_replicate_indivisible = false;
};

// The memory manager's options (parallel.zero / memory.*; see core/src/memory/).
struct MemoryConfig {
  int zero = 0;  // 0-3: what is sharded over dp (parallel.zero, or memory.shard by name)
  std::vector<std::string> checkpoint;  // node kinds, names or name prefixes
  int checkpoint_every = 1;
  std::vector<std::string> checkpoint_attention_core;  // nodes recomputing only their attention core
  bool offload = false;    // checkpointed nodes' inputs in host memory between forward and backward (CUDA)
  int offload_horizon = 4;  // backward passes ahead that offloaded inputs are loaded back
};

enum class Precision { Fp32, Bf16, Fp16 };
const char* to_string(Precision p);  // "fp32", "bf16", "fp16"

struct TrainConfig {
  int64_t steps = 10, batch_size = 8;
  uint64_t seed = 1234;
  double lr = 3e-4, min_lr = 3e-5;
  int64_t warmup_steps = 0;
  std::string optimizer = "adamw";  // an optimizer kind of a loaded plugin
  double weight_decay = 0.1, grad_clip = 1.0;
  int64_t val_every = 0, val_batches = 2, log_every = 1;
  int64_t bucket_bytes = 4 << 20;
  // Mixed precision (train.precision, train.grad_reduce_dtype; see core/src/optim/mixed_precision.h).
  Precision precision = Precision::Fp32;
  Precision grad_reduce = Precision::Fp32;
  double initial_loss_scale = 65536.0;  // fp16 only
  int64_t loss_scale_window = 1000;
  double min_loss_scale = 1.0;
};

enum class DeviceKind { Cpu, Cuda };

struct RunConfig {
  std::string dir = "runs/default";
  bool log_to_file = true;
  double timeout_s = 300;
  int threads = 0;
  DeviceKind device = DeviceKind::Cpu;  // run.device, "auto" resolved
  std::vector<int> devices;             // run.devices: CUDA index per local rank (empty = LOCAL_RANK)
  bool dump_parameters = false;
  bool trace = false;                          // run.trace
  int64_t trace_first = 1, trace_last = 3;     // run.trace_steps, 1-based, inclusive
  bool trace_merge = false;                    // run.trace_merge
  bool profile_ops = false;                    // run.profile_ops (over run.trace_steps)
};

struct JobConfig {
  ParallelConfig parallel;
  MemoryConfig memory;
  TrainConfig train;
  RunConfig run;
  int64_t shm_slot_bytes = int64_t{16} << 20;  // comm.shm_mb
  std::string cuda_backend = "auto";           // comm.cuda_backend
  std::vector<std::string> plugin_paths;       // plugins.paths
  std::string adapter;                         // model.adapter ("" = the first loaded)
  nlohmann::json model = nlohmann::json::object();      // [model] without "adapter", for the adapter
  nlohmann::json partition = nlohmann::json::object();  // [partition], for the strategy
  // [optimizer], for train.optimizer's kind; for "adamw" with train.beta1,
  // beta2 and eps filled in where the table does not give them.
  nlohmann::json optimizer = nlohmann::json::object();
  nlohmann::json parallel_json = nlohmann::json::object();  // [parallel], for modules
  std::string origin;                          // the file, for messages

  // From a config whose layout is resolved (Config::resolve_layout). run.device
  // "auto" is the CPU unless this build has CUDA and a device is present;
  // "cuda" in a build without CUDA is an error naming run.device.
  static JobConfig from(const Config& config);
};

}  // namespace smp
#pragma GCC visibility pop
