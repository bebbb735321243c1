#include <smp/runtime.h>

#include <smp/error.h>
#include <smp/job_config.h>
#include <smp/mesh.h>
#include <smp/plugin_registry.h>

#include "comm/communicator.h"
#include "comm/process_groups.h"
#include "graph/graph_builder.h"
#include "graph/parallel_rules.h"
#include "graph/profiler.h"
#include "memory/activation_checkpoint.h"
#include "memory/activation_offload.h"
#include "memory/memory_model.h"
#include "memory/memory_tracker.h"
#include "memory/sharded_parameters.h"
#include "pipeline/executor.h"
#include "pipeline/schedule.h"
#include "plugin/host_api.h"
#include "runtime/op_profile.h"
#include "runtime/trace.h"
#include "plugin/module_instance.h"
#include "runtime/device.h"
#include "runtime/seeds.h"
#include "train/gradient_sync.h"
#include "train/loss_normalizer.h"
#include "train/mixed_precision.h"
#include "train/optimizer.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <cmath>
#include <set>

namespace smp {

namespace {

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
  explicit Impl(Config c) : config(std::move(c)), job(JobConfig::from(config)) {}
  Config config;  // as loaded, for Runtime::config() and the summary
  JobConfig job;  // the same, typed: what every phase reads
  ProcessEnv env;
  std::unique_ptr<DeviceMesh> mesh;
  std::shared_ptr<Rendezvous> rendezvous;
  std::unique_ptr<ProcessGroups> groups;  // every axis' and derived group's communicator
  PluginRegistry registry;
  AdapterHandle adapter;
  ModelGraph graph;
  StagePlan plan;
  std::map<std::string, std::shared_ptr<ModuleInstance>> modules;
  std::vector<std::string> module_order;  // creation order
  std::unique_ptr<LossNormalizer> loss;
  std::unique_ptr<Executor> executor;
  std::unique_ptr<GradientSync> sync;
  std::unique_ptr<AdamW> optimizer;
  std::unique_ptr<MasterWeights> masters;     // 16-bit precision: the fp32 copies the optimizer updates
  std::unique_ptr<DynamicLossScaler> scaler;  // fp16 only
  std::unique_ptr<ShardedParameters> sharded;  // ZeRO >= 1: the parameter side of sharded data parallelism
  std::unique_ptr<ActivationOffload> offload;  // memory.offload: checkpointed inputs in host memory
  std::vector<std::pair<std::string, double>> last_metrics;  // of the last evaluate()
  int64_t created_bytes = 0;        // held by this rank's parameters as created (and cast)
  int64_t parameter_init_peak = 0;  // see Runtime::parameter_init_peak
  std::vector<bool> checkpoint;                // per graph node: activations recomputed in backward
  std::vector<bool> recompute_core;            // per graph node: only its attention core recomputed
  c10::Device device = c10::Device(c10::kCPU);  // this rank's (run.device)
  LrSchedule lr;
  Schedule schedule, eval_schedule;
  int microbatches = 1;
  int64_t global_batch = 0;
  int64_t steps = 0;
  uint64_t seed = 0;
  std::vector<bool> norm_counted;  // per GradientSync parameter: counted in the global norm on this rank
  std::vector<bool> segment_counted;  // ZeRO: the same per shard segment

  Communicator& comm(Axis axis) { return groups->get(axis); }

