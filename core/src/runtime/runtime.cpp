// The composition root: a runtime is a parallel context, a model builder, a
// train state and an optimizer step, made in that order and destroyed in the
// reverse one (modules before the plugins that made them, communicators last).
#include <smp/runtime.h>

#include <smp/error.h>
#include <smp/job_config.h>
#include <smp/mesh.h>
#include <smp/plugin_registry.h>

#include "base/device.h"
#include "base/op_profile.h"
#include "base/trace.h"
#include "checkpoint/checkpoint.h"
#include "comm/communicator.h"
#include "comm/process_groups.h"
#include "memory/activation_offload.h"
#include "memory/gradient_sync.h"
#include "memory/memory_model.h"
#include "optim/mixed_precision.h"
#include "pipeline/executor.h"
#include "runtime/model_builder.h"
#include "runtime/optimizer_step.h"
#include "runtime/parallel_context.h"
#include "runtime/train_state.h"

#include <c10/core/GradMode.h>
#include <spdlog/spdlog.h>

#include <boost/filesystem.hpp>

#include <chrono>
#include <cstdio>
#include <random>

namespace smp {

struct Runtime::Impl {
  explicit Impl(Config c) : config(std::move(c)), job(JobConfig::from(config)) {}
  Config config;  // as loaded, for Runtime::config() and the summary
  JobConfig job;  // the same, typed: what every part reads
  std::unique_ptr<ParallelContext> context;
  std::unique_ptr<ModelBuilder> model;
  std::unique_ptr<TrainState> state;
  std::unique_ptr<OptimizerStep> update;
  std::unique_ptr<ActivationOffload> offload;  // memory.offload: checkpointed inputs in host memory
  std::unique_ptr<Executor> executor;
  std::vector<std::pair<std::string, double>> last_metrics;  // of the last evaluate()
  std::unique_ptr<CheckpointWriter> checkpoints;  // last: waits for its pending save first

  // What a checkpoint's manifest says besides its tensors.
  nlohmann::json checkpoint_info() const {
    const DeviceMesh& mesh = context->mesh();
    nlohmann::json layout = {{"pp", mesh.pp()},
                             {"tp", mesh.tp()},
                             {"dp", mesh.dp()},
                             {"ep", mesh.ep()},
                             {"world", mesh.world_size()},
                             {"placement", mesh.order()},
                             {"zero", job.memory.zero},
                             {"virtual_stages", job.parallel.virtual_stages},
                             {"precision", to_string(job.train.precision)}};
    std::string version;
    for (const auto& p : model->registry().plugins())
      if (p.name == model->adapter_plugin()) version = p.version;
    nlohmann::json nodes = nlohmann::json::array();  // what tools need to name the tensors (smp-checkpoint export)
    for (const auto& n : model->graph().nodes)
      nodes.push_back({{"name", n.name}, {"kind", n.kind}, {"config", nlohmann::json::parse(n.config_json)}});
    return {{"step", state->steps()},
            {"graph", nodes},
            {"adapter", {{"name", model->adapter_name()}, {"plugin", model->adapter_plugin()}, {"version", version}}},
            {"model", job.model},
            {"layout", layout},
            {"config", config.to_json()},
            {"seed", job.train.seed},
            {"smp_version", SMP_VERSION},
            {"torch_version", SMP_BUILD_TORCH_VERSION}};
  }

