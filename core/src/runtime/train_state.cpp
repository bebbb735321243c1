#include "runtime/train_state.h"

#include "base/test_faults.h"

#include "runtime/buffer_sync.h"

#include <smp/error.h>

#include "base/seeds.h"
#include "comm/communicator.h"
#include "comm/process_groups.h"
#include "memory/gradient_sync.h"
#include "memory/memory_tracker.h"
#include "memory/sharded_parameters.h"
#include "optim/mixed_precision.h"
#include "plugin/optimizer_instance.h"
#include "plugin/module_instance.h"
#include "runtime/model_plan.h"
#include "runtime/parallel_context.h"
#include "runtime/replica_check.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <nlohmann/json.hpp>

#include <set>

namespace smp {

struct TrainState::Trained {
  std::string name;
  Placements placements;
  at::Tensor tensor;
};

// The trainable parameters of this rank's modules, in GradientSync's order.
struct TrainState::Listed {
  std::vector<at::Tensor> tensors;
  std::vector<std::shared_ptr<const sdk::InitSpec>> inits;  // deferred init: how to fill each (or null)
  std::vector<SyncedParameter> synced;
};

TrainState::TrainState(const JobConfig& job, const ParallelContext& context, const ModelPlan& model)
    : job_(job), context_(context), model_(model) {
  {
    MemoryTracker created;
    create_modules();
    created_bytes_ = created.current();
    parameter_init_peak_ = created.peak();
  }
  check_replicas();
  std::vector<BufferToSync> buffers;
  for (const auto& key : module_order_)
    for (const auto& p : modules_.at(key)->parameters())
      if (p.buffer) buffers.push_back({p.tensor, p.placements.data_parallel_axis()});
  buffers_ = std::make_unique<BufferSync>(buffers, [this](Axis a) -> Communicator& { return context_.comm(a); });
  lay_out(make_tied_groups());
}

void TrainState::sync_buffers() { buffers_->run(); }

// Gradient buffers and the optimizer go before the modules whose parameters they hold.
TrainState::~TrainState() {
  optimizer_.reset();
  sync_.reset();
  masters_.reset();
  sharded_.reset();
}

void TrainState::create_modules() {
  const DeviceMesh& mesh = context_.mesh();
  const ModelGraph& graph = model_.graph();
  const StagePlan& plan = model_.stage_plan();
  const int pp_rank = mesh.coord(Role::Pipeline);
  const std::string parallel_json = job_.parallel_json.dump(), tables_json = model_.plugin_tables().dump();
  std::set<std::string> recompute_core_keys;  // modules some node of which asks for attention-core recompute
  for (size_t i = 0; i < graph.nodes.size(); ++i)
    if (model_.recompute_core()[i]) recompute_core_keys.insert(graph.nodes[i].module_key());
  for (int c = 0; c < plan.chunks; ++c) {
    for (int idx : plan.nodes_of_stage[c * plan.pp + pp_rank]) {
      const GraphNode& node = graph.nodes[idx];
      const std::string& key = node.module_key();
      if (modules_.count(key)) continue;
      // ZeRO-3 asks every kind that can for deferred init: parameters come
      // without storage and only this rank's dp shard is ever generated.
      const bool deferred = job_.memory.zero == 3 && kind_defers_init(model_.registry(), node.kind);
      nlohmann::json memory = nlohmann::json::object();
      if (recompute_core_keys.count(key)) memory["recompute_attention_core"] = true;
      if (deferred) memory["deferred_init"] = true;
      ModuleSetup setup;
      setup.init_seed = derive_seed(job_.train.seed, key);
      setup.mesh = context_.groups().handle();
      setup.parallel_json = parallel_json;
      setup.device = context_.device();
      setup.memory_json = memory.dump();
      setup.tables_json = tables_json;
      modules_[key] = std::make_shared<ModuleInstance>(model_.registry(), node.kind, key, node.config_json, setup);
      module_order_.push_back(key);
    }
  }
}

// Data-parallel replicas start from the same values (deferred-init parameters
// are made from counter-based streams, the same on every replica by construction).
void TrainState::check_replicas() const {
  std::vector<ReplicaCandidate> candidates;
  for (const auto& key : module_order_)
    for (const auto& p : modules_.at(key)->parameters())
      if ((p.tensor.requires_grad() || p.buffer) && !p.init) candidates.push_back({p.name, p.tensor, p.placements.data_parallel_axis()});
  check_replicas_agree(candidates, context_.mesh(), [this](Axis a) -> Communicator& { return context_.comm(a); },
                       job_.origin);
}

// Shared modules whose nodes sit on stages of different pp ranks keep one
// replica per rank; their gradients are summed over those ranks.
std::map<std::string, Communicator*> TrainState::make_tied_groups() {
  const DeviceMesh& mesh = context_.mesh();
  const ModelGraph& graph = model_.graph();
  const StagePlan& plan = model_.stage_plan();
  std::map<std::string, std::set<int>> ranks_of_key;
  for (size_t i = 0; i < graph.nodes.size(); ++i)
    if (!graph.nodes[i].shared_key.empty())
      ranks_of_key[graph.nodes[i].shared_key].insert(plan.rank_of(plan.stage_of_node[i]));
  std::map<std::string, Communicator*> tied;
  const int pp_rank = mesh.coord(Role::Pipeline);
  const std::vector<int> pp_group = mesh.group(mesh.axis_with(Role::Pipeline));  // this rank's peers at every other coordinate
  for (const auto& [key, ranks] : ranks_of_key) {
    if (ranks.size() < 2 || !ranks.count(pp_rank)) continue;
    std::vector<int> world_ranks;
    for (int p : ranks) world_ranks.push_back(pp_group[static_cast<size_t>(p)]);
    std::string name = "tied." + key + "." + mesh.group_name(mesh.axis_with(Role::Pipeline));
    tied[key] = &context_.groups().derived("tied." + key, "tied", name, world_ranks);
  }
  return tied;
}

namespace {

// How this rank uses each module key: on how many of its stages (each use adds
// one gradient per microbatch), and the lowest pp rank holding it (which
// counts a tied module's values once).
struct ModuleUse {
  std::map<std::string, int> stages_here;
  std::map<std::string, int> first_rank;
};

ModuleUse module_use(const ModelGraph& graph, const StagePlan& plan, int pp_rank) {
  ModuleUse use;
  for (int c = 0; c < plan.chunks; ++c) {
    std::set<std::string> keys;
    for (int idx : plan.nodes_of_stage[c * plan.pp + pp_rank]) keys.insert(graph.nodes[idx].module_key());
    for (const auto& k : keys) use.stages_here[k]++;
  }
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    const int r = plan.rank_of(plan.stage_of_node[i]);
    auto [it, fresh] = use.first_rank.emplace(graph.nodes[i].module_key(), r);
    if (!fresh) it->second = std::min(it->second, r);
  }
  return use;
}

// Which data rank counts a parameter replicated over its data axis in the
// global norm: the one with the fewest elements so far, so that every data
// rank computes its share of the norm at the same time instead of the others
// waiting on rank 0.
class NormBalance {
 public:
  explicit NormBalance(const DeviceMesh& mesh) : mesh_(mesh) {}
  int owner(Axis data, int64_t numel, bool sharded) {
    std::vector<int64_t>& load = load_[data];
    load.resize(static_cast<size_t>(mesh_.size(data)), 0);
    const int owner = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    if (!sharded) load[static_cast<size_t>(owner)] += numel;
    return owner;
  }

