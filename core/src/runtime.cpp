#include <smp/runtime.h>

#include <smp/communicator.h>
#include <smp/error.h>
#include <smp/host_api.h>
#include <smp/mesh.h>
#include <smp/plugin_registry.h>
#include <smp/schedule.h>

#include "executor.h"
#include "gradient_sync.h"
#include "graph_builder.h"
#include "module_instance.h"
#include "optimizer.h"
#include "profiler.h"
#include "tensor_parallel_rules.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <set>

namespace smp {

namespace {

uint64_t seed_for(uint64_t seed, const std::string& key) {
  uint64_t h = 1469598103934665603ULL ^ seed;
  for (unsigned char c : key) h = (h ^ c) * 1099511628211ULL;
  return h & 0x7fffffffffffffffULL;
}

struct AdapterHandle {
  const smp_model_adapter* table = nullptr;
  smp_adapter* instance = nullptr;
  std::string plugin;
  ~AdapterHandle() {
    if (instance) table->destroy(instance);
  }
};

}  // namespace

struct Runtime::Impl {
  explicit Impl(Config c) : config(std::move(c)) {}
  Config config;
  ProcessEnv env;
  std::unique_ptr<DeviceMesh> mesh;
  std::shared_ptr<Rendezvous> rendezvous;
  std::map<std::string, std::unique_ptr<Communicator>> comms;  // "pp", "dp", "tp", "mp", "world", "tied.<key>"
  PluginRegistry registry;
  AdapterHandle adapter;
  ModelGraph graph;
  StagePlan plan;
  std::map<std::string, std::shared_ptr<ModuleInstance>> modules;
  std::vector<std::string> module_order;  // creation order
  std::unique_ptr<Executor> executor;
  std::unique_ptr<GradientSync> sync;
  std::unique_ptr<AdamW> optimizer;
  LrSchedule lr;
  Schedule schedule, eval_schedule;
  int microbatches = 1;
  int64_t global_batch = 0;
  int64_t steps = 0;
  int64_t tokens_per_sample = 0;
  std::vector<std::pair<at::Tensor, bool>> norm_params;  // (param, counted on this rank)

  Communicator* comm(const std::string& axis) {
    auto it = comms.find(axis);
    return it == comms.end() ? nullptr : it->second.get();
  }

  std::vector<at::Tensor> batch(smp_split split, int64_t step, int mb, int64_t global, int micro) {
    const int64_t per_dp = global / mesh->dp();
    const int64_t per_mb = per_dp / micro;
    smp_batch_request req{};
    req.struct_size = SMP_STRUCT_SIZE(smp_batch_request, num_samples);
    req.split = split;
    req.step = step;
    req.global_batch = global;
    req.first_sample = mesh->coord(Axis::DP) * per_dp + mb * per_mb;
    req.num_samples = per_mb;
    std::vector<smp_tensor*> out(graph.inputs.size(), nullptr);
    smp_error* err = adapter.table->batch(adapter.instance, &req, out.data(), out.size());
    std::vector<at::Tensor> result;
    for (auto* h : out)
      if (h) {
        result.push_back(tensor_of(h));
        host_api()->tensor_release(h);
      }
    throw_if_error(err, "adapter '" + std::string(adapter.table->name) + "' (plugin '" + adapter.plugin + "') batch");
    if (result.size() != graph.inputs.size())
      throw Error("adapter '" + std::string(adapter.table->name) + "' batch returned " +
                  std::to_string(result.size()) + " tensors for " + std::to_string(graph.inputs.size()) + " inputs");
    return result;
  }