  std::vector<at::Tensor> batch(smp_split split, int64_t step, int mb) {
    const int64_t per_dp = global_batch / mesh->dp();
    const int64_t per_mb = per_dp / microbatches;
    smp_batch_request req{};
    req.struct_size = SMP_BATCH_REQUEST_STRUCT_SIZE;
    req.split = split;
    req.step = step;
    req.global_batch = global_batch;
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

  // ---- phase 1: layout — the mesh and its communicators ----
  void layout() {
    const ParallelConfig& par = job.parallel;
    // run.threads, else OMP_NUM_THREADS (smp-launch sets 1 when ranks share the cores).
    if (int threads = threads_per_rank(job.run.threads); threads > 0) at::set_num_threads(threads);
    seed = job.train.seed;
    device = rank_device(job.run, env, job.origin);
    const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(job.run.timeout_s * 1000));
    mesh = std::make_unique<DeviceMesh>(env.world_size, env.rank, par.pp, par.dp, par.tp, par.placement, par.ep);
    rendezvous = Rendezvous::connect(env.master_addr, env.master_port, env.rank, env.world_size, timeout);
    CommOptions opts;
    opts.timeout = timeout;
    opts.shm_slot_bytes = job.shm_slot_bytes;
    opts.cuda = device.is_cuda();
    opts.cuda_backend = job.cuda_backend;
    opts.device_key = device_key(device);
    groups = std::make_unique<ProcessGroups>(*mesh, rendezvous, opts);
    // The axes every job uses are made up front, in one order on every rank;
    // others (ep, edp, tied groups) when first asked for.
    std::string transports;
    for (Axis a : {Axis::PP, Axis::DP, Axis::TP, Axis::World}) {
      Communicator& c = comm(a);
      if (c.size() > 1 && a != Axis::PP)
        transports += std::string(transports.empty() ? "" : ", ") + axis_name(a) + " " +
                      c.transport("allreduce", at::kCPU);
    }
    // Rank 0's groups; a group spanning hosts uses the backend (the others' are alike on one host).
    if (mesh->rank() == 0 && !transports.empty()) spdlog::info("CPU all-reduce transport: {}", transports);
    if (device.is_cuda()) {
      std::string cuda;
      for (Axis a : {Axis::PP, Axis::DP, Axis::TP})
        if (comm(a).size() > 1)
          cuda += std::string(cuda.empty() ? "" : ", ") + axis_name(a) + " " + comm(a).transport("allreduce", device);
      spdlog::info("rank {} on {}{}{}", env.rank, device.str(), cuda.empty() ? "" : "; CUDA tensors: ", cuda);
    }
  }

  // ---- phase 2: model — plugins, the adapter's graph, rules per axis ----
  void model(const std::vector<std::string>& plugins) {
    for (const auto& p : plugins) registry.load(p);
    for (const auto& p : job.plugin_paths) registry.load(p);
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
    create_adapter();
    // Chosen on the adapter's own kinds and names, before tp rules rewrite kinds.
    checkpoint = select_checkpointed(graph, job.memory.checkpoint, job.memory.checkpoint_every, job.origin);
    recompute_core = select_checkpointed(graph, job.memory.checkpoint_attention_core, 1, job.origin,
                                         "memory.checkpoint_attention_core");
    const bool replicate = job.parallel.tp_replicate_indivisible;
    for (Axis a : {Axis::TP, Axis::EP})
      if (mesh->size(a) > 1) apply_parallel_rules(graph, registry, axis_name(a), mesh->size(a), replicate);
    for (size_t i = 0; i < graph.nodes.size(); ++i) {
      const GraphNode& n = graph.nodes[i];
      const smp_module_kind* k = registry.module_kind(n.kind);
      if (k && recompute_core[i] &&
          (k->struct_size < SMP_MODULE_KIND_STRUCT_SIZE ||
           !(k->memory_features & SMP_MEMORY_FEATURE_RECOMPUTE_ATTENTION_CORE)))
        throw Error(job.origin + ": memory.checkpoint_attention_core: node '" + n.name + "' is of kind '" + n.kind +
                    "' (plugin '" + registry.provider(n.kind) + "'), which cannot recompute an attention core");
    }
    for (const auto& n : graph.nodes)
      if (!registry.module_kind(n.kind)) {
        std::string loaded;
        for (const auto& p : registry.plugins()) loaded += (loaded.empty() ? "" : ", ") + p.name;
        throw Error("node '" + n.name + "': no loaded plugin provides module kind '" + n.kind + "' (loaded: " + loaded + ")");
      }
  }

