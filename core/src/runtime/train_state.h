// Everything a rank holds between steps, in one object: its modules and their
// parameters (global name, placement per axis), the gradient buckets, ZeRO's
// shards, the fp32 masters, the optimizer (a plugin's kind) and its state,
// the loss scaler and the step counters. It lists itself as slices of global
// tensors (StateEntry), the form a checkpoint is written in, and loads such a
// list back.
#pragma once

#include <smp/job_config.h>
#include <smp/runtime.h>

#include "mesh/placement.h"

#include <ATen/core/Tensor.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace smp::sdk {
struct InitSpec;  // smp/sdk/init.hpp
}  // namespace smp::sdk

namespace smp {

class Communicator;
class DynamicLossScaler;
class GradientSync;
class MasterWeights;
class ModelPlan;
class ModuleInstance;
class OptimizerInstance;
class ParallelContext;
class ShardedParameters;
class BufferSync;

class TrainState {
 public:
  // Creates this rank's modules (ZeRO-3: parameters without storage where the
  // kind can defer init), casts them to the compute dtype, lays out the
  // gradient buckets and shards and makes the optimizer.
  TrainState(const JobConfig& job, const ParallelContext& context, const ModelPlan& model);
  ~TrainState();
  TrainState(const TrainState&) = delete;
  TrainState& operator=(const TrainState&) = delete;

  // The entries, in a fixed order; tensors are views of the live state.
  std::vector<StateEntry> entries() const;
  // Copies `saved` (entries() of a runtime of the same job and layout) into
  // the live state. Throws naming the first entry missing, extra or unlike.
  void load(const std::vector<StateEntry>& saved);
  // Lets `fill` write the live state in place: it gets entries() (views; the
  // counters as 0-d copies whose values it may set), then the counters are
  // taken from them. For loaders that assemble entries themselves (checkpoints).
  void load_with(const std::function<void(const std::vector<StateEntry>&)>& fill);

  // This rank's modules by key.
  const std::map<std::string, std::shared_ptr<ModuleInstance>>& modules() const { return modules_; }
  std::vector<ParameterView> parameters() const;  // as held now: no gather
  void gather_parameters();                       // ZeRO-3: every unit gathered
  void release_parameters();                      // ZeRO-3: every unit freed
  // Buffers (module-updated state) from the first data-parallel replica to the others (BufferSync).
  void sync_buffers();

  GradientSync& sync() const { return *sync_; }
  ShardedParameters* sharded() const { return sharded_.get(); }  // ZeRO >= 1, else null
  MasterWeights* masters() const { return masters_.get(); }      // ZeRO 0 with 16-bit compute, else null
  DynamicLossScaler* scaler() const { return scaler_.get(); }     // fp16, else null
  OptimizerInstance& optimizer() const { return *optimizer_; }
  // Updates applied so far (the optimizer's step count; a skipped fp16 step is none).
  int64_t updates() const { return updates_; }
  void count_update() { ++updates_; }
  // The gradients the optimizer's tensors take (after the step's sync), and
  // which of them this rank counts in the global norm.
  std::vector<at::Tensor> gradients() const;
  const std::vector<bool>& norm_counted() const;

  int64_t steps() const { return steps_; }
  void step_done() { ++steps_; }
  // See Runtime::parameter_init_peak.
  int64_t parameter_init_peak() const { return parameter_init_peak_; }
  // See Runtime::parameter_count: the elements of the trainable parameters
  // this rank writes whole to a checkpoint (one replica of each value: a tied
  // module on its first pp rank only), summed over the ranks once each.
  int64_t parameter_count() const { return parameter_count_; }
  MemoryAccount memory_account(int64_t step_peak) const;

 private:
  struct Trained;  // one trainable parameter as the state sees it
  void create_modules();
  void check_replicas() const;
  struct Listed;  // what list_trained finds
  void lay_out(const std::map<std::string, Communicator*>& tied);
  Listed list_trained(const std::map<std::string, Communicator*>& tied);
  std::vector<at::Tensor> cast_to_compute_dtype(std::vector<at::Tensor>& all);
  void make_optimizer_over(const std::vector<at::Tensor>& all, std::vector<at::Tensor> fp32_values,
                           const std::vector<std::shared_ptr<const sdk::InitSpec>>& inits);
  void take_counters(const std::map<std::string, const StateEntry*>& by_name);
  void forget_optimizer_state_if_faulted(const std::vector<StateEntry>& live);
  void make_optimizer(const std::vector<at::Tensor>& tensors, const std::vector<bool>& decay);
  std::map<std::string, Communicator*> make_tied_groups();

  const JobConfig& job_;
  const ParallelContext& context_;
  const ModelPlan& model_;
  std::map<std::string, std::shared_ptr<ModuleInstance>> modules_;
  std::vector<std::string> module_order_;  // creation order
  std::vector<Trained> trained_;           // GradientSync's parameters, by index
  std::unique_ptr<GradientSync> sync_;
  std::unique_ptr<MasterWeights> masters_;
  std::unique_ptr<DynamicLossScaler> scaler_;
  std::unique_ptr<ShardedParameters> sharded_;
  std::unique_ptr<OptimizerInstance> optimizer_;
  std::unique_ptr<BufferSync> buffers_;
  int64_t updates_ = 0;
  std::vector<bool> norm_counted_;     // per GradientSync parameter
  std::vector<bool> whole_owner_;      // per GradientSync parameter: writes it whole (ZeRO 0-2)
  std::vector<bool> segment_counted_;  // ZeRO: per shard segment
  int64_t steps_ = 0;
  int64_t created_bytes_ = 0, parameter_init_peak_ = 0;
  int64_t parameter_count_ = 0;  // see parameter_count()
};

}  // namespace smp