  void make_communicators(const CommOptions& opts) {
    std::string transports;
    for (Axis a : {Axis::PP, Axis::DP, Axis::TP, Axis::MP, Axis::World}) {
      auto& c = comms[axis_name(a)];
      c = rendezvous->new_communicator(axis_name(a), mesh->group_name(a), mesh->group(a), opts);
      if (c->size() > 1 && a != Axis::PP)
        transports += std::string(transports.empty() ? "" : ", ") + axis_name(a) + " " +
                      c->transport("allreduce", at::kCPU);
    }
    // Rank 0's groups; a group spanning hosts uses the backend (the others' are alike on one host).
    if (mesh->rank() == 0 && !transports.empty()) spdlog::info("CPU all-reduce transport: {}", transports);
  }

  void load_plugins(const std::vector<std::string>& plugins) {
    for (const auto& p : plugins) registry.load(p);
    for (const auto& p : config.get_string_array("plugins.paths")) registry.load(p);
    // The standard plugins, unless something already provides their capabilities.
    for (const char* std_plugin : {"smp_nn", "smp_tp", "smp_partition"}) {
      try {
        registry.load(std_plugin);
      } catch (const Error& e) {
        const std::string msg = e.what();
        if (msg.find("already registered") == std::string::npos) throw;
        spdlog::debug("standard plugin {} not loaded: {}", std_plugin, msg);
      }
    }
  }

  void create_adapter() {
    std::string name = config.has("model.adapter") ? config.get_string("model.adapter") : "";
    if (name.empty()) {
      for (const auto& info : registry.plugins())
        if (!info.adapters.empty()) {
          name = info.adapters.front();
          break;
        }
    }
    if (name.empty()) throw Error("no model adapter: pass --plugin <adapter.so> (none of the loaded plugins provides one)");
    adapter.table = registry.adapter(name);
    if (!adapter.table) throw Error("model.adapter: no adapter named '" + name + "' is loaded");
    adapter.plugin = registry.provider(name);
    nlohmann::json model = config.section_json("model");
    model.erase("adapter");
    std::string model_json = model.dump();
    smp_adapter_context ctx{};
    ctx.struct_size = SMP_STRUCT_SIZE(smp_adapter_context, seq_parallel_capable);
    ctx.seed = static_cast<uint64_t>(config.get_int("train.seed"));
    const std::string where = "adapter '" + name + "' (plugin '" + adapter.plugin + "')";
    throw_if_error(adapter.table->create(adapter.table->state, model_json.c_str(), &ctx, &adapter.instance),
                   where + " create from [model] of " + config.origin());
    GraphBuilder builder;
    throw_if_error(adapter.table->describe(adapter.instance, builder.handle()), where + " describe");
    graph = std::move(builder.graph());
    graph.validate(name);
  }

  void materialise_local_modules() {
    const int pp_rank = mesh->coord(Axis::PP);
    Communicator* tp = comm("tp");
    const bool sp = config.get_bool("parallel.sequence_parallel");
    for (int c = 0; c < plan.chunks; ++c) {
      const int stage = c * plan.pp + pp_rank;
      for (int idx : plan.nodes_of_stage[stage]) {
        const GraphNode& node = graph.nodes[idx];
        const std::string& key = node.module_key();
        if (modules.count(key)) continue;
        const smp_module_kind* kind = registry.module_kind(node.kind);
        smp_module_context ctx{};
        ctx.struct_size = SMP_STRUCT_SIZE(smp_module_context, sequence_parallel);
        ctx.node_name = key.c_str();
        ctx.init_seed = seed_for(static_cast<uint64_t>(config.get_int("train.seed")), key);
        ctx.device_type = SMP_DEVICE_CPU;
        ctx.device_index = 0;
        ctx.tp_rank = mesh->coord(Axis::TP);
        ctx.tp_size = mesh->tp();
        ctx.tp_comm = tp->handle();
        ctx.sequence_parallel = sp && mesh->tp() > 1 ? 1 : 0;
        modules[key] = std::make_shared<ModuleInstance>(kind, registry.provider(node.kind), key, node.config_json, ctx);
        module_order.push_back(key);
      }
    }
  }