  void create_adapter() {
    std::string name = job.adapter;
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
    const std::string model_json = job.model.dump(), parallel_json = job.parallel_json.dump();
    smp_adapter_context ctx{};
    ctx.struct_size = SMP_ADAPTER_CONTEXT_STRUCT_SIZE;
    ctx.seed = seed;
    ctx.parallel_json = parallel_json.c_str();
    const std::string where = "adapter '" + name + "' (plugin '" + adapter.plugin + "')";
    throw_if_error(adapter.table->create(adapter.table->state, model_json.c_str(), &ctx, &adapter.instance),
                   where + " create from [model] of " + job.origin);
    GraphBuilder builder;
    throw_if_error(adapter.table->describe(adapter.instance, builder.handle()), where + " describe");
    graph = std::move(builder.graph());
    graph.validate(name);
  }

  // ---- phase 3: plan — partition into stages, the schedules ----
  void make_plan() {
    const ParallelConfig& par = job.parallel;
    microbatches = par.microbatches;
    global_batch = job.train.batch_size;
    const int chunks = par.virtual_stages;
    const int pp = mesh->pp();
    // Partition: every rank must agree, so costs come from hints or rank 0's profile.
    const int num_stages = pp * chunks;
    std::vector<int> stages(graph.nodes.size(), 0);
    const int64_t mb_samples = global_batch / (mesh->dp() * microbatches);
    std::vector<NodeCost> costs;
    if (num_stages > 1) {
      bool hinted = costs_from_hints(graph, mb_samples, costs);
      if (hinted) costs = memory_costs(graph, memory_options(), costs);  // the memory manager's model
      if (!hinted && !rendezvous)
        throw Error("--estimate-memory: the adapter gives no cost hints for every node, and without them the "
                    "partition needs a profile of the model, which the estimate does not run");
      if (!hinted) {
        if (env.rank == 0) {
          costs = profile_costs(graph, registry, [&](int mb) { return batch(SMP_SPLIT_TRAIN, 0, mb); }, seed);
          nlohmann::json j = nlohmann::json::array();
          for (auto& c : costs) j.push_back({c.compute, c.memory});
          rendezvous->set("smp/profile", j.dump());
        } else {
          auto j = nlohmann::json::parse(rendezvous->get("smp/profile"));
          costs.clear();
          for (auto& c : j) costs.push_back({c[0].get<double>(), c[1].get<double>()});
        }
      }
      stages = run_partitioner(registry, par.partition, graph, costs, num_stages, job.partition,
                               par.tie_across_stages);
    } else if (!job.partition.empty()) {
      // One stage: nothing to split, but the strategy still vets its options
      // (no [partition] key is accepted and then ignored). Costs do not matter.
      run_partitioner(registry, par.partition, graph, std::vector<NodeCost>(graph.nodes.size(), NodeCost{1.0, 1.0}),
                      1, job.partition, par.tie_across_stages);
    }
    plan = StagePlan::build(graph, stages, pp, chunks);
    plan.costs = costs;
    if (env.rank == 0)
      for (int st = 0; st < num_stages; ++st)
        spdlog::info("stage {} (rank {}, chunk {}): {} nodes, first '{}', last '{}'", st, plan.rank_of(st),
                     plan.chunk_of(st), plan.nodes_of_stage[st].size(),
                     graph.nodes[plan.nodes_of_stage[st].front()].name,
                     graph.nodes[plan.nodes_of_stage[st].back()].name);
    schedule = make_schedule(par.schedule, pp, microbatches, chunks);
    // Evaluation runs forwards only: GPipe's order, or the training order's forwards when chunks > 1.
    eval_schedule = chunks > 1 ? schedule : make_schedule("gpipe", pp, microbatches, 1);
    loss = std::make_unique<LossNormalizer>(graph.loss_reduction, mb_samples);
  }

  // ---- phase 4: state — this rank's modules, gradient groups, optimizer ----
  void state() {
    {
      MemoryTracker created;
      materialise_local_modules();
      created_bytes = created.current();
      parameter_init_peak = created.peak();
    }
    build_training_state(make_tied_groups());
  }

