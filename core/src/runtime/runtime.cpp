// The composition root: a runtime is a parallel context, a model builder, a
// train state, an optimizer step, a step runner and its checkpointer, made in
// that order and destroyed in the reverse one (a pending save is waited for
// first, modules go before the plugins that made them, communicators last).
#include <smp/runtime.h>

#include <smp/config_keys.h>
#include <smp/error.h>
#include <smp/job_config.h>
#include <smp/mesh.h>
#include <smp/plugin_registry.h>

#include "base/device.h"
#include "checkpoint/checkpoint.h"
#include "comm/communicator.h"
#include "comm/process_groups.h"
#include "optim/mixed_precision.h"
#include "runtime/checkpointer_impl.h"
#include "runtime/checkpointing.h"
#include "runtime/data_source.h"
#include "runtime/model_plan.h"
#include "runtime/optimizer_step.h"
#include "runtime/parallel_context.h"
#include "runtime/step_runner.h"
#include "runtime/train_state.h"
#include "runtime/whole_model.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <optional>
#include <random>

namespace smp {

struct Runtime::Impl {
  explicit Impl(const Config& c) : job(JobConfig::from(c)) {}
  JobConfig job;  // typed, what every part reads; job.source the config as loaded (Runtime::config())
  std::unique_ptr<ParallelContext> context;
  std::unique_ptr<const ModelPlan> model;
  std::unique_ptr<TrainState> state;
  std::unique_ptr<OptimizerStep> update;
  std::unique_ptr<StepRunner> steps;
  std::unique_ptr<Checkpointer> checkpoints;  // last: waits for its pending save first
  bool checked_trainer_keys = false;  // at the first step the program took itself
  StepResult step(const Batch* batch);
  Checkpointing* saving = nullptr;  // the checkpointer's
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
std::unique_ptr<Runtime> Runtime::create(Config config, const ProcessEnv& env, const std::vector<PluginSource>& plugins) {
  return create(std::move(config), env, plugins, RuntimeOptions{});
}

std::unique_ptr<Runtime> Runtime::create(Config config, const ProcessEnv& env, const std::vector<PluginSource>& plugins,
                                         const Batch& example) {
  RuntimeOptions options;
  options.example = example;
  return create(std::move(config), env, plugins, options);
}

std::unique_ptr<Runtime> Runtime::create(Config config, const ProcessEnv& env, const std::vector<PluginSource>& plugins,
                                         const RuntimeOptions& options) {
  config.resolve_layout(env.world_size);
  std::unique_ptr<Runtime> rt(new Runtime(std::make_unique<Impl>(config)));
  Impl& s = *rt->impl_;
  const Batch& example = options.example;
  s.context = ParallelContext::join(s.job, env);
  auto model = std::make_unique<const ModelDefinition>(s.job, s.context->mesh(), plugins);
  std::optional<ProgramBatch> fed;
  if (!example.empty()) {
    ProgramBatch::Rules rules;
    rules.microbatches = 1;  // any rows: the profile runs the whole example as one microbatch
    rules.device = s.context->device();
    rules.where = "rank " + std::to_string(env.rank) + ": the example batch given to Runtime::create";
    fed.emplace(example, model->graph().inputs, rules);
  }
  s.model = std::make_unique<const ModelPlan>(std::move(model), s.job, s.context->mesh(), &s.context->rendezvous(),
                                              fed ? &*fed : nullptr);
  s.state = std::make_unique<TrainState>(s.job, *s.context, *s.model);
  s.update = std::make_unique<OptimizerStep>(s.job.train);
  s.steps = std::make_unique<StepRunner>(s.job, *s.context, *s.model, *s.state);
  if (fed) s.steps->expect_inputs(fed->spec());
  // The token names this run's temporary checkpoint folders (the same on every rank).
  uint64_t token = 0;
  if (s.context->mesh().rank() == 0) token = std::random_device{}() & ((uint64_t{1} << 32) - 1);
  token = static_cast<uint64_t>(rt->gather_world(static_cast<double>(token)).at(0));
  auto saving = std::make_unique<Checkpointer::Impl>();
  saving->checkpoints = std::make_unique<Checkpointing>(s.job, *s.context, *s.model, *s.state, token);
  saving->state = s.state.get();
  saving->asked = s.job.source->has("run.resume") || s.job.source->has("run.checkpoint_dir");
  s.saving = saving->checkpoints.get();
  s.checkpoints.reset(new Checkpointer(std::move(saving)));
  if (options.resume_at_create) s.checkpoints->resume_if_asked();
  return rt;
}

std::unique_ptr<Runtime> Runtime::create(const Options& options, const ProcessEnv& env,
                                         const std::vector<PluginSource>& plugins) {
  RuntimeOptions o;
  o.example = options.example();
  return create(options.config(), env, plugins, o);
}

namespace {

// The keys only smp::Trainer acts on (config_keys.h), refused when one asks
// for something and the program steps the runtime itself: otherwise ignored.
void refuse_trainer_keys(const Config& config) {
#define SMP_KEY_NAME(key) key,
  const nlohmann::json all = config.to_json();
  for (const char* key : {SMP_TRAINER_KEYS(SMP_KEY_NAME)}) {
    const std::string k = key, table = k.substr(0, k.find('.')), name = k.substr(k.find('.') + 1);
    const nlohmann::json& v = all.at(table).at(name);
    if (config.has(k) && (v.is_boolean() ? v.get<bool>() : v.get<double>() != 0))
      throw Error(config.origin_of(k) + ": " + k + " is acted on only by the training loop (smp::Trainer in "
                  "smp/training.h, which smp-worker runs); this program steps the Runtime itself: step through "
                  "smp::Trainer::step, or leave it unset");
  }
#undef SMP_KEY_NAME
}

}  // namespace

StepResult Runtime::train_step() { return train_step_of(nullptr); }
StepResult Runtime::train_step(const Batch& batch) { return train_step_of(&batch); }
StepResult Runtime::step_for_trainer(const Batch* batch) { return impl_->step(batch); }

// A step the program takes itself, also after a Trainer's: the cadence keys
// would go unheeded.
StepResult Runtime::train_step_of(const Batch* batch) {
  if (!impl_->checked_trainer_keys) refuse_trainer_keys(*impl_->job.source);
  impl_->checked_trainer_keys = true;
  return impl_->step(batch);
}

StepResult Runtime::Impl::step(const Batch* batch) {
  return steps->train(*update, [this] { saving->writer().wait_for_snapshot(); }, batch);
}

void Runtime::set_learning_rate(double lr) { impl_->update->set_lr(lr); }
double Runtime::evaluate(int batches) { return impl_->steps->evaluate(batches); }
double Runtime::evaluate(const Batch& batch) { return impl_->steps->evaluate(batch); }
Batch Runtime::forward(const Batch& inputs, const std::vector<std::string>& outputs) {
  return impl_->steps->forward(inputs, outputs);
}
Batch Runtime::decode(const Batch& inputs, const DecodePositions& positions, const std::vector<std::string>& outputs) {
  return impl_->steps->forward(inputs, outputs, &positions);
}

std::vector<std::pair<std::string, double>> Runtime::validation_metrics() const { return impl_->steps->last_metrics(); }

int64_t Runtime::steps_done() const { return impl_->state->steps(); }
Checkpointer& Runtime::checkpoints() { return *impl_->checkpoints; }
const Checkpointer& Runtime::checkpoints() const { return *impl_->checkpoints; }
int64_t Runtime::parameter_init_peak() const { return impl_->state->parameter_init_peak(); }
std::string Runtime::device() const { return impl_->context->device().str(); }
std::string Runtime::precision() const { return to_string(impl_->job.train.precision); }
double Runtime::measure_peak_flops() const { return measure_peaks().measured; }
PeakFlops Runtime::measure_peaks() const {
  return smp::measure_peaks(impl_->context->device(), compute_dtype(impl_->job.train.precision));
}
int64_t Runtime::parameter_count() const { return impl_->state->parameter_count(); }
const Config& Runtime::config() const { return *impl_->job.source; }
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
void Runtime::release_parameters() { impl_->state->release_parameters(); }
std::vector<std::pair<std::string, at::Tensor>> Runtime::model_state_dict() {
  return whole_model(impl_->state->entries(), impl_->context->comm(Role::World), impl_->context->device());
}
std::vector<std::vector<double>> Runtime::gather_world(const std::vector<double>& values) {
  const int world = impl_->context->mesh().world_size();
  const int64_t n = static_cast<int64_t>(values.size());
  at::Tensor in = at::tensor(values, at::kDouble);
  at::Tensor out = at::empty({world * n}, at::kDouble);
  if (n > 0) impl_->context->comm(Role::World).allgather(in, out)->wait();
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