  // Shared modules whose nodes sit on stages of different pp ranks keep one
  // replica per rank; their gradients are summed over those ranks.
  std::map<std::string, Communicator*> make_tied_groups(const CommOptions& opts) {
    std::map<std::string, std::set<int>> ranks_of_key;
    for (size_t i = 0; i < graph.nodes.size(); ++i)
      if (!graph.nodes[i].shared_key.empty())
        ranks_of_key[graph.nodes[i].shared_key].insert(plan.rank_of(plan.stage_of_node[i]));
    std::map<std::string, Communicator*> tied;
    const int pp_rank = mesh->coord(Axis::PP), dp_i = mesh->coord(Axis::DP), tp_i = mesh->coord(Axis::TP);
    for (const auto& [key, ranks] : ranks_of_key) {
      if (ranks.size() < 2 || !ranks.count(pp_rank)) continue;
      std::vector<int> world_ranks;
      for (int p : ranks) world_ranks.push_back(mesh->rank_of(p, dp_i, tp_i));
      std::string name = "tied." + key + ".dp" + std::to_string(dp_i) + ".tp" + std::to_string(tp_i);
      auto c = rendezvous->new_communicator("tied", name, world_ranks, opts);
      tied[key] = c.get();
      comms["tied." + key] = std::move(c);
    }
    return tied;
  }

