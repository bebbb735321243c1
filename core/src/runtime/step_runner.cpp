#include "runtime/step_runner.h"

#include <smp/error.h>
#include <smp/mesh.h>

#include "base/axis_names.h"
#include "base/device.h"
#include "base/op_profile.h"
#include "base/phase_clock.h"
#include "base/trace.h"
#include "comm/communicator.h"
#include "comm/process_groups.h"
#include "memory/activation_offload.h"
#include "memory/gradient_sync.h"
#include "optim/mixed_precision.h"
#include "pipeline/executor.h"
#include "plugin/module_instance.h"
#include "runtime/model_plan.h"
#include "runtime/optimizer_step.h"
#include "runtime/parallel_context.h"
#include "runtime/train_state.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <set>

namespace smp {

namespace {

// The graph's metrics from their summed (sum, count) pairs: sum / count, 0 without counts.
std::vector<std::pair<std::string, double>> metric_values(const std::vector<ModelGraph::Metric>& metrics,
                                                          const std::vector<double>& sums) {
  std::vector<std::pair<std::string, double>> out;
  for (size_t k = 0; k < metrics.size(); ++k)
    out.emplace_back(metrics[k].name, sums[2 * k + 1] > 0 ? sums[2 * k] / sums[2 * k + 1] : 0.0);
  return out;
}

}  // namespace

StepRunner::StepRunner(const JobConfig& job, ParallelContext& context, const ModelPlan& model, TrainState& state)
    : job_(job),
      context_(context),
      model_(model),
      state_(state),
      adapter_data_(model.adapter(), context.mesh(), model.graph().inputs.size(), model.global_batch(),
                    model.microbatches()) {
  ExecutorSetup setup;
  setup.graph = &model.graph();
  setup.plan = &model.stage_plan();
  setup.pp_rank = context.mesh().coord(Role::Pipeline);
  setup.pp_comm = context.mesh().size(Role::Pipeline) > 1 ? &context.comm(Role::Pipeline) : nullptr;
  setup.pp_down_comm = context.mesh().size(Role::Pipeline) > 1 ? context.groups().pipeline_down() : nullptr;
  setup.modules = &state.modules();
  setup.seed = job.train.seed;
  setup.loss = &model.loss();
  setup.device = context.device();
  setup.compute_dtype = compute_dtype(job.train.precision);
  setup.gather = job.memory.zero == 3 ? state.sharded() : nullptr;
  setup.checkpoint = model.checkpointed();
  if (job.memory.offload) {
    offload_ = std::make_unique<ActivationOffload>(context.device(), job.memory.offload_horizon);
    setup.offload = offload_.get();
  }
  setup.batch = [this](int64_t step, int mb, bool training) {
    return source_->microbatch(training ? DataSplit::Train : DataSplit::Validation, step, mb);
  };
  executor_ = std::make_unique<Executor>(setup);
  clock_ = std::make_unique<PhaseClock>(context.device());
  context.groups().reset_stats();
}

StepRunner::~StepRunner() = default;

namespace {

// Points the executor at a data source for one call, and back after it.
class UseSource {
 public:
  UseSource(const DataSource*& slot, const DataSource* source) : slot_(slot), before_(slot) {
    if (source) slot_ = source;
  }
  ~UseSource() { slot_ = before_; }

 private:
  const DataSource*& slot_;
  const DataSource* before_;
};

// Has the executor keep `values` for one forward-only run (into `sink`).
class Capture {
 public:
  Capture(Executor& e, const std::set<std::string>& values, std::map<std::string, std::map<int, at::Tensor>>& sink)
      : e_(e) {
    e_.capture(&values, &sink);
  }
  ~Capture() { e_.capture(nullptr, nullptr); }