  void materialise_local_modules() {
    const int pp_rank = mesh->coord(Axis::PP);
    const std::string parallel_json = job.parallel_json.dump();
    std::set<std::string> recompute_core_keys;  // modules some node of which asks for attention-core recompute
    for (size_t i = 0; i < graph.nodes.size(); ++i)
      if (recompute_core[i]) recompute_core_keys.insert(graph.nodes[i].module_key());
    for (int c = 0; c < plan.chunks; ++c) {
      const int stage = c * plan.pp + pp_rank;
      for (int idx : plan.nodes_of_stage[stage]) {
        const GraphNode& node = graph.nodes[idx];
        const std::string& key = node.module_key();
        if (modules.count(key)) continue;
        // ZeRO-3 asks every kind that can for deferred init: parameters come
        // without storage and only this rank's dp shard is ever generated.
        const smp_module_kind* kind = registry.module_kind(node.kind);
        const bool deferred = job.memory.zero == 3 && kind->struct_size >= SMP_MODULE_KIND_STRUCT_SIZE &&
                              (kind->memory_features & SMP_MEMORY_FEATURE_DEFERRED_INIT);
        nlohmann::json memory = nlohmann::json::object();
        if (recompute_core_keys.count(key)) memory["recompute_attention_core"] = true;
        if (deferred) memory["deferred_init"] = true;
        const std::string memory_json = memory.dump();
        modules[key] = std::make_shared<ModuleInstance>(
            kind, registry.provider(node.kind), key, node.config_json,
            module_context(key, derive_seed(seed, key), groups->handle(), parallel_json, device, memory_json.c_str()));
        module_order.push_back(key);
      }
    }
  }

  // Shared modules whose nodes sit on stages of different pp ranks keep one
  // replica per rank; their gradients are summed over those ranks.
  std::map<std::string, Communicator*> make_tied_groups() {
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
      tied[key] = &groups->derived("tied." + key, "tied", name, world_ranks);
    }
    return tied;
  }