  void build_training_state(const std::map<std::string, Communicator*>& tied) {
    const int pp_rank = mesh->coord(Axis::PP);
    std::map<std::string, int> uses;        // stages on this rank using a module key
    std::map<std::string, int> first_rank;  // lowest pp rank holding a key
    for (int c = 0; c < plan.chunks; ++c) {
      std::set<std::string> keys;
      for (int idx : plan.nodes_of_stage[c * plan.pp + pp_rank]) keys.insert(graph.nodes[idx].module_key());
      for (const auto& k : keys) uses[k]++;
    }
    for (size_t i = 0; i < graph.nodes.size(); ++i) {
      int r = plan.rank_of(plan.stage_of_node[i]);
      auto [it, fresh] = first_rank.emplace(graph.nodes[i].module_key(), r);
      if (!fresh) it->second = std::min(it->second, r);
    }
    std::vector<SyncedParameter> synced;
    std::vector<at::Tensor> all;
    const bool tp0 = mesh->coord(Axis::TP) == 0;
    for (const auto& key : module_order) {
      auto tied_it = tied.find(key);
      for (const auto& p : modules[key]->parameters()) {
        if (!p.tensor.requires_grad()) continue;
        SyncedParameter s;
        s.tensor = p.tensor;
        s.expected_grads = microbatches * uses[key];
        s.tp_grad_sum = p.tp_grad_sum;
        s.tied = tied_it == tied.end() ? nullptr : tied_it->second;
        synced.push_back(s);
        all.push_back(p.tensor);
        // Count each distinct value once in the global norm: shards everywhere,
        // tp replicas on tp rank 0, tied replicas on their first pp rank.
        bool counted = (p.shard_dim >= 0 || tp0) && first_rank[key] == pp_rank;
        norm_params.emplace_back(p.tensor, counted);
      }
    }
    const int64_t bucket = static_cast<int64_t>(config.get_double("train.bucket_mb") * 1024 * 1024);
    sync = std::make_unique<GradientSync>(std::move(synced), comm("dp"), comm("tp"), bucket);
    AdamWOptions o;
    o.beta1 = config.get_double("train.beta1");
    o.beta2 = config.get_double("train.beta2");
    o.eps = config.get_double("train.eps");
    o.weight_decay = config.get_double("train.weight_decay");
    optimizer = std::make_unique<AdamW>(all, o);
    lr.lr = config.get_double("train.lr");
    lr.min_lr = config.get_double("train.min_lr");
    lr.warmup = config.get_int("train.warmup_steps");
    lr.total = config.get_int("train.steps");
  }
};

Runtime::Runtime(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
void Runtime::shutdown() {
  if (!impl_ || !impl_->rendezvous) return;
  auto rdv = std::move(impl_->rendezvous);
  rdv->shutdown(std::chrono::milliseconds(static_cast<int64_t>(impl_->config.get_double("run.timeout_s") * 1000)));
}

Runtime::~Runtime() {
  if (!impl_) return;
  if (impl_->rendezvous && !std::uncaught_exceptions()) {
    try {
      shutdown();
    } catch (const std::exception& e) {
      spdlog::warn("shutdown: {}", e.what());
    }
  }
  // Modules before the plugins that made them; communicators last.
  impl_->executor.reset();
  impl_->sync.reset();
  impl_->optimizer.reset();
  impl_->norm_params.clear();
  impl_->modules.clear();
}

std::unique_ptr<Runtime> Runtime::create(Config config, const ProcessEnv& env, const std::vector<std::string>& plugins) {
  config.resolve_layout(env.world_size);
  std::unique_ptr<Runtime> rt(new Runtime(std::make_unique<Impl>(std::move(config))));
  Impl& s = *rt->impl_;
  s.env = env;
  const Config& cfg = s.config;

  if (int threads = static_cast<int>(cfg.get_int("run.threads")); threads > 0) at::set_num_threads(threads);
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(cfg.get_double("run.timeout_s") * 1000));
  s.mesh = std::make_unique<DeviceMesh>(env.world_size, env.rank, static_cast<int>(cfg.get_int("parallel.pp")),
                                        static_cast<int>(cfg.get_int("parallel.dp")),
                                        static_cast<int>(cfg.get_int("parallel.tp")),
                                        cfg.get_string("parallel.placement"));
  s.rendezvous = Rendezvous::connect(env.master_addr, env.master_port, env.rank, env.world_size, timeout);
  CommOptions opts;
  opts.timeout = timeout;
  opts.shm_slot_bytes = static_cast<int64_t>(cfg.get_double("comm.shm_mb") * 1024 * 1024);
  s.make_communicators(opts);

  s.load_plugins(plugins);
  s.create_adapter();

  s.microbatches = static_cast<int>(cfg.get_int("parallel.microbatches"));
  s.global_batch = cfg.get_int("train.batch_size");
  const int chunks = static_cast<int>(cfg.get_int("parallel.virtual_stages"));
  const int pp = s.mesh->pp();

  if (s.mesh->tp() > 1) apply_tensor_parallel_rules(s.graph, s.registry, s.mesh->tp(),
                                                    cfg.get_bool("parallel.tp_replicate_indivisible"));
  for (const auto& n : s.graph.nodes)
    if (!s.registry.module_kind(n.kind)) {
      std::string loaded;
      for (const auto& p : s.registry.plugins()) loaded += (loaded.empty() ? "" : ", ") + p.name;
      throw Error("node '" + n.name + "': no loaded plugin provides module kind '" + n.kind + "' (loaded: " + loaded + ")");
    }

  // Partition: every rank must agree, so costs come from hints or rank 0's profile.
  const int num_stages = pp * chunks;
  std::vector<int> stages(s.graph.nodes.size(), 0);
  const int64_t mb_samples = s.global_batch / (s.mesh->dp() * s.microbatches);
  std::vector<NodeCost> costs;
  if (num_stages > 1) {
    bool hinted = costs_from_hints(s.graph, mb_samples, costs);
    if (!hinted) {
      if (env.rank == 0) {
        costs = profile_costs(s.graph, s.registry, [&](int mb) { return s.batch(SMP_SPLIT_TRAIN, 0, mb, s.global_batch, s.microbatches); },
                              static_cast<uint64_t>(cfg.get_int("train.seed")));
        nlohmann::json j = nlohmann::json::array();
        for (auto& c : costs) j.push_back({c.compute, c.memory});
        s.rendezvous->set("smp/profile", j.dump());
      } else {
        auto j = nlohmann::json::parse(s.rendezvous->get("smp/profile"));
        costs.clear();
        for (auto& c : j) costs.push_back({c[0].get<double>(), c[1].get<double>()});
      }
    }
    stages = run_partitioner(s.registry, cfg.get_string("parallel.partition"), s.graph, costs, num_stages,
                             cfg.section_json("partition"), cfg.get_bool("parallel.tie_across_stages"));
  }
  s.plan = StagePlan::build(s.graph, stages, pp, chunks);
  s.plan.costs = costs;
  if (env.rank == 0)
    for (int st = 0; st < num_stages; ++st)
      spdlog::info("stage {} (rank {}, chunk {}): {} nodes, first '{}', last '{}'", st, s.plan.rank_of(st),
                   s.plan.chunk_of(st), s.plan.nodes_of_stage[st].size(),
                   s.graph.nodes[s.plan.nodes_of_stage[st].front()].name,
                   s.graph.nodes[s.plan.nodes_of_stage[st].back()].name);

  s.materialise_local_modules();
  auto tied = s.make_tied_groups(opts);
  s.schedule = make_schedule(cfg.get_string("parallel.schedule"), pp, s.microbatches, chunks);
  // Evaluation runs forwards only: GPipe's order, or the training order's forwards when chunks > 1.
  s.eval_schedule = chunks > 1 ? s.schedule : make_schedule("gpipe", pp, s.microbatches, 1);
  s.build_training_state(tied);

  ExecutorSetup setup;
  setup.graph = &s.graph;
  setup.plan = &s.plan;
  setup.pp_rank = s.mesh->coord(Axis::PP);
  setup.pp_comm = pp > 1 ? s.comm("pp") : nullptr;
  setup.modules = &s.modules;
  setup.seed = static_cast<uint64_t>(cfg.get_int("train.seed"));
  Impl* impl = &s;
  setup.batch = [impl](int64_t step, int mb, bool training) {
    if (training) return impl->batch(SMP_SPLIT_TRAIN, step, mb, impl->global_batch, impl->microbatches);
    return impl->batch(SMP_SPLIT_VALIDATION, step, mb, impl->global_batch, impl->microbatches);
  };
  s.executor = std::make_unique<Executor>(setup);

  // Items per sample: the first graph input's elements per sample.
  auto probe = s.batch(SMP_SPLIT_TRAIN, 0, 0, s.global_batch, s.microbatches);
  s.tokens_per_sample = probe.empty() || probe[0].dim() == 0 ? 1 : probe[0].numel() / std::max<int64_t>(1, probe[0].size(0));
  for (auto& [name, c] : s.comms) c->reset_stats();
  return rt;
}

StepResult Runtime::train_step() {
  Impl& s = *impl_;
  using clock = std::chrono::steady_clock;
  auto since = [](clock::time_point t) { return std::chrono::duration<double>(clock::now() - t).count(); };
  const auto t0 = clock::now();
  // Zeroing in place keeps .grad the same tensor (dp buckets may alias it).
  for (auto& [key, m] : s.modules)
    for (const auto& p : m->parameters())
      if (p.tensor.grad().defined()) p.tensor.mutable_grad().zero_();
  StepResult out;
  s.sync->begin_step();
  ExecutorResult r = s.executor->run(s.schedule, s.steps, true);
  out.phases.compute = since(t0);
  auto t1 = clock::now();
  s.sync->finish_step();
  out.phases.grad_sync = since(t1);
  t1 = clock::now();

  // Global gradient norm over distinct values, then clipping.
  at::Tensor sq = at::zeros({2}, at::kDouble);
  {
    c10::NoGradGuard ng;
    // One norm kernel per parameter (no copies), summed in double.
    std::vector<at::Tensor> norms;
    for (auto& [t, counted] : s.norm_params)
      if (counted && t.grad().defined()) norms.push_back(t.grad().norm().to(at::kDouble));
    sq[0] = norms.empty() ? 0.0 : at::stack(norms).pow(2).sum().item<double>();
    sq[1] = r.loss_sum;
  }
  s.comm("mp")->allreduce(sq)->wait();
  // .grad holds dp sums: the gradient is grad_scale() times that. Clipping
  // joins the same factor, which the optimizer applies as it reads .grad.
  double grad_scale = s.sync->grad_scale();
  const double norm = std::sqrt(sq[0].item<double>()) * grad_scale;
  const double clip = s.config.get_double("train.grad_clip");
  if (clip > 0 && norm > clip) grad_scale *= clip / (norm + 1e-6);
  // Loss: summed over the pp stages above (only the last one has it), averaged over dp.
  at::Tensor loss = at::full({1}, sq[1].item<double>() / s.mesh->tp(), at::kDouble);
  s.comm("dp")->allreduce(loss)->wait();
  const double lr = s.lr.at(s.steps);
  out.phases.clip = since(t1);
  t1 = clock::now();
  s.optimizer->step(lr, grad_scale);
  out.phases.optimizer = since(t1);

  out.step = s.steps++;
  out.loss = loss.item<double>() / (s.mesh->dp() * s.microbatches);
  out.grad_norm = norm;
  out.grad_scale = grad_scale;
  out.lr = lr;
  out.peak_activation_bytes = r.peak_bytes;
  out.seconds = since(t0);
  return out;
}

double Runtime::evaluate(int batches) {
  Impl& s = *impl_;
  c10::NoGradGuard ng;
  double total = 0;
  for (int b = 0; b < batches; ++b) {
    ExecutorResult r = s.executor->run(s.eval_schedule, b, false);
    total += r.loss_sum;
  }
  at::Tensor t = at::full({1}, total / s.mesh->tp(), at::kDouble);
  s.comm("mp")->allreduce(t)->wait();
  s.comm("dp")->allreduce(t)->wait();
  return t.item<double>() / (static_cast<double>(batches) * s.mesh->dp() * s.microbatches);
}

int64_t Runtime::steps_done() const { return impl_->steps; }
const Config& Runtime::config() const { return impl_->config; }
const DeviceMesh& Runtime::mesh() const { return *impl_->mesh; }
const ModelGraph& Runtime::graph() const { return impl_->graph; }
const StagePlan& Runtime::plan() const { return impl_->plan; }
const PluginRegistry& Runtime::plugins() const { return impl_->registry; }
double Runtime::flops_per_step() const { return impl_->graph.flops_per_sample * impl_->global_batch; }
int64_t Runtime::tokens_per_step() const { return impl_->tokens_per_sample * impl_->global_batch; }

nlohmann::json Runtime::comm_bytes() const {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [name, c] : impl_->comms) {
    nlohmann::json ops = nlohmann::json::object();
    for (const auto& [op, bytes] : c->stats().bytes) ops[op] = bytes;
    j[name] = ops;
  }
  return j;
}

void Runtime::reset_comm_stats() {
  for (auto& [name, c] : impl_->comms) c->reset_stats();
}

std::vector<ParameterView> Runtime::parameters() const {
  std::vector<ParameterView> out;
  for (const auto& key : impl_->module_order)
    for (const auto& p : impl_->modules.at(key)->parameters()) out.push_back({p.name, p.tensor, p.shard_dim});
  return out;
}

std::vector<double> Runtime::gather_world(double value) {
  const int world = impl_->mesh->world_size();
  at::Tensor in = at::full({1}, value, at::kDouble);
  at::Tensor out = at::empty({world}, at::kDouble);
  impl_->comm("world")->allgather(in, out)->wait();
  std::vector<double> v(world);
  for (int i = 0; i < world; ++i) v[i] = out[i].item<double>();
  return v;
}

}  // namespace smp