 private:
  const DeviceMesh& mesh_;
  std::map<Axis, std::vector<int64_t>> load_;  // per data axis: elements counted on each of its ranks
};

}  // namespace

// The parts below, in order: which parameters train and how each is reduced
// and counted (list_trained), their compute dtype (cast_to_compute_dtype), the
// gradient buckets, and the optimizer over whole parameters or over ZeRO's
// shards (make_optimizer_over).
void TrainState::lay_out(const std::map<std::string, Communicator*>& tied) {
  Listed listed = list_trained(tied);
  auto laying_out = std::make_unique<MemoryTracker>();  // the parameters' casts, for parameter_init_peak
  std::vector<at::Tensor> fp32_values = cast_to_compute_dtype(listed.tensors);
  const int64_t cast_peak = laying_out->peak(), cast_current = laying_out->current();
  laying_out.reset();  // GradientSync's gradient buffers are not the parameters'
  sync_ = std::make_unique<GradientSync>(std::move(listed.synced),
                                         GradientSyncOptions{job_.train.bucket_bytes(), job_.memory.zero});
  parameter_init_peak_ = std::max(parameter_init_peak_, created_bytes_ + cast_peak);
  created_bytes_ += cast_current;
  make_optimizer_over(listed.tensors, std::move(fp32_values), listed.inits);
}