  // Every reduction group of a parameter comes from its placements: its
  // data-parallel group (dp, or edp when sharded over ep), the axes where its
  // gradient is partial, and the tied-weight group of its module.
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
    const TrainConfig& t = job.train;
    const int zero = job.memory.zero;
    std::vector<at::Tensor> all;
    std::vector<std::shared_ptr<const sdk::InitSpec>> inits;  // deferred init: how to fill each (or null)
    std::vector<SyncedParameter> synced;
    std::map<int, std::vector<int64_t>> norm_load;  // per data axis: elements counted on each of its ranks
    for (size_t unit = 0; unit < module_order.size(); ++unit) {
      const std::string& key = module_order[unit];
      auto tied_it = tied.find(key);
      for (const auto& p : modules[key]->parameters()) {
        if (!p.tensor.requires_grad()) continue;
        all.push_back(p.tensor);
        inits.push_back(p.init);
        SyncedParameter s = synced_parameter(p.tensor, p.placements, *groups);
        s.expected_grads = microbatches * uses[key];
        s.tied = tied_it == tied.end() ? nullptr : tied_it->second;
        s.grad_dtype = compute_dtype(t.grad_reduce);
        s.unit = zero == 3 ? static_cast<int>(unit) : -1;
        synced.push_back(s);
        // Count each distinct value once in the global norm: shards everywhere
        // (ZeRO's dp shards too), replicas at coordinate 0 of their axes but
        // the data axis, tied replicas on their first pp rank. A parameter
        // replicated over data parallelism is counted on the data rank with
        // the fewest elements so far: every data rank computes its share of
        // the norm at the same time, instead of the others waiting on rank 0.
        const Placements placed = zero > 0 ? p.placements.sharded_over_data() : p.placements;
        const Axis data = placed.data_parallel_axis();
        std::vector<int64_t>& load = norm_load[static_cast<int>(data)];
        load.resize(static_cast<size_t>(mesh->size(data)), 0);
        const int owner = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
        if (!placed.sharded(data)) load[static_cast<size_t>(owner)] += p.tensor.numel();
        norm_counted.push_back(placed.counted_on(*mesh, owner) && first_rank[key] == pp_rank);
      }
    }
    // Mixed precision: the parameters become 16-bit in place (their fp32 masters
    // kept first) before GradientSync lays out the gradient buckets for them.
    // Under ZeRO the fp32 values are kept only until the shards' masters are cut.
    std::vector<at::Tensor> fp32_values;
    auto laying_out = std::make_unique<MemoryTracker>();  // the parameters' casts and shards, for parameter_init_peak
    if (t.precision != Precision::Fp32) {
      if (zero == 0)
        masters = std::make_unique<MasterWeights>(all, compute_dtype(t.precision));
      else
        fp32_values = cast_keeping_fp32(all, compute_dtype(t.precision));
    }
    if (t.precision == Precision::Fp16) {
      LossScaleOptions ls;
      ls.initial = t.initial_loss_scale;
      ls.window = t.loss_scale_window;
      ls.min = t.min_loss_scale;
      scaler = std::make_unique<DynamicLossScaler>(ls);
    }
    const int64_t cast_peak = laying_out->peak(), cast_current = laying_out->current();
    laying_out.reset();  // GradientSync's gradient buffers are not the parameters'
    sync = std::make_unique<GradientSync>(std::move(synced), GradientSyncOptions{t.bucket_bytes, zero});
    parameter_init_peak = std::max(parameter_init_peak, created_bytes + cast_peak);
    created_bytes += cast_current;
    AdamWOptions o;
    o.beta1 = t.beta1;
    o.beta2 = t.beta2;
    o.eps = t.eps;
    o.weight_decay = t.weight_decay;
    if (zero == 0) {
      optimizer = std::make_unique<AdamW>(masters ? masters->masters() : all, o);
    } else {
      // ZeRO: the optimizer sees this rank's shard segments only; whole fp32
      // masters exist just long enough to cut the shards' masters from them.
      bool any_deferred = false;
      for (const auto& i : inits) any_deferred = any_deferred || i;
      {
        MemoryTracker sharding;
        sharded = std::make_unique<ShardedParameters>(all, fp32_values, sync->layout(), zero, module_order,
                                                      any_deferred ? inits : decltype(inits){});
        fp32_values.clear();
        parameter_init_peak = std::max(parameter_init_peak, created_bytes + sharding.peak());
      }
      std::vector<bool> decay;
      for (const ShardSegment& seg : shard_segments(sync->layout())) {
        decay.push_back(all[seg.param].dim() >= 2);
        segment_counted.push_back(norm_counted[seg.param]);
      }
      optimizer = std::make_unique<AdamW>(sharded->optimizer_params(), o, decay);
      if (zero == 3) sync->on_unit_done([this](int unit) { sharded->release(unit); });
    }
    lr.lr = t.lr;
    lr.min_lr = t.min_lr;
    lr.warmup = t.warmup_steps;
    lr.total = t.steps;
  }

  // ---- phase 5: step — the executor over this rank's stages ----
  void step_machinery() {
    ExecutorSetup setup;
    setup.graph = &graph;
    setup.plan = &plan;
    setup.pp_rank = mesh->coord(Axis::PP);
    setup.pp_comm = mesh->pp() > 1 ? &comm(Axis::PP) : nullptr;
    setup.modules = &modules;
    setup.seed = seed;
    setup.loss = loss.get();
    setup.device = device;
    setup.compute_dtype = compute_dtype(job.train.precision);
    setup.gather = job.memory.zero == 3 ? sharded.get() : nullptr;
    setup.checkpoint = checkpoint;
    if (job.memory.offload) {
      offload = std::make_unique<ActivationOffload>(device, job.memory.offload_horizon);
      setup.offload = offload.get();
    }
    setup.batch = [this](int64_t step, int mb, bool training) {
      return batch(training ? SMP_SPLIT_TRAIN : SMP_SPLIT_VALIDATION, step, mb);
    };
    executor = std::make_unique<Executor>(setup);
    groups->reset_stats();
  }

  // The job as the memory model sees it (after model(): the hints are this rank's share).
  MemoryModelOptions memory_options() const {
    MemoryModelOptions o;
    o.pp = mesh->pp();
    o.tp = mesh->tp();
    o.dp = mesh->dp();
    o.zero = job.memory.zero;
    o.compute_bytes = static_cast<int>(c10::elementSize(compute_dtype(job.train.precision)));
    o.grad_bytes = static_cast<int>(c10::elementSize(compute_dtype(job.train.grad_reduce)));
    o.masters = job.train.precision != Precision::Fp32;
    o.microbatch_samples = global_batch / (mesh->dp() * microbatches);
    o.checkpoint = checkpoint;
    o.recompute_core = recompute_core;
    o.offload = job.memory.offload;
    o.offload_horizon = job.memory.offload_horizon;
    return o;
  }

  MemoryAccount memory_account(int64_t step_peak) const {
    MemoryAccount m;
    if (sharded) {
      m.parameters = sharded->parameter_bytes();
      m.optimizer_state = sharded->master_bytes();
    } else {
      for (const auto& [key, module] : modules)
        for (const auto& p : module->parameters())
          m.parameters += p.tensor.numel() * static_cast<int64_t>(p.tensor.element_size());
      if (masters) m.optimizer_state = masters->bytes();
    }
    m.gradients = sync->bytes();
    m.optimizer_state += optimizer->state_bytes();
    m.step_peak = step_peak;
    return m;
  }

  // The step's loss sums over the job: the last stage's, counted once per tp
  // group (every tp rank has the same loss), summed over every rank with
  // `extra` values in the same all-reduce.
  LossSums global_loss(const LossSums& local, std::vector<double>& extra) {
    const bool counted = mesh->coord(Axis::TP) == 0;
    std::vector<double> v = {counted ? local.loss : 0.0, counted ? local.items : 0.0};
    v.insert(v.end(), extra.begin(), extra.end());
    at::Tensor t = at::tensor(v, at::kDouble);
    comm(Axis::World).allreduce(t)->wait();
    for (size_t i = 0; i < extra.size(); ++i) extra[i] = t[2 + i].item<double>();
    return {t[0].item<double>(), t[1].item<double>()};
  }
};

