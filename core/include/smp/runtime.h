// The public embedding API: build a training runtime from a config and run steps.
//
//   smp::Config config = smp::Config::load("job.toml", {"train.steps=5"});
//   auto rt = smp::Runtime::create(config, smp::ProcessEnv::from_environment(), {"gpt.so"});
//   for (int i = 0; i < 5; ++i) auto r = rt->train_step();
//   double val = rt->evaluate(2);
//
// Data flow inside create(): config -> rendezvous + mesh -> communicators ->
// plugins -> model graph -> TP rules -> costs -> partition -> local modules ->
// schedule -> executor, gradient sync, optimizer.
#pragma once

#include <smp/batch.h>
#include <smp/config.h>
#include <smp/job_config.h>
#include <smp/model_graph.h>
#include <smp/plugin_source.h>
#include <smp/process_env.h>
#include <smp/stage_plan.h>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

// Exported from libsmp_core (built with hidden visibility): the public API.
#pragma GCC visibility push(default)
namespace smp {

class DeviceMesh;
class PluginRegistry;

struct ParameterView {
  std::string name;  // "<module key>.<local name>", e.g. "blocks.0.attn.q_weight"
  at::Tensor tensor; // this rank's shard
  int shard_dim = -1;  // split across tp ranks along this dim, -1 when replicated
  int ep_shard_dim = -1;  // split across ep ranks (experts) along this dim, -1 when not
};

// Where a step's wall time went on this rank (seconds). compute = the
// schedule's forwards/backwards, including the waits for pipeline peers and
// the dp buckets launched during backward; grad_sync = what is left of the
// gradient reductions after the last backward; clip = global norm + clipping
// + the loss/norm all-reduce; optimizer = the parameter update.
struct StepPhases {
  double compute = 0, grad_sync = 0, clip = 0, optimizer = 0;
};

// One slice of what a rank holds between steps (Runtime::state_entries): a
// tensor of the train state as this rank holds it, and where it sits in the
// global tensor that all ranks' slices make up. The block of this rank starts
// at `offsets` of the global tensor and has block_shape (tp/ep shards: the
// global tensor is the shards put together along their shard dimension, in
// rank order). Under ZeRO a rank holds a flat range of its block instead:
// elements [flat_begin, flat_begin + local.numel()) of the block in row-major
// order; flat_begin = -1 means the whole block. Counters (steps, the loss
// scale) are 0-d entries with empty shapes.
//
// Names: "model/<parameter>", "optim/master/<parameter>" (16-bit compute),
// "optim/<state>/<parameter>" (the optimizer's, e.g. "exp_avg"),
// "optim/step", "train/step", "loss_scaler/{scale,good_steps,skipped}" (fp16).
// The learning rate, the data position (adapters are asked for a batch by
// step) and the random streams (counter-based, from train.seed and the step)
// follow from train/step and the config.
struct StateEntry {
  std::string name;
  std::vector<int64_t> global_shape, offsets, block_shape;
  int64_t flat_begin = -1;
  at::Tensor local;    // the live tensor (a view, not a copy); counters: a 0-d copy
  bool owner = false;  // exactly one of the ranks holding these values owns them (writes them once)
};

// This rank's memory by category (bytes), as the memory manager accounts it:
// what it holds between steps, and the peak of what a step allocates on top
// (activations, gathered ZeRO-3 parameters, communication buffers).
struct MemoryAccount {
  int64_t parameters = 0;       // in the compute dtype: whole, or this rank's shards (+ gathered units)
  int64_t gradients = 0;        // gradient buckets and shards
  int64_t optimizer_state = 0;  // AdamW moments and fp32 master weights
  int64_t step_peak = 0;        // peak bytes allocated during the step's forwards/backwards
  int64_t offloaded = 0;        // memory.offload: most host bytes holding activations at once (not in total)
  // Parts of step_peak (not added to the total again): activations by schedule
  // slot (the most held at once by slots in flight, and the largest slot), and
  // the most bytes pipeline sends in flight held (communication buffers).
  int64_t activations = 0, largest_slot = 0, send_buffers = 0;
  int64_t total() const { return parameters + gradients + optimizer_state + step_peak; }
  // Each category the larger of this and o (the largest over a run's steps).
  void keep_largest(const MemoryAccount& o) {
    for (auto field : {&MemoryAccount::parameters, &MemoryAccount::gradients, &MemoryAccount::optimizer_state,
                       &MemoryAccount::step_peak, &MemoryAccount::offloaded, &MemoryAccount::activations,
                       &MemoryAccount::largest_slot, &MemoryAccount::send_buffers})
      this->*field = this->*field > o.*field ? this->*field : o.*field;
  }
};

struct StepResult {
  int64_t step = 0;         // 0-based index of the step just taken
  double loss = 0;          // mean training loss over the global batch (same on every rank)
  double grad_norm = 0;     // global gradient norm before clipping
  // After a step each .grad holds the gradient of the loss summed over the
  // step's items (samples, or the adapter's counted items), not clipped; the
  // optimizer used grad_scale x .grad (1 / items times the clipping
  // coefficient), applied on the fly rather than by extra passes.
  double grad_scale = 1;
  double lr = 0;
  double seconds = 0;       // wall time of the step
  int64_t peak_activation_bytes = 0;  // this rank, during the step (CPU; on a GPU the allocator's peak above the step start)
  // fp16 (train.precision): the loss scale the step ran with, and whether its
  // gradients overflowed so the optimizer skipped it (the scale was then halved).
  double loss_scale = 1;
  bool skipped = false;
  // train.val_every, when the program drives the runtime (not run_training):
  // the validation loss evaluated after this step, NaN when it did not validate.
  double validation_loss = std::numeric_limits<double>::quiet_NaN();
  StepPhases phases;
  MemoryAccount memory;
  // The graph's metrics (graph.metric) over this step's training microbatches
  // on every rank: sum / count, in the order the adapter declared them.
  std::vector<std::pair<std::string, double>> metrics;
};

// How a runtime is made (Runtime::create).
struct RuntimeOptions {
  // A model the program feeds (train_step(batch)): a batch like those it will
  // pass (this rank's share, or any rows of one), used where the plan needs
  // data before the first step: the cost profile that partitions a graph
  // without cost hints over pp (after a warm-up call). Empty: the adapter's.
  Batch example;
  // Who runs the steps. false (a program): the runtime itself acts on
  // run.resume / run.init_from (at create), run.checkpoint_every and
  // train.val_every (in train_step), and refuses the keys only the training
  // loop acts on (run.trace, run.profile_ops, run.dump_parameters,
  // run.exit_after_steps, run.hang_timeout_s) when they ask for something.
  // true: smp::run_training drives it and acts on all of them.
  bool training_loop = false;
};

class Runtime {
 public:
  // Joins the job (rendezvous), loads plugins (the adapter's first, then the
  // standard layer/TP/partition plugins and config plugins.paths) and builds
  // everything. A plugin is a file (path or name) or the program's own code
  // (PluginSource with an entry: smp::sdk::InProcessPlugin), checked alike.
  // Throws smp::Error naming the key, plugin, node or rank at fault.
  static std::unique_ptr<Runtime> create(Config config, const ProcessEnv& env,
                                         const std::vector<PluginSource>& plugins);
  // The same for a model the program feeds: RuntimeOptions::example.
  static std::unique_ptr<Runtime> create(Config config, const ProcessEnv& env,
                                         const std::vector<PluginSource>& plugins, const Batch& example);
  static std::unique_ptr<Runtime> create(Config config, const ProcessEnv& env,
                                         const std::vector<PluginSource>& plugins, const RuntimeOptions& options);
  // The memory manager's per-rank estimate for the configured layout on
  // world_size ranks (smp-launch --estimate-memory): plugins, graph, tp rules,
  // partition and schedule only; no rendezvous, no module is created. Bytes per
  // pp rank by category (the account's), and the largest total.
  static nlohmann::json estimate_memory(Config config, int world_size, const std::vector<PluginSource>& plugins);
  // Leaves the job: waits (up to run.timeout_s) until every rank got here, so
  // the rank hosting the rendezvous store does not exit under the others.
  // Called by the destructor when not called before; idempotent.
  void shutdown();
  ~Runtime();