  // The executor over this rank's stages.
  void make_executor() {
    ExecutorSetup setup;
    setup.graph = &model->graph();
    setup.plan = &model->stage_plan();
    setup.pp_rank = context->mesh().coord(Axis::PP);
    setup.pp_comm = context->mesh().pp() > 1 ? &context->comm(Axis::PP) : nullptr;
    setup.modules = &state->modules();
    setup.seed = job.train.seed;
    setup.loss = &model->loss();
    setup.device = context->device();
    setup.compute_dtype = compute_dtype(job.train.precision);
    setup.gather = job.memory.zero == 3 ? state->sharded() : nullptr;
    setup.checkpoint = model->checkpointed();
    if (job.memory.offload) {
      offload = std::make_unique<ActivationOffload>(context->device(), job.memory.offload_horizon);
      setup.offload = offload.get();
    }
    const ModelBuilder* m = model.get();
    setup.batch = [m](int64_t step, int mb, bool training) {
      return m->batch(training ? SMP_SPLIT_TRAIN : SMP_SPLIT_VALIDATION, step, mb);
    };
    executor = std::make_unique<Executor>(setup);
    context->groups().reset_stats();
  }
};

Runtime::Runtime(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

void Runtime::shutdown() {
  if (impl_ && impl_->context) impl_->context->leave(impl_->job.run.timeout_s);
}

Runtime::~Runtime() {
  if (!impl_ || !impl_->context || !impl_->context->joined() || std::uncaught_exceptions()) return;
  try {
    shutdown();
  } catch (const std::exception& e) {
    spdlog::warn("shutdown: {}", e.what());
  }
}

// Top to bottom: config -> mesh and communicators -> plugins, graph, plan -> state -> step.
std::unique_ptr<Runtime> Runtime::create(Config config, const ProcessEnv& env, const std::vector<std::string>& plugins) {
  config.resolve_layout(env.world_size);
  std::unique_ptr<Runtime> rt(new Runtime(std::make_unique<Impl>(std::move(config))));
  Impl& s = *rt->impl_;
  s.context = ParallelContext::join(s.job, env);
  s.model = std::make_unique<ModelBuilder>(s.job, s.context->mesh(), plugins);
  s.model->plan(&s.context->rendezvous());
  s.state = std::make_unique<TrainState>(s.job, *s.context, *s.model);
  s.update = std::make_unique<OptimizerStep>(s.job.train);
  s.make_executor();
  // The token names this run's temporary checkpoint folders (the same on every rank).
  uint64_t token = 0;
  if (s.context->mesh().rank() == 0) token = std::random_device{}() & ((uint64_t{1} << 32) - 1);
  token = static_cast<uint64_t>(rt->gather_world(static_cast<double>(token)).at(0));
  CheckpointWriter::Options o;
  o.rank = s.context->mesh().rank();
  o.world = s.context->mesh().world_size();
  o.timeout_s = s.job.run.timeout_s;
  o.token = token;
  s.checkpoints = std::make_unique<CheckpointWriter>(o);
  return rt;
}

nlohmann::json Runtime::estimate_memory(Config config, int world_size, const std::vector<std::string>& plugins) {
  config.resolve_layout(world_size);
  const JobConfig job = JobConfig::from(config);
  const auto context = ParallelContext::offline(job, world_size);
  ModelBuilder model(job, context->mesh(), plugins);
  model.plan(nullptr);
  const MemoryModelOptions o = model.memory_options();
  nlohmann::json ranks = nlohmann::json::array();
  double worst = 0;
  for (const RankMemory& m : smp::estimate_memory(model.graph(), model.stage_plan(), model.schedule(), o)) {
    ranks.push_back(to_json(m));
    worst = std::max(worst, m.total());
  }
  const ParallelConfig& par = job.parallel;
  nlohmann::json out;
  out["layout"] = {{"pp", par.pp}, {"tp", par.tp}, {"dp", par.dp}, {"world", world_size},
                   {"microbatches", par.microbatches}, {"schedule", par.schedule}};
  out["memory"] = {{"zero", job.memory.zero},
                   {"checkpointed_nodes", std::count(o.checkpoint.begin(), o.checkpoint.end(), true)},
                   {"precision", to_string(job.train.precision)}};
  out["per_pp_rank"] = ranks;
  out["max_total_bytes"] = worst;
  return out;
}

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

StepResult Runtime::train_step() {
  Impl& s = *impl_;
  TrainState& state = *s.state;
  using clock = std::chrono::steady_clock;
  auto since = [](clock::time_point t) { return std::chrono::duration<double>(clock::now() - t).count(); };
  const auto t0 = clock::now();
  const c10::Device& device = s.context->device();
  StepResult out;
  out.loss_scale = state.scaler() ? state.scaler()->scale() : 1.0;
  s.model->loss().set_loss_scale(out.loss_scale);
  const int64_t held_before = reset_device_peak(device);  // CUDA: the step's peak is counted above it
  trace::set_step(state.steps());
  trace::Scope step_scope("step", "step " + std::to_string(state.steps() + 1));
  op_profile::StepScope ops(state.steps());
  state.sync().begin_step();
  ExecutorResult r = [&] {
    trace::Scope phase("phase", "pipeline");
    return s.executor->run(s.model->schedule(), state.steps(), true);
  }();
  out.phases.compute = since(t0);
  const auto t1 = clock::now();
  {
    trace::Scope phase("phase", "grad_sync");
    state.sync().finish_step();
  }
  out.phases.grad_sync = since(t1);
  s.checkpoints->wait_for_snapshot();  // a background save's copies are taken before the update
  // The graph's metrics, counted once per group of model-axis replicas.
  const auto& metrics = s.model->graph().metrics;
  std::vector<double> metric_sums(2 * metrics.size(), 0.0);
  if (s.context->mesh().at_model_origin())
    for (size_t k = 0; k < metrics.size(); ++k)
      metric_sums[2 * k] = r.metrics[k].first, metric_sums[2 * k + 1] = r.metrics[k].second;
  const OptimizerStepResult u = s.update->run(state, r.loss, out.loss_scale, s.context->mesh(),
                                              s.context->comm(Axis::World), device, &metric_sums);
  out.metrics = metric_values(metrics, metric_sums);
  out.phases.clip = u.clip_seconds;
  out.phases.optimizer = u.optimizer_seconds;
  out.step = state.steps();
  state.step_done();
  out.skipped = u.skipped;
  out.loss = LossNormalizer::mean(u.loss);
  out.grad_norm = u.grad_norm;
  out.grad_scale = u.grad_scale;
  out.lr = u.lr;
  out.peak_activation_bytes = device.is_cuda() ? device_peak_bytes(device) - held_before : r.peak_bytes;
  out.memory = state.memory_account(out.peak_activation_bytes);
  out.memory.offloaded = r.offloaded_peak_bytes;
  out.memory.activations = r.activation_peak_bytes;
  out.memory.largest_slot = r.largest_slot_bytes;
  out.memory.send_buffers = r.send_buffer_peak_bytes;
  out.seconds = since(t0);
  return out;
}

double Runtime::evaluate(int batches) {
  Impl& s = *impl_;
  c10::NoGradGuard ng;
  LossSums local;
  const auto& metrics = s.model->graph().metrics;
  std::vector<double> sums(2 * metrics.size(), 0.0);  // sum, count per metric; in the loss's all-reduce
  for (int b = 0; b < batches; ++b) {
    ExecutorResult r = s.executor->run(s.model->eval_schedule(), b, false);
    local += r.loss;
    for (size_t k = 0; k < metrics.size(); ++k) {
      sums[2 * k] += r.metrics[k].first;
      sums[2 * k + 1] += r.metrics[k].second;
    }
  }
  const DeviceMesh& mesh = s.context->mesh();
  if (!mesh.at_model_origin()) std::fill(sums.begin(), sums.end(), 0.0);  // once per model-axis group
  const double mean = LossNormalizer::mean(sum_over_world(local, sums, mesh, s.context->comm(Axis::World)));
  s.last_metrics = metric_values(metrics, sums);
  return mean;
}

std::vector<std::pair<std::string, double>> Runtime::validation_metrics() const { return impl_->last_metrics; }

int64_t Runtime::steps_done() const { return impl_->state->steps(); }
int64_t Runtime::parameter_init_peak() const { return impl_->state->parameter_init_peak(); }
std::string Runtime::device() const { return impl_->context->device().str(); }
std::string Runtime::precision() const { return to_string(impl_->job.train.precision); }
double Runtime::measure_peak_flops() const {
  return gemm_peak_flops(impl_->context->device(), compute_dtype(impl_->job.train.precision));
}
const Config& Runtime::config() const { return impl_->config; }
const JobConfig& Runtime::job() const { return impl_->job; }
const DeviceMesh& Runtime::mesh() const { return impl_->context->mesh(); }
const ModelGraph& Runtime::graph() const { return impl_->model->graph(); }
const StagePlan& Runtime::plan() const { return impl_->model->stage_plan(); }
const PluginRegistry& Runtime::plugins() const { return impl_->model->registry(); }
double Runtime::flops_per_step() const {
  return impl_->model->graph().flops_per_sample * static_cast<double>(impl_->model->global_batch());
}
double Runtime::items_per_step() const {
  return impl_->model->graph().throughput_per_sample * static_cast<double>(impl_->model->global_batch());
}
const std::string& Runtime::throughput_unit() const { return impl_->model->graph().throughput_unit; }

nlohmann::json Runtime::comm_bytes() const {
  nlohmann::json sent = nlohmann::json::object(), analytic = nlohmann::json::object(),
                 uncounted = nlohmann::json::object();
  for (const auto& [name, c] : impl_->context->groups().all()) {
    const CommStats st = c->stats();
    sent[name] = st.sent;
    analytic[name] = st.analytic;
    if (!st.uncounted_calls.empty()) uncounted[name] = st.uncounted_calls;
  }
  return {{"sent", sent}, {"analytic", analytic}, {"uncounted_calls", uncounted}};
}

void Runtime::reset_comm_stats() { impl_->context->groups().reset_stats(); }

std::vector<ParameterView> Runtime::parameters() const { return impl_->state->parameters(); }
std::vector<ParameterView> Runtime::gather_parameters() {
  impl_->state->gather_parameters();
  return impl_->state->parameters();
}
std::vector<StateEntry> Runtime::state_entries() const { return impl_->state->entries(); }
void Runtime::load_state(const std::vector<StateEntry>& entries) {
  impl_->checkpoints->wait_for_snapshot();
  impl_->state->load(entries);
}

// ---- checkpoints ----

void Runtime::save(const std::string& path) {
  Impl& s = *impl_;
  s.checkpoints->save(path, s.state->entries(), s.checkpoint_info(), /*async=*/false, /*keep=*/0,
                      /*update_latest=*/false);
}

std::string Runtime::checkpoint_dir() const {
  const RunConfig& run = impl_->job.run;
  return run.checkpoint_dir.empty() ? (boost::filesystem::path(run.dir) / "checkpoints").string() : run.checkpoint_dir;
}

void Runtime::save_checkpoint() {
  Impl& s = *impl_;
  char name[32];
  std::snprintf(name, sizeof name, "step-%08lld", static_cast<long long>(s.state->steps()));
  const std::string path = (boost::filesystem::path(checkpoint_dir()) / name).string();
  s.checkpoints->save(path, s.state->entries(), s.checkpoint_info(), s.job.run.checkpoint_async,
                      s.job.run.keep_checkpoints, /*update_latest=*/true);
}

void Runtime::wait_for_checkpoint() { impl_->checkpoints->wait(); }
double Runtime::checkpoint_blocking_seconds() const { return impl_->checkpoints->last_blocking_seconds(); }
double Runtime::checkpoint_total_seconds() const { return impl_->checkpoints->last_total_seconds(); }
int64_t Runtime::checkpoint_bytes() const { return impl_->checkpoints->last_bytes(); }

namespace {

// A checkpoint this run may take values from: its folder and manifest, and the
// keys of [model] that differ from this run's ("" when the tables agree; then a
// tensor whose shape differs can only be the layout's vocabulary padding).
// Manifests written by `smp-checkpoint import` have no [model] or layout.
struct OpenedCheckpoint {
  std::string folder;
  nlohmann::json manifest;
  std::string changed;
};

// require_adapter: a checkpoint that names no adapter is refused too (a resume
// needs the whole state of this adapter; run.init_from takes imported files).
OpenedCheckpoint open_checkpoint(const std::string& path, const std::string& what, const std::string& adapter,
                                 bool require_adapter, const nlohmann::json& model) {
  OpenedCheckpoint c;
  c.folder = find_checkpoint(path);
  if (c.folder.empty()) throw Error(what + ": '" + path + "' is not a checkpoint folder nor holds a `latest` one");
  c.manifest = read_manifest(c.folder);
  const std::string saved = c.manifest.value("/adapter/name"_json_pointer, std::string());
  if ((require_adapter || !saved.empty()) && saved != adapter)
    throw Error(what + ": checkpoint " + c.folder + " was saved by adapter '" + saved + "', this run's is '" +
                adapter + "'");
  const nlohmann::json was = c.manifest.value("model", nlohmann::json());
  if (!was.is_object()) {
    c.changed = "(not recorded)";
    return c;
  }
  for (const auto& [k, v] : model.items())
    if (!was.contains(k) || was[k] != v) c.changed += (c.changed.empty() ? "" : ", ") + ("model." + k);
  for (const auto& [k, v] : was.items())
    if (!model.contains(k)) c.changed += (c.changed.empty() ? "" : ", ") + ("model." + k);
  return c;
}

}  // namespace

void Runtime::load(const std::string& path) {
  Impl& s = *impl_;
  s.checkpoints->wait_for_snapshot();
  const OpenedCheckpoint c = open_checkpoint(path, "checkpoint", s.model->adapter_name(), true, s.job.model);
  try {
    s.state->load_with(
        [&](const std::vector<StateEntry>& live) { load_entries(c.folder, c.manifest, live, c.changed.empty()); });
  } catch (const Error& e) {
    if (c.changed.empty()) throw;
    throw Error(std::string(e.what()) + "; the checkpoint's [model] differs in " + c.changed);
  }
  if (s.context->mesh().rank() == 0) {
    const nlohmann::json l = c.manifest.value("layout", nlohmann::json::object());
    spdlog::info("loaded checkpoint {} (step {}, saved at pp={} tp={} dp={} zero {}, {})", c.folder,
                 c.manifest.value("step", int64_t{0}), l.value("pp", 0), l.value("tp", 0), l.value("dp", 0),
                 l.value("zero", 0), l.value("precision", "?"));
    if (!c.changed.empty()) spdlog::warn("checkpoint {}: [model] differs in {}", c.folder, c.changed);
    const auto saved_seed = c.manifest.value("seed", s.job.train.seed);
    if (saved_seed != s.job.train.seed)
      spdlog::warn("checkpoint {} was saved with train.seed = {}, this run has {}: data order and dropout differ",
                   c.folder, saved_seed, s.job.train.seed);
  }
}

std::string Runtime::resume() {
  const std::string& mode = impl_->job.run.resume;
  const std::string folder = resume_checkpoint(mode);
  if (folder.empty() && !impl_->job.run.init_from.empty()) init_from(impl_->job.run.init_from);
  return folder;
}

std::string Runtime::resume_checkpoint(const std::string& mode) {
  if (mode == "never") return "";
  const std::string dir = checkpoint_dir();
  std::string folder;
  if (mode == "auto" || mode == "latest") {
    folder = find_checkpoint(dir);
    if (folder.empty()) {
      if (mode == "latest")
        throw Error("run.resume = \"latest\": no checkpoint in " + dir + " (no `latest` there)");
      return "";
    }
  } else {
    folder = find_checkpoint(mode);
    if (folder.empty()) throw Error("run.resume: '" + mode + "' is not a checkpoint folder nor holds a `latest` one");
  }
  load(folder);
  return folder;
}

void Runtime::init_from(const std::string& path) {
  Impl& s = *impl_;
  s.checkpoints->wait_for_snapshot();
  const OpenedCheckpoint c = open_checkpoint(path, "run.init_from", s.model->adapter_name(), false, s.job.model);
  s.state->load_with([&](const std::vector<StateEntry>& live) {
    std::vector<StateEntry> parameters;
    for (const auto& e : live)
      if (e.name.rfind("model/", 0) == 0 || e.name.rfind("optim/master/", 0) == 0) parameters.push_back(e);
    load_entries(c.folder, c.manifest, parameters, c.changed.empty());
  });
  if (s.context->mesh().rank() == 0) spdlog::info("parameters from {} (run.init_from)", c.folder);
}

std::vector<std::vector<double>> Runtime::gather_world(const std::vector<double>& values) {
  const int world = impl_->context->mesh().world_size();
  const int64_t n = static_cast<int64_t>(values.size());
  at::Tensor in = at::tensor(values, at::kDouble);
  at::Tensor out = at::empty({world * n}, at::kDouble);
  if (n > 0) impl_->context->comm(Axis::World).allgather(in, out)->wait();
  std::vector<std::vector<double>> v(world);
  for (int i = 0; i < world; ++i) v[i].assign(out.data_ptr<double>() + i * n, out.data_ptr<double>() + (i + 1) * n);
  return v;
}

std::vector<double> Runtime::gather_world(double value) {
  std::vector<double> v;
  for (const auto& rank : gather_world(std::vector<double>{value})) v.push_back(rank[0]);
  return v;
}

}  // namespace smp