 private:
  Executor& e_;
};

}  // namespace

ProgramBatch StepRunner::program_batch(const Batch& batch, const std::string& call, int64_t rows, bool allow_missing) {
  ProgramBatch::Rules rules;
  rules.microbatches = model_.microbatches();
  rules.rows = rows;
  rules.allow_missing = allow_missing;
  rules.uneven = call == "forward";  // a training step's microbatches stay equal (train.batch_size's rule)
  rules.spec = spec_.empty() ? nullptr : &spec_;
  rules.device = context_.device();
  rules.where = "rank " + std::to_string(context_.mesh().rank()) + ": " + call;
  ProgramBatch checked(batch, model_.graph().inputs, rules);
  if (spec_.empty() && !allow_missing) spec_ = checked.spec();
  return checked;
}

// The program may pass the whole global batch on every rank instead of its
// share: then this rank's data-parallel rows are taken (views).
Batch StepRunner::share_of(const Batch& batch) const {
  for (const Axis& a : context_.mesh().sequence_axes())
    if (context_.mesh().size(a) > 1 && !batch.empty())
      throw Error(axis_size_key(a.name()) + " = " + std::to_string(context_.mesh().size(a)) +
                  ": a program's own batches are not cut into shares of their sequences (an adapter's batch() is, "
                  "through GraphBuilder::split_sequence): train from an adapter, or set " + axis_size_key(a.name()) + " = 1");
  const int dp = context_.mesh().size(Role::Batch);
  const int64_t global = model_.global_batch();
  if (dp == 1 || batch.empty()) return batch;
  for (const auto& [name, t] : batch)
    if (!t.defined() || t.dim() == 0 || t.size(0) != global) return batch;
  const int64_t rows = global / dp, first = context_.mesh().coord(Role::Batch) * rows;
  Batch mine;
  for (const auto& [name, t] : batch) mine[name] = t.narrow(0, first, rows);
  return mine;
}

StepResult StepRunner::train(const OptimizerStep& update, const std::function<void()>& before_update,
                             const Batch* batch) {
  std::optional<ProgramBatch> fed;
  if (batch)
    fed.emplace(program_batch(share_of(*batch), "train_step", model_.global_batch() / context_.mesh().size(Role::Batch), false));
  UseSource use(source_, fed ? &*fed : nullptr);
  state_.sync_buffers();
  using clock = std::chrono::steady_clock;
  auto since = [](clock::time_point t) { return std::chrono::duration<double>(clock::now() - t).count(); };
  const auto t0 = clock::now();
  const c10::Device& device = context_.device();
  StepResult out;
  out.loss_scale = state_.scaler() ? state_.scaler()->scale() : 1.0;
  const int64_t held_before = reset_device_peak(device);  // CUDA: the step's peak is counted above it
  trace::set_step(state_.steps());
  trace::Scope step_scope("step", "step " + std::to_string(state_.steps() + 1));
  op_profile::StepScope ops(state_.steps());
  // The phases' boundaries (host clock; on a GPU a CUDA event each), traced
  // with both once the step is done.
  PhaseClock& phases = *clock_;
  phases.start();
  state_.sync().begin_step();
  ExecutorResult r = executor_->run(model_.schedule(), state_.steps(), true, out.loss_scale);
  out.phases.compute = phases.end("pipeline");
  state_.sync().finish_step();
  out.phases.grad_sync = phases.end("grad_sync");
  before_update();
  out.phases.snapshot = phases.end("snapshot");
  // The graph's metrics, counted once per group of model-axis replicas.
  const auto& metrics = model_.graph().metrics;
  std::vector<double> metric_sums(2 * metrics.size(), 0.0);
  if (context_.mesh().at_model_origin())
    for (size_t k = 0; k < metrics.size(); ++k)
      metric_sums[2 * k] = r.metrics[k].first, metric_sums[2 * k + 1] = r.metrics[k].second;
  const OptimizerStepResult u =
      update.run(state_, r.loss, out.loss_scale, context_.mesh(), context_.comm(Role::World), device, &metric_sums,
                 &phases);
  out.metrics = metric_values(metrics, metric_sums);
  out.phases.clip = u.clip_seconds;
  out.phases.optimizer = u.optimizer_seconds;
  if (phases.on_device()) {
    PhaseSeconds d;
    for (const PhaseClock::Phase& p : phases.finish()) {
      if (p.name == "pipeline") d.compute = p.device_s;
      if (p.name == "grad_sync") d.grad_sync = p.device_s;
      if (p.name == "clip") d.clip = p.device_s;
      if (p.name == "optimizer") d.optimizer = p.device_s;
    }
    out.phases.device = d;
  } else {
    phases.finish();  // the trace's slices
  }
  out.step = state_.steps();
  state_.step_done();
  out.skipped = u.skipped;
  out.loss = LossNormalizer::mean(u.loss);
  out.grad_norm = u.grad_norm;
  out.grad_scale = u.grad_scale;
  out.lr = u.lr;
  out.peak_activation_bytes = device.is_cuda() ? device_peak_bytes(device) - held_before : r.peak_bytes;
  out.memory = state_.memory_account(out.peak_activation_bytes);
  out.memory.offloaded = r.offloaded_peak_bytes;
  out.memory.activations = r.activation_peak_bytes;
  out.memory.largest_slot = r.largest_slot_bytes;
  out.memory.send_buffers = r.send_buffer_peak_bytes;
  out.seconds = since(t0);
  return out;
}

double StepRunner::evaluate(int batches) {
  state_.sync_buffers();
  c10::NoGradGuard ng;
  LossSums local;
  const auto& metrics = model_.graph().metrics;
  std::vector<double> sums(2 * metrics.size(), 0.0);  // sum, count per metric; in the loss's all-reduce
  for (int b = 0; b < batches; ++b) {
    ExecutorResult r = executor_->run(model_.eval_schedule(), b, false);
    local += r.loss;
    for (size_t k = 0; k < metrics.size(); ++k) {
      sums[2 * k] += r.metrics[k].first;
      sums[2 * k + 1] += r.metrics[k].second;
    }
  }
  const DeviceMesh& mesh = context_.mesh();
  if (!mesh.at_model_origin()) std::fill(sums.begin(), sums.end(), 0.0);  // once per model-axis group
  const double mean = LossNormalizer::mean(sum_over_world(local, sums, mesh, context_.comm(Role::World)));
  last_metrics_ = metric_values(metrics, sums);
  return mean;
}

double StepRunner::evaluate(const Batch& batch) {
  const ProgramBatch fed = program_batch(share_of(batch), "evaluate", model_.global_batch() / context_.mesh().size(Role::Batch), false);
  UseSource use(source_, &fed);
  return evaluate(1);
}

namespace {

// The graph inputs that `value` depends on and `batch` lacks (its producers'
// inputs, transitively); producer: each node output's node.
std::vector<std::string> missing_inputs(const ModelGraph& g, const std::map<std::string, int>& producer,
                                        const std::string& value, const Batch& batch) {
  std::vector<std::string> missing, todo{value};
  std::set<std::string> seen;
  while (!todo.empty()) {
    const std::string v = todo.back();
    todo.pop_back();
    if (!seen.insert(v).second) continue;
    if (std::find(g.inputs.begin(), g.inputs.end(), v) != g.inputs.end()) {
      if (!batch.count(v)) missing.push_back(v);
      continue;
    }
    auto p = producer.find(v);
    if (p == producer.end()) continue;
    const GraphNode& n = g.nodes[static_cast<size_t>(p->second)];
    todo.insert(todo.end(), n.inputs.begin(), n.inputs.end());
  }
  std::sort(missing.begin(), missing.end());
  return missing;
}

// The method a node calls ("forward" when it names none).
const std::string& method_of(const GraphNode& n) {
  static const std::string kForward = "forward";
  return n.method.empty() ? kForward : n.method;
}

// Refuses a decoding run through a node whose kind neither works position by
// position nor keeps a cache (ABI 2.7), among the nodes the inputs given reach.
void check_decodable(const ModelGraph& g, const PluginRegistry& registry, const Batch& inputs,
                     const std::string& where) {
  std::set<std::string> known;
  for (const auto& [name, t] : inputs) known.insert(name);
  for (const GraphNode& n : g.nodes) {
    if (!std::all_of(n.inputs.begin(), n.inputs.end(), [&](const std::string& v) { return known.count(v) > 0; }))
      continue;
    if (!kind_decodes(registry, n.kind, method_of(n)))
      throw Error(where + ": node '" + n.name + "' (kind '" + n.kind + "' of plugin '" + registry.provider("module kind", n.kind) +
                  "', method '" + method_of(n) + "') declares neither that it works position by position nor that it "
                  "keeps a KV cache (SMP_EXTENSION_INFERENCE), so it cannot be fed one new position at a time: "
                  "use forward() over the whole sequence");
    known.insert(n.outputs.begin(), n.outputs.end());
  }
}

// The whole value of `t`, which each rank of `comm` holds a slice of along `dim`.
at::Tensor gather_along(Communicator& comm, const at::Tensor& t, int dim) {
  const int64_t d = dim < 0 ? dim + t.dim() : dim;
  if (d < 0 || d >= t.dim())
    throw Error("forward: a sharded output of " + std::to_string(t.dim()) + " dimensions has no dimension " +
                std::to_string(dim));
  const at::Tensor flat = t.contiguous().view({-1});
  at::Tensor all = at::empty({comm.size() * flat.numel()}, flat.options());
  comm.allgather(flat, all)->wait();
  std::vector<int64_t> shape{comm.size()};
  shape.insert(shape.end(), t.sizes().begin(), t.sizes().end());
  return at::cat(all.view(shape).unbind(0), d);
}

// Sends `t` (undefined: "not computed") from pp rank `root` to every pp rank.
at::Tensor broadcast_value(Communicator& pp, at::Tensor t, int root, const c10::Device& device) {
  constexpr int kMaxDims = 16;
  at::Tensor header = at::full({2 + kMaxDims}, -1, at::kLong);
  if (pp.rank() == root && t.defined()) {
    if (t.dim() > kMaxDims) throw Error("forward: an output with " + std::to_string(t.dim()) + " dimensions (at most 16)");
    t = t.contiguous();
    header[0] = static_cast<int64_t>(t.scalar_type());
    header[1] = t.dim();
    for (int64_t d = 0; d < t.dim(); ++d) header[2 + d] = t.size(d);
  }
  pp.broadcast(header, root)->wait();
  const int64_t* h = header.data_ptr<int64_t>();
  if (h[0] < 0) return {};
  if (pp.rank() != root)
    t = at::empty(std::vector<int64_t>(h + 2, h + 2 + h[1]), at::TensorOptions().dtype(static_cast<at::ScalarType>(h[0])).device(device));
  pp.broadcast(t, root)->wait();
  return t;
}

}  // namespace

Batch StepRunner::forward(const Batch& inputs, const std::vector<std::string>& outputs,
                          const DecodePositions* decode) {
  c10::NoGradGuard ng;
  const ModelGraph& g = model_.graph();
  const StagePlan& plan = model_.stage_plan();
  const std::string where = "rank " + std::to_string(context_.mesh().rank()) + (decode ? ": decode" : ": forward");
  if (decode) {
    check_decodable(g, model_.registry(), inputs, where);
    if (model_.microbatches() != 1)
      throw Error(where + ": decoding runs one microbatch (parallel.microbatches = 1), the job has " +
                  std::to_string(model_.microbatches()));
    int64_t rows = -1, seq = -1;
    for (const auto& [name, t] : inputs)
      if (t.defined() && t.dim() >= 2) rows = t.size(0), seq = t.size(1);
    if (rows < 0) throw Error(where + ": no input has a sequence dimension ([batch, positions, ...])");
    if (static_cast<int64_t>(decode->start.size()) != rows)
      throw Error(where + ": " + std::to_string(decode->start.size()) + " start positions for a batch of " +
                  std::to_string(rows) + " samples");
    for (size_t i = 0; i < decode->start.size(); ++i)
      if (decode->start[i] < 0 || decode->start[i] + seq > decode->capacity)
        throw Error(where + ": sample " + std::to_string(i) + " at positions [" + std::to_string(decode->start[i]) +
                    ", " + std::to_string(decode->start[i] + seq) + ") lies outside the cache's capacity " +
                    std::to_string(decode->capacity));
  }
  std::map<std::string, int> producer;  // graph value -> the node computing it
  for (size_t i = 0; i < g.nodes.size(); ++i)
    for (const auto& o : g.nodes[i].outputs) producer[o] = static_cast<int>(i);
  std::set<std::string> wanted;
  for (const auto& name : outputs) {
    const bool input = std::find(g.inputs.begin(), g.inputs.end(), name) != g.inputs.end();
    if (!input && !producer.count(name))
      throw Error(where + ": '" + name + "' is neither a node's output nor an input of the graph");
    if (input && !inputs.count(name)) throw Error(where + ": output '" + name + "' is a graph input the batch lacks");
    if (!input) wanted.insert(name);
  }
  const ProgramBatch fed = program_batch(inputs, "forward", -1, true);
  std::map<std::string, std::map<int, at::Tensor>> captured;
  state_.sync_buffers();
  {
    UseSource use(source_, &fed);
    Capture keep(*executor_, wanted, captured);
    executor_->decode_positions(decode);
    try {
      executor_->run(model_.eval_schedule(), 0, false);
    } catch (...) {
      executor_->decode_positions(nullptr);
      throw;
    }
    executor_->decode_positions(nullptr);
  }
  const DeviceMesh& mesh = context_.mesh();
  Batch out;
  for (const auto& name : outputs) {
    if (!wanted.count(name)) {
      out[name] = inputs.at(name);
      continue;
    }
    const int owner = plan.rank_of(plan.stage_of_node[static_cast<size_t>(producer.at(name))]);
    at::Tensor value;
    if (mesh.coord(Role::Pipeline) == owner) {
      std::vector<at::Tensor> parts;
      for (auto& [mb, t] : captured[name]) parts.push_back(t);
      if (static_cast<int>(parts.size()) == model_.microbatches())
        value = parts.front().dim() == 0 ? at::stack(parts) : at::cat(parts, 0);
      // A value its kind leaves sharded over an axis (ABI 2.7) is put together
      // here, where every rank of that axis holds its slice.
      const GraphNode& n = g.nodes[static_cast<size_t>(producer.at(name))];
      const KindInference how = model_.registry().inference(n.kind, method_of(n));
      const auto index = std::find(n.outputs.begin(), n.outputs.end(), name) - n.outputs.begin();
      if (value.defined() && how.sharded_output == index) {
        Communicator& comm = context_.comm(mesh.axis(how.shard_axis));
        if (comm.size() > 1) value = gather_along(comm, value, how.shard_dim);
      }
    }
    if (mesh.size(Role::Pipeline) > 1) value = broadcast_value(context_.comm(Role::Pipeline), value, owner, context_.device());
    if (!value.defined()) {
      std::string need;
      for (const auto& m : missing_inputs(g, producer, name, inputs)) need += (need.empty() ? "'" : ", '") + m + "'";
      throw Error(where + ": output '" + name + "' of node '" + g.nodes[static_cast<size_t>(producer.at(name))].name +
                  "' was not computed: it needs graph input " + (need.empty() ? "(none missing?)" : need) +
                  ", which the batch lacks");
    }
    out[name] = value;
  }
  return out;
}

}  // namespace smp