Runtime::Runtime(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
void Runtime::shutdown() {
  if (!impl_ || !impl_->rendezvous) return;
  auto rdv = std::move(impl_->rendezvous);
  rdv->shutdown(std::chrono::milliseconds(static_cast<int64_t>(impl_->job.run.timeout_s * 1000)));
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
  impl_->norm_counted.clear();
  impl_->masters.reset();
  impl_->sharded.reset();
  impl_->modules.clear();
}

// The phases, top to bottom: layout -> model -> plan -> state -> step.
std::unique_ptr<Runtime> Runtime::create(Config config, const ProcessEnv& env, const std::vector<std::string>& plugins) {
  config.resolve_layout(env.world_size);
  std::unique_ptr<Runtime> rt(new Runtime(std::make_unique<Impl>(std::move(config))));
  Impl& s = *rt->impl_;
  s.env = env;
  s.layout();
  s.model(plugins);
  s.make_plan();
  s.state();
  s.step_machinery();
  return rt;
}

nlohmann::json Runtime::estimate_memory(Config config, int world_size, const std::vector<std::string>& plugins) {
  config.resolve_layout(world_size);
  auto impl = std::make_unique<Impl>(std::move(config));
  Impl& s = *impl;
  const ParallelConfig& par = s.job.parallel;
  s.env.world_size = world_size;
  s.env.rank = 0;
  s.seed = s.job.train.seed;
  s.mesh = std::make_unique<DeviceMesh>(world_size, 0, par.pp, par.dp, par.tp, par.placement, par.ep);
  s.model(plugins);
  s.make_plan();
  const MemoryModelOptions o = s.memory_options();
  nlohmann::json ranks = nlohmann::json::array();
  double worst = 0;
  for (const RankMemory& m : smp::estimate_memory(s.graph, s.plan, s.schedule, o)) {
    ranks.push_back(to_json(m));
    worst = std::max(worst, m.total());
  }
  nlohmann::json out;
  out["layout"] = {{"pp", par.pp}, {"tp", par.tp}, {"dp", par.dp}, {"world", world_size},
                   {"microbatches", par.microbatches}, {"schedule", par.schedule}};
  out["memory"] = {{"zero", s.job.memory.zero}, {"checkpointed_nodes", std::count(o.checkpoint.begin(), o.checkpoint.end(), true)},
                   {"precision", to_string(s.job.train.precision)}};
  out["per_pp_rank"] = ranks;
  out["max_total_bytes"] = worst;
  return out;
}

StepResult Runtime::train_step() {
  Impl& s = *impl_;
  using clock = std::chrono::steady_clock;
  auto since = [](clock::time_point t) { return std::chrono::duration<double>(clock::now() - t).count(); };
  const auto t0 = clock::now();
  StepResult out;
  out.loss_scale = s.scaler ? s.scaler->scale() : 1.0;
  s.loss->set_loss_scale(out.loss_scale);
  const int64_t held_before = reset_device_peak(s.device);  // CUDA: the step's peak is counted above it
  trace::set_step(s.steps);
  trace::Scope step_scope("step", "step " + std::to_string(s.steps + 1));
  op_profile::StepScope ops(s.steps);
  s.sync->begin_step();
  ExecutorResult r = [&] {
    trace::Scope phase("phase", "pipeline");
    return s.executor->run(s.schedule, s.steps, true);
  }();
  out.phases.compute = since(t0);
  auto t1 = clock::now();
  {
    trace::Scope phase("phase", "grad_sync");
    s.sync->finish_step();
  }
  out.phases.grad_sync = since(t1);
  t1 = clock::now();
  const int64_t clip_start = trace::now_us();

  // Global gradient norm over distinct values, then clipping.
  // Under ZeRO the gradients are this rank's shard segments, which the optimizer's parameters match.
  std::vector<double> norm_sq{0.0};
  const bool sharded = s.sharded != nullptr;
  std::vector<at::Tensor> grads = sharded ? s.sync->segment_gradients() : std::vector<at::Tensor>(s.sync->size());
  const std::vector<bool>& counted = sharded ? s.segment_counted : s.norm_counted;
  {
    c10::NoGradGuard ng;
    // One norm kernel per parameter (no copies), summed in double.
    std::vector<at::Tensor> norms;
    for (size_t k = 0; k < grads.size(); ++k) {
      if (!sharded) grads[k] = s.sync->gradient(k);
      // Accumulated in fp32 whatever the gradient's dtype, without a copy: a
      // 16-bit norm of a loss-scaled fp16 gradient overflows (65504) long before
      // any element does.
      if (counted[k] && grads[k].defined()) norms.push_back(grads[k].norm(2, at::kFloat).to(at::kDouble));
    }
    norm_sq[0] = norms.empty() ? 0.0 : at::stack(norms).pow(2).sum().item<double>();
  }
  // One all-reduce over the world: the squared norm and the loss sums.
  const LossSums global = s.global_loss(r.loss, norm_sq);
  // .grad holds the gradient of the summed loss: the mean's gradient is
  // grad_scale times that. Clipping joins the same factor, which the optimizer
  // applies as it reads .grad.
  // Under fp16 the loss scale joins it too; the norm² is the same on every
  // rank, so an overflow (inf / nan) skips the step everywhere alike.
  double grad_scale = LossNormalizer::grad_scale(global) / out.loss_scale;
  const double norm = std::sqrt(norm_sq[0]) * grad_scale;
  const double clip = s.job.train.grad_clip;
  if (clip > 0 && norm > clip) grad_scale *= clip / (norm + 1e-6);
  const double lr = s.lr.at(s.steps);
  out.phases.clip = since(t1);
  trace::complete("phase", "clip", clip_start, trace::now_us());
  t1 = clock::now();
  {
    trace::Scope phase("phase", "optimizer");
    out.skipped = s.scaler && !s.scaler->update(std::isfinite(norm_sq[0]));
    if (!out.skipped) {
      s.optimizer->step(lr, grad_scale, grads);
      if (s.masters) s.masters->copy_to_params();
    }
    if (s.sharded) s.sharded->after_step();
    synchronize(s.device);
  }
  out.phases.optimizer = since(t1);

  out.step = s.steps++;
  out.loss = LossNormalizer::mean(global);
  out.grad_norm = norm;
  out.grad_scale = grad_scale;
  out.lr = lr;
  out.peak_activation_bytes = s.device.is_cuda() ? device_peak_bytes(s.device) - held_before : r.peak_bytes;
  out.memory = s.memory_account(out.peak_activation_bytes);
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
  const auto& metrics = s.graph.metrics;
  std::vector<double> sums(2 * metrics.size(), 0.0);  // sum, count per metric; in the loss's all-reduce
  for (int b = 0; b < batches; ++b) {
    ExecutorResult r = s.executor->run(s.eval_schedule, b, false);
    local += r.loss;
    for (size_t k = 0; k < metrics.size(); ++k) {
      sums[2 * k] += r.metrics[k].first;
      sums[2 * k + 1] += r.metrics[k].second;
    }
  }
  if (s.mesh->coord(Axis::TP) != 0) std::fill(sums.begin(), sums.end(), 0.0);  // once per tp group
  const double mean = LossNormalizer::mean(s.global_loss(local, sums));
  s.last_metrics.clear();
  for (size_t k = 0; k < metrics.size(); ++k)
    s.last_metrics.emplace_back(metrics[k].name, sums[2 * k + 1] > 0 ? sums[2 * k] / sums[2 * k + 1] : 0.0);
  return mean;
}

std::vector<std::pair<std::string, double>> Runtime::validation_metrics() const { return impl_->last_metrics; }

int64_t Runtime::steps_done() const { return impl_->steps; }
int64_t Runtime::parameter_init_peak() const { return impl_->parameter_init_peak; }
std::string Runtime::device() const { return impl_->device.str(); }
std::string Runtime::precision() const { return to_string(impl_->job.train.precision); }
double Runtime::measure_peak_flops() const {
  return gemm_peak_flops(impl_->device, compute_dtype(impl_->job.train.precision));
}
const Config& Runtime::config() const { return impl_->config; }
const JobConfig& Runtime::job() const { return impl_->job; }
const DeviceMesh& Runtime::mesh() const { return *impl_->mesh; }
const ModelGraph& Runtime::graph() const { return impl_->graph; }
const StagePlan& Runtime::plan() const { return impl_->plan; }
const PluginRegistry& Runtime::plugins() const { return impl_->registry; }
double Runtime::flops_per_step() const { return impl_->graph.flops_per_sample * impl_->global_batch; }
double Runtime::items_per_step() const {
  return impl_->graph.throughput_per_sample * static_cast<double>(impl_->global_batch);
}
const std::string& Runtime::throughput_unit() const { return impl_->graph.throughput_unit; }

nlohmann::json Runtime::comm_bytes() const {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [name, c] : impl_->groups->all()) {
    nlohmann::json ops = nlohmann::json::object();
    for (const auto& [op, bytes] : c->stats().bytes) ops[op] = bytes;
    j[name] = ops;
  }
  return j;
}

void Runtime::reset_comm_stats() { impl_->groups->reset_stats(); }

std::vector<ParameterView> Runtime::parameters() const {
  if (impl_->sharded) impl_->sharded->acquire_all();
  std::vector<ParameterView> out;
  for (const auto& key : impl_->module_order)
    for (const auto& p : impl_->modules.at(key)->parameters())
      out.push_back({p.name, p.tensor, p.placements.shard_dim(Axis::TP), p.placements.shard_dim(Axis::EP)});
  return out;
}

std::vector<double> Runtime::gather_world(double value) {
  const int world = impl_->mesh->world_size();
  at::Tensor in = at::full({1}, value, at::kDouble);
  at::Tensor out = at::empty({world}, at::kDouble);
  impl_->comm(Axis::World).allgather(in, out)->wait();
  std::vector<double> v(world);
  for (int i = 0; i < world; ++i) v[i] = out[i].item<double>();
  return v;
}

}  // namespace smp