// Every reduction group of a parameter comes from its placements: its
// data-parallel group (dp, or edp when sharded over ep), the axes where its
// gradient is partial, and the tied-weight group of its module. Each distinct
// value is counted once in the global norm and written once to a checkpoint.
TrainState::Listed TrainState::list_trained(const std::map<std::string, Communicator*>& tied) {
  const DeviceMesh& mesh = context_.mesh();
  const int pp_rank = mesh.coord(Role::Pipeline);
  ModuleUse use = module_use(model_.graph(), model_.stage_plan(), pp_rank);
  const int zero = job_.memory.zero;
  NormBalance balance(mesh);
  Listed out;
  for (size_t unit = 0; unit < module_order_.size(); ++unit) {
    const std::string& key = module_order_[unit];
    auto tied_it = tied.find(key);
    for (const auto& p : modules_[key]->parameters()) {
      if (!p.tensor.requires_grad()) continue;
      out.tensors.push_back(p.tensor);
      out.inits.push_back(p.init);
      trained_.push_back({p.name, p.placements, p.tensor});
      SyncedParameter s = synced_parameter(p.tensor, p.placements, context_.groups());
      s.expected_grads = model_.microbatches() * use.stages_here[key];
      s.tied = tied_it == tied.end() ? nullptr : tied_it->second;
      s.grad_dtype = compute_dtype(job_.train.grad_reduce_dtype);
      s.unit = zero == 3 ? static_cast<int>(unit) : -1;
      out.synced.push_back(s);
      // Counted in the norm: shards everywhere (ZeRO's dp shards too),
      // replicas at coordinate 0 of their axes but the data axis (there, the
      // balanced owner), tied replicas on their first pp rank.
      const Placements placed = zero > 0 ? p.placements.sharded_over_data() : p.placements;
      const Axis data = placed.data_parallel_axis();
      const int owner = balance.owner(data, p.tensor.numel(), placed.sharded(data));
      const bool first_stage = use.first_rank[key] == pp_rank;
      norm_counted_.push_back(placed.counted_on(mesh, owner) && first_stage);
      // Who writes the whole parameter to a checkpoint (ZeRO 0-2): one replica.
      // Under ZeRO the norm counts each dp rank's shard, but the whole tensor
      // is the same on every dp rank and must be written once.
      whole_owner_.push_back(p.placements.counted_on(mesh, owner) && first_stage);
      if (whole_owner_.back()) parameter_count_ += p.tensor.numel();
    }
  }
  return out;
}

// Mixed precision: the parameters become 16-bit in place (their fp32 masters
// kept first: MasterWeights under ZeRO 0, else the fp32 values returned, kept
// only until the shards' masters are cut) before GradientSync lays out the
// gradient buckets for them. fp16 also gets its loss scaler.
std::vector<at::Tensor> TrainState::cast_to_compute_dtype(std::vector<at::Tensor>& all) {
  const TrainConfig& t = job_.train;
  std::vector<at::Tensor> fp32_values;
  if (t.precision != Precision::Fp32) {
    if (job_.memory.zero == 0)
      masters_ = std::make_unique<MasterWeights>(all, compute_dtype(t.precision));
    else
      fp32_values = cast_keeping_fp32(all, compute_dtype(t.precision));
  }
  if (t.precision == Precision::Fp16) {
    LossScaleOptions ls;
    ls.initial = t.initial_loss_scale;
    ls.window = t.loss_scale_window;
    ls.min = t.min_loss_scale;
    scaler_ = std::make_unique<DynamicLossScaler>(ls);
  }
  return fp32_values;
}