  // One step on the adapter's next batch.
  StepResult train_step();
  // One step on the program's batch, one tensor per graph input: this rank's
  // data-parallel share of the global batch (train.batch_size / dp samples
  // along dimension 0; the same tensors on every rank of one dp coordinate),
  // or the whole global batch on every rank (train.batch_size samples: this
  // rank's rows are taken).
  // It is split into parallel.microbatches; the stages take the inputs they
  // use. A batch missing an input or carrying an extra one, of the wrong
  // size, dtype or device, is refused (smp::Error naming the input and rank)
  // before anything runs: the runtime stays usable.
  StepResult train_step(const Batch& batch);
  // The learning rate of the steps that follow, instead of the schedule's
  // (train.lr, train.warmup_steps, a cosine to train.min_lr over
  // train.steps); a negative value goes back to the schedule. Every rank must
  // set the same value; a checkpoint does not keep it (set it again after load).
  void set_learning_rate(double lr);
  // Mean validation loss over `batches` global batches (same on every rank).
  double evaluate(int batches);
  // The mean loss over the program's batch (this rank's share; same on every rank).
  double evaluate(const Batch& batch);
  // Forward only (no gradients, training = false) on the program's inputs:
  // the named graph values `outputs` (any node's output, or an input), each
  // the microbatches' values put together along dimension 0, on every rank
  // (a value computed on another pipeline stage is broadcast over pp). Inputs
  // only what the outputs need: nodes whose inputs are missing do not run
  // (e.g. the loss without its targets); an output that needs a missing input
  // is refused naming both. The batch size need only divide by microbatches.
  Batch forward(const Batch& inputs, const std::vector<std::string>& outputs);
  // The graph's validation metrics over the last evaluate() (sum / count over
  // its batches and ranks), by name, in declaration order; empty if the graph has none.
  std::vector<std::pair<std::string, double>> validation_metrics() const;

