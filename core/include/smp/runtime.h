// The public embedding API: build a training runtime from options and run steps.
//
//   smp::Options options = smp::Options::load("job.toml").args({"train.steps=5"});
//   auto rt = smp::Runtime::create(options, smp::ProcessEnv::from_environment(), {"gpt.so"});
//   for (int64_t i = rt->steps_done(); i < 5; ++i) auto r = rt->train_step();
//   double val = rt->evaluate(2);
//   rt->checkpoints().save("runs/a/step-5");
//
// Three parts, by what a program does with them: the Runtime trains and runs
// the model (this header); its Checkpointer (smp/checkpointer.h) saves, loads
// and resumes; smp::Trainer (smp/training.h) is the one loop that acts on the
// cadence keys (run.checkpoint_every, train.val_every, run.trace,
// run.exit_after_steps, ...), its summary and progress lines.
//
// Data flow inside create(): config -> rendezvous + mesh -> communicators ->
// plugins -> model graph -> TP rules -> costs -> partition -> local modules ->
// schedule -> executor, gradient sync, optimizer.
#pragma once

#include <smp/batch.h>
#include <smp/checkpointer.h>
#include <smp/config.h>
#include <smp/job_config.h>
#include <smp/model_graph.h>
#include <smp/options.h>
#include <smp/peak_flops.h>
#include <smp/plugin_source.h>
#include <smp/process_env.h>
#include <smp/stage_plan.h>
#include <smp/state_types.h>

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
class Trainer;

// How a runtime is made (Runtime::create).
struct RuntimeOptions {
  // A model the program feeds (train_step(batch)): a batch like those it will
  // pass (this rank's share, or any rows of one), used where the plan needs
  // data before the first step: the cost profile that partitions a graph
  // without cost hints over pp (after a warm-up call). Empty: the adapter's.
  Batch example;
  // Whether create() resumes when asked (run.resume or run.checkpoint_dir
  // given, or a restarted rank), else applies run.init_from. false: the
  // caller does it with Checkpointer::resume_if_asked(), as smp-worker's
  // Trainer does once smp-launch's hang detection is armed (a hang while
  // loading is then caught).
  bool resume_at_create = true;
};

class Runtime {
 public:
  // Joins the job (rendezvous), loads plugins (the adapter's first, then the
  // standard layer/TP/partition plugins and config plugins.paths), builds
  // everything, and resumes when asked (run.resume or run.checkpoint_dir
  // given, or a rank smp-launch restarted: Checkpointer::resumed()), else
  // applies run.init_from (RuntimeOptions::resume_at_create). A plugin is a file (path or name) or the program's own code
  // (PluginSource with an entry: smp::sdk::InProcessPlugin), checked alike.
  // Throws smp::Error naming the key, plugin, node or rank at fault.
  static std::unique_ptr<Runtime> create(Config config, const ProcessEnv& env,
                                         const std::vector<PluginSource>& plugins);
  // The same for a model the program feeds: RuntimeOptions::example.
  static std::unique_ptr<Runtime> create(Config config, const ProcessEnv& env,
                                         const std::vector<PluginSource>& plugins, const Batch& example);
  static std::unique_ptr<Runtime> create(Config config, const ProcessEnv& env,
                                         const std::vector<PluginSource>& plugins, const RuntimeOptions& options);
  // From options made in code (smp/options.h): what a program uses.
  static std::unique_ptr<Runtime> create(const Options& options, const ProcessEnv& env,
                                         const std::vector<PluginSource>& plugins);
  // The memory manager's per-rank estimate for the configured layout on
  // world_size ranks (smp-launch --estimate-memory): plugins, graph, tp rules,
  // partition and schedule only; no rendezvous, no module is created. Bytes per
  // pp rank by category (the account's), and the largest total.
  static nlohmann::json estimate_memory(Config config, int world_size, const std::vector<PluginSource>& plugins);
  // The job's model as the adapter describes it and the rules rewrite it, the
  // same way and as cheaply (no rendezvous, no module): {"nodes": [{"name",
  // "kind", "config"}], "throughput_unit", "throughput_per_sample"}. What
  // smp-plan reads a model's shape from.
  static nlohmann::json describe_model(Config config, int world_size, const std::vector<PluginSource>& plugins);
  // Leaves the job: waits (up to run.timeout_s) until every rank got here, so
  // the rank hosting the rendezvous store does not exit under the others.
  // Called by the destructor when not called before; idempotent.
  void shutdown();
  ~Runtime();