// ZeRO 0: the optimizer over the whole parameters (or their masters). ZeRO:
// over this rank's shard segments only; whole fp32 masters exist just long
// enough to cut the shards' masters from them.
void TrainState::make_optimizer_over(const std::vector<at::Tensor>& all, std::vector<at::Tensor> fp32_values,
                                     const std::vector<std::shared_ptr<const sdk::InitSpec>>& inits) {
  std::vector<bool> decay;
  if (job_.memory.zero == 0) {
    for (const auto& p : all) decay.push_back(job_.train.weight_decay_on == "all" || p.dim() >= 2);
    make_optimizer(masters_ ? masters_->masters() : all, decay);
    return;
  }
  bool any_deferred = false;
  for (const auto& i : inits) any_deferred = any_deferred || i;
  {
    MemoryTracker sharding;
    sharded_ = std::make_unique<ShardedParameters>(all, fp32_values, sync_->layout(), job_.memory.zero, module_order_,
                                                   any_deferred ? inits : std::vector<std::shared_ptr<const sdk::InitSpec>>{});
    fp32_values.clear();
    parameter_init_peak_ = std::max(parameter_init_peak_, created_bytes_ + sharding.peak());
  }
  for (const ShardSegment& seg : shard_segments(sync_->layout())) {
    decay.push_back(job_.train.weight_decay_on == "all" || all[seg.param].dim() >= 2);
    segment_counted_.push_back(norm_counted_[seg.param]);
  }
  make_optimizer(sharded_->optimizer_params(), decay);
  if (job_.memory.zero == 3) sync_->on_unit_gradient([this](int unit) { sharded_->gradient_arrived(unit); });
}

// train.optimizer, from whichever loaded plugin provides it, over `tensors`.
void TrainState::make_optimizer(const std::vector<at::Tensor>& tensors, const std::vector<bool>& decay) {
  const PluginRegistry& registry = model_.registry();
  const std::string& name = job_.train.optimizer;
  if (!registry.has_optimizer(name)) {
    std::string known;
    for (const auto& k : registry.optimizers()) known += (known.empty() ? "" : ", ") + k;
    throw Error(job_.origin + ": train.optimizer = \"" + name + "\": no loaded plugin provides it (optimizers: " +
                (known.empty() ? "none" : known) + "; a plugin of your own goes in plugins.paths)");
  }
  optimizer_ = std::make_unique<OptimizerInstance>(registry, name, job_.optimizer.dump(), tensors, decay,
                                                   job_.train.weight_decay);
}

std::vector<at::Tensor> TrainState::gradients() const {
  if (sharded_) return sync_->segment_gradients();
  std::vector<at::Tensor> grads(sync_->size());
  for (size_t k = 0; k < grads.size(); ++k) grads[k] = sync_->gradient(k);
  return grads;
}

const std::vector<bool>& TrainState::norm_counted() const { return sharded_ ? segment_counted_ : norm_counted_; }

std::vector<ParameterView> TrainState::parameters() const {
  const DeviceMesh& mesh = context_.mesh();
  // The shorthands: the first model axis (the built-in one, tp) and the expert axis.
  const Axis model = mesh.axes_with(Role::Model).front(), expert = mesh.axis_with(Role::Expert);
  std::vector<ParameterView> out;
  for (const auto& key : module_order_)
    for (const auto& p : modules_.at(key)->parameters()) {
      out.push_back({p.name, p.tensor, p.placements.shard_dim(model), p.placements.shard_dim(expert),
                     p.placements.per_axis(mesh)});
    }
  return out;
}

void TrainState::gather_parameters() {
  if (sharded_) sharded_->acquire_all();
}

void TrainState::release_parameters() {
  if (sharded_) sharded_->release_all();
}

MemoryAccount TrainState::memory_account(int64_t step_peak) const {
  MemoryAccount m;
  if (sharded_) {
    m.parameters = sharded_->parameter_bytes();
    m.optimizer_state = sharded_->master_bytes();
  } else {
    for (const auto& [key, module] : modules_)
      for (const auto& p : module->parameters())
        m.parameters += p.tensor.numel() * static_cast<int64_t>(p.tensor.element_size());
    if (masters_) m.optimizer_state = masters_->bytes();
  }
  m.gradients = sync_->bytes();
  m.optimizer_state += optimizer_->state_bytes();
  m.step_peak = step_peak;
  return m;
}

// ---- the enumeration ----