  // The rank's device ("cpu", "cuda:0") and the compute dtype ("fp32", "bf16", "fp16").
  std::string device() const;
  std::string precision() const;
  // A GEMM peak measured now on this rank's device in the compute dtype (fp32
  // on the CPU): what MFU is reported against.
  double measure_peak_flops() const;
  int64_t steps_done() const;
  // The most bytes (CPU allocator, this thread) that creating this rank's
  // modules and laying out their parameters held at once: the whole parameters
  // without ZeRO-3, about this rank's dp shard with it (deferred init).
  int64_t parameter_init_peak() const;
  const Config& config() const;
  const JobConfig& job() const;  // the same, typed
  const DeviceMesh& mesh() const;
  const ModelGraph& graph() const;
  const StagePlan& plan() const;
  const PluginRegistry& plugins() const;

  // Model FLOPs of one training step (forward + backward) for the global batch, 0 if unknown.
  double flops_per_step() const;
  // Throughput items per global batch, in the adapter's unit ("tokens" for a
  // language model, "samples" by default).
  double items_per_step() const;
  const std::string& throughput_unit() const;
  // What this rank's communicators moved since the last reset, by group ("pp",
  // "dp", "tp", "ep", "edp", "tied.wte", ...): {"sent": {group: {transport:
  // {op: bytes}}} counted by the transport that moved them, "analytic":
  // {group: {op: bytes}} the standard algorithm's count, "uncounted_calls":
  // {group: {transport: {op: calls}}} on transports that keep no count (NCCL)}.
  nlohmann::json comm_bytes() const;
  void reset_comm_stats();
  // The local parameters by full name ("blocks.0.attn.q_weight"), this rank's
  // tp/ep shards, as held now: under ZeRO-3 a parameter has no storage between
  // steps unless gather_parameters() gathered it first.
  std::vector<ParameterView> parameters() const;
  // ZeRO-3: gathers every module's parameters (whole over dp) until the next
  // step releases them, then returns parameters(). Collective over dp.
  std::vector<ParameterView> gather_parameters();

  // Everything this rank holds between steps, as slices of global tensors
  // (see StateEntry), in a fixed order; tensors are views of the live state.
  std::vector<StateEntry> state_entries() const;
  // Copies entries taken from a runtime of the same job and layout (this
  // rank's, cloned) into this one: the next step is the one that runtime
  // would have taken. Throws naming the first entry missing, extra or unlike.
  void load_state(const std::vector<StateEntry>& entries);
  // Checkpoints (docs/checkpoints.md): a folder of per-rank safetensors shards
  // and a manifest, readable by any layout.
  //   save: writes the folder `path` (replacing one of that name only once the
  //     new one is complete); every rank calls it; returns when it is committed
  //     on rank 0 and this rank's part is written on the others.
  //   load: a checkpoint folder, or a folder of them (its `latest`), saved by
  //     any layout of the same model; the next step is the one after the saved
  //     step. Every rank calls it. Throws naming the file and tensor at fault.
  //   save_checkpoint: run.checkpoint_dir/step-<N> with `latest` updated and
  //     the newest run.keep_checkpoints kept; with run.checkpoint_async the
  //     step blocks only for host copies (the next save or
  //     wait_for_checkpoint waits for the writing).
  //   resume: what run.resume asks for; returns the folder loaded, "" if none
  //     (then run.init_from, when given, sets the parameters).
  //   init_from: the parameters (and fp32 masters) only, from a checkpoint
  //     folder; the optimizer state and the step stay as they are.
  void save(const std::string& path);
  void load(const std::string& path);
  void save_checkpoint();
  void wait_for_checkpoint();
  std::string resume();
  void init_from(const std::string& path);
  // Seconds the last save call blocked its caller (a background save's host
  // copies are waited for in the next step instead) and took in all (known
  // once it is waited for).
  double checkpoint_blocking_seconds() const;
  double checkpoint_total_seconds() const;
  int64_t checkpoint_bytes() const;  // the last save's: all files on rank 0, this rank's elsewhere
  std::string checkpoint_dir() const;  // run.checkpoint_dir, or <run.dir>/checkpoints

  // Elementwise sum across the world of per-rank values (for summaries).
  std::vector<double> gather_world(double value);
  // Every rank's `values` (the same count on each), rank after rank.
  std::vector<std::vector<double>> gather_world(const std::vector<double>& values);

 private:
  struct Impl;
  explicit Runtime(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace smp
#pragma GCC visibility pop