  // One step on the adapter's next batch. The step only: the cadence keys
  // are smp::Trainer's, and a runtime stepped without one refuses, at its
  // first step, such a key that asks for something (run.checkpoint_every = 2
  // would otherwise be ignored), naming it.
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
  // A value another rank's module left sharded (a vocabulary-parallel head's
  // logits, as its kind declares) is gathered whole.
  Batch forward(const Batch& inputs, const std::vector<std::string>& outputs);
  // Generation with a KV cache: forward() over each sample's next positions
  // only (`positions`), while the modules that mix positions (attention) keep
  // what later calls need of the earlier ones. Feed the prompts at start 0,
  // then each new token at its position: one position per token instead of
  // the whole sequence. Every node that runs must be of a kind that declares
  // it works position by position or honours decoding (ABI 2.7); another is
  // refused naming it and its kind, before anything runs. One microbatch
  // (parallel.microbatches = 1); the same call on every rank. Any other call
  // (training, evaluate, forward) frees the caches.
  Batch decode(const Batch& inputs, const DecodePositions& positions, const std::vector<std::string>& outputs);
  // The graph's validation metrics over the last evaluate() (sum / count over
  // its batches and ranks), by name, in declaration order; empty if the graph has none.
  std::vector<std::pair<std::string, double>> validation_metrics() const;

  // The rank's device ("cpu", "cuda:0") and the compute dtype ("fp32", "bf16", "fp16").
  std::string device() const;
  std::string precision() const;
  // A GEMM peak measured now on this rank's device in the compute dtype (fp32
  // on the CPU).
  double measure_peak_flops() const;
  // What MFU is stated against on this rank: the device's name, its datasheet
  // dense peak in the compute dtype where smp's table knows it, and a GEMM
  // peak measured now (measure_peak_flops) beside it.
  PeakFlops measure_peaks() const;
  // This rank's share of the model's trainable parameters (elements), each
  // value counted once over the job: a tied or shared weight once however many
  // nodes and pp ranks use it, a replica once over its data-parallel group, a
  // tp or ep shard on the rank that holds it. The sum over the ranks is the
  // model's parameter count.
  int64_t parameter_count() const;
  // Steps taken, counting those of a resumed checkpoint: where a program's loop starts.
  int64_t steps_done() const;
  // Saving, loading and resuming this runtime's state.
  Checkpointer& checkpoints();
  const Checkpointer& checkpoints() const;
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
  // ZeRO-3: frees what gather_parameters() gathered now rather than at the
  // next step (what FSDP's summon_full_params does on leaving); else a no-op.
  void release_parameters();

  // The model's parameters and buffers whole, by the names of the program's
  // module tree ("net.0.proj.weight"), sorted: tp/ep shards, ZeRO ranges and
  // other pipeline ranks' stages put together, on every rank, in the compute
  // dtype, on this rank's device (FSDP's full state dict). Collective over
  // the world; holds the whole model on each rank while it runs.
  std::vector<std::pair<std::string, at::Tensor>> model_state_dict();

  // Elementwise sum across the world of per-rank values (for summaries).
  std::vector<double> gather_world(double value);
  // Every rank's `values` (the same count on each), rank after rank.
  std::vector<std::vector<double>> gather_world(const std::vector<double>& values);

 private:
  friend class Trainer;  // steps through step_for_trainer
  StepResult step_for_trainer(const Batch* batch);
  StepResult train_step_of(const Batch* batch);
  struct Impl;
  explicit Runtime(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace smp
#pragma GCC visibility pop