namespace {

// A parameter's block of its global tensor: the global tensor is the shards
// over every rule axis put together along their shard dimensions, in rank
// order (ep outermost, tp innermost when several shard one dimension).
StateEntry block_entry(const std::string& name, const at::Tensor& local, const Placements& placements,
                       const DeviceMesh& mesh, bool owner) {
  StateEntry e;
  e.name = name;
  e.block_shape = local.sizes().vec();
  e.global_shape = e.block_shape;
  e.offsets.assign(e.block_shape.size(), 0);
  const std::vector<Axis> axes = mesh.rule_axes();
  for (auto it = axes.rbegin(); it != axes.rend(); ++it) {
    const Axis& a = *it;
    const int d = placements.shard_dim(a);
    if (d < 0) continue;
    e.global_shape[d] *= mesh.size(a);
    e.offsets[d] = e.offsets[d] * mesh.size(a) + mesh.coord(a) * e.block_shape[d];
  }
  for (const AxisPlacement& p : placements.per_axis(mesh))
    if (mesh.size(mesh.axis(p.axis)) > 1) e.placements.push_back(p);
  e.local = local;
  e.owner = owner;
  return e;
}

StateEntry counter(const std::string& name, double value, at::ScalarType dtype, bool owner) {
  StateEntry e;
  e.name = name;
  e.local = at::scalar_tensor(value, at::TensorOptions().dtype(dtype));
  e.owner = owner;
  return e;
}

bool same_slice(const StateEntry& a, const StateEntry& b) {
  return a.global_shape == b.global_shape && a.offsets == b.offsets && a.block_shape == b.block_shape &&
         a.flat_begin == b.flat_begin && a.local.sizes() == b.local.sizes() &&
         a.local.scalar_type() == b.local.scalar_type();
}

std::string describe(const StateEntry& e) {
  auto dims = [](const std::vector<int64_t>& v) {
    std::string s;
    for (int64_t x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
    return "[" + s + "]";
  };
  return "global " + dims(e.global_shape) + " at " + dims(e.offsets) + " block " + dims(e.block_shape) +
         (e.flat_begin >= 0 ? " flat from " + std::to_string(e.flat_begin) : "") + " local " +
         dims(e.local.sizes().vec()) + " " + std::string(c10::toString(e.local.scalar_type()));
}

}  // namespace

// The counters: 0-d copies in entries(), set through their owners in load().
const char* const kCounters[] = {"train/step", "optim/step", "loss_scaler/scale", "loss_scaler/good_steps",
                                 "loss_scaler/skipped"};

std::vector<StateEntry> TrainState::entries() const {
  const DeviceMesh& mesh = context_.mesh();
  std::vector<StateEntry> out;
  const bool world_owner = mesh.rank() == 0;
  out.push_back(counter("train/step", static_cast<double>(steps_), at::kLong, world_owner));
  // Parameters nothing trains, whole on every rank holding them.
  for (const auto& key : module_order_)
    for (const auto& p : modules_.at(key)->parameters())
      if (!p.tensor.requires_grad())
        out.push_back(block_entry("model/" + p.name, p.tensor, p.placements, mesh, p.placements.counted_on(mesh)));
  // The trained ones whole (ZeRO 0-2: replicated over the data axis), and per
  // optimizer tensor the parameter it updates and its slice: whole, or under
  // ZeRO this rank's flat segment (which is all ZeRO-3 keeps of the parameter).
  std::vector<std::pair<std::string, StateEntry>> updated;
  if (job_.memory.zero < 3)
    for (size_t k = 0; k < trained_.size(); ++k)
      out.push_back(block_entry("model/" + trained_[k].name, trained_[k].tensor, trained_[k].placements, mesh,
                                whole_owner_[k]));
  if (!sharded_) {
    for (size_t k = 0; k < trained_.size(); ++k)
      updated.emplace_back(trained_[k].name, block_entry("", masters_ ? masters_->masters()[k] : trained_[k].tensor,
                                                         trained_[k].placements, mesh, norm_counted_[k]));
  } else {
    const std::vector<ShardSegment> segments = shard_segments(sync_->layout());
    for (size_t s = 0; s < segments.size(); ++s) {
      const Trained& t = trained_[segments[s].param];
      StateEntry e = block_entry("", t.tensor, t.placements, mesh, segment_counted_[s]);
      e.flat_begin = segments[s].param_begin;
      e.local = sharded_->parameter_segments()[s];
      if (job_.memory.zero == 3) {
        e.name = "model/" + t.name;
        out.push_back(e);
      }
      e.local = sharded_->optimizer_params()[s];
      updated.emplace_back(t.name, e);
    }
  }
  if (masters_ || (sharded_ && sharded_->has_masters()))
    for (const auto& [param, slice] : updated) {
      out.push_back(slice);
      out.back().name = "optim/master/" + param;
    }
  for (const OptimizerInstance::State& st : optimizer_->state()) {
    const auto& [param, slice] = updated.at(st.param);
    out.push_back(slice);
    out.back().name = "optim/" + st.name + "/" + param;
    out.back().local = st.tensor;
  }
  out.push_back(counter("optim/step", static_cast<double>(updates_), at::kLong, world_owner));
  if (scaler_) {
    out.push_back(counter("loss_scaler/scale", scaler_->scale(), at::kDouble, world_owner));
    out.push_back(counter("loss_scaler/good_steps", static_cast<double>(scaler_->good_steps()), at::kLong, world_owner));
    out.push_back(counter("loss_scaler/skipped", static_cast<double>(scaler_->skipped()), at::kLong, world_owner));
  }
  return out;
}

void TrainState::load(const std::vector<StateEntry>& saved) {
  const std::vector<StateEntry> live = entries();
  std::map<std::string, const StateEntry*> given;
  for (const auto& e : saved)
    if (!given.emplace(e.name, &e).second) throw Error("train state: entry '" + e.name + "' given twice");
  std::set<std::string> mine;
  for (const auto& e : live) {
    mine.insert(e.name);
    auto it = given.find(e.name);
    if (it == given.end()) throw Error("train state: entry '" + e.name + "' (" + describe(e) + ") is missing");
    if (!same_slice(e, *it->second))
      throw Error("train state: entry '" + e.name + "' is " + describe(*it->second) + ", this rank holds " +
                  describe(e) + " (checkpoints load into any layout: Checkpointer::load)");
  }
  for (const auto& e : saved)
    if (!mine.count(e.name)) throw Error("train state: entry '" + e.name + "' is not part of this rank's state");
  const std::set<std::string> counters(std::begin(kCounters), std::end(kCounters));
  c10::NoGradGuard no_grad;
  for (const auto& e : live)
    if (!counters.count(e.name)) e.local.copy_(given.at(e.name)->local);
  forget_optimizer_state_if_faulted(live);
  take_counters(given);
}

void TrainState::load_with(const std::function<void(const std::vector<StateEntry>&)>& fill) {
  const std::vector<StateEntry> live = entries();
  {
    c10::NoGradGuard no_grad;
    fill(live);
  }
  forget_optimizer_state_if_faulted(live);
  std::map<std::string, const StateEntry*> by_name;
  for (const auto& e : live) by_name.emplace(e.name, &e);
  take_counters(by_name);
}

// SMP_TEST_FAULT=optimizer_state_not_loaded: the moments come back as zeros,
// as if the checkpoint's optimizer state had not been read.
void TrainState::forget_optimizer_state_if_faulted(const std::vector<StateEntry>& live) {
  if (!test_fault(TestFault::OptimizerStateNotLoaded)) return;
  c10::NoGradGuard no_grad;
  for (const auto& e : live)
    if (e.name.rfind("optim/", 0) == 0 && e.name != "optim/step") e.local.zero_();
}

void TrainState::take_counters(const std::map<std::string, const StateEntry*>& by_name) {
  // ZeRO-3: units gathered before the load hold the old values; the next use gathers the loaded shards.
  release_parameters();
  auto value = [&](const char* name) { return by_name.at(name)->local.item<double>(); };
  steps_ = static_cast<int64_t>(value("train/step"));
  updates_ = static_cast<int64_t>(value("optim/step"));
  if (scaler_)
    scaler_->restore(value("loss_scaler/scale"), static_cast<int64_t>(value("loss_scaler/good_steps")),
                     static_cast<int64_t>(value("loss_scaler/skipped")));
}

}  // namespace smp
