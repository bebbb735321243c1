// LibTorch's own modules as smp module kinds, unchanged.
//
// A torch::nn::Module class (C++ frontend; forward over tensors, any control
// flow inside) becomes a kind the core creates per node:
//
//   PluginBuilder("mine", "1.0").module("block", torch_module_factory<Block>())  // Block(const Json&) or Block()
//
// and a program's model (the modules it built itself) becomes an in-process
// plugin whose graph smp partitions, with TorchModel (below).
//
// What the core sees of such a module: its inputs go to forward(), its
// parameters are named_parameters() (replicated on every axis, but those of
// the SDK's tensor-parallel layers inside, torch_parallel.hpp), train() /
// eval() follow the call, and the default CPU generator is seeded for each
// call from the call's seed (dropout masks are the same in every layout and
// when activation checkpointing recomputes the call). A kind's module is
// created with that generator seeded from the node's init seed, so LibTorch's
// default initialisation gives the same values on every rank and layout.
// Buffers (named_buffers, such as BatchNorm's running statistics) are kept
// beside the parameters: never trained, saved in checkpoints, and sent from
// the first data-parallel replica to the others before each step (DDP's
// broadcast_buffers).
#pragma once

#include <smp/sdk/in_process.hpp>
#include <smp/sdk/module.hpp>
#include <smp/sdk/sync_batch_norm.hpp>
#include <smp/sdk/tp_plan.hpp>
#include <smp/sdk/torch_parallel.hpp>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/sequential.h>

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace smp::sdk {

// The default CPU generator seeded with `seed` for a scope, its state put back after.
class SeededGenerator {
 public:
  explicit SeededGenerator(uint64_t seed)
      : gen_(at::detail::getDefaultCPUGenerator()), impl_(at::check_generator<at::CPUGeneratorImpl>(gen_)) {
    std::lock_guard<std::mutex> lock(gen_.mutex());
    // The engine and the cached normal samples are the whole state (what
    // get_state serialises), copied without a state tensor.
    saved_engine_ = impl_->engine();
    saved_float_ = impl_->next_float_normal_sample();
    saved_double_ = impl_->next_double_normal_sample();
    impl_->set_current_seed(seed);
  }
  ~SeededGenerator() {
    std::lock_guard<std::mutex> lock(gen_.mutex());
    impl_->set_engine(saved_engine_);
    impl_->set_next_float_normal_sample(saved_float_);
    impl_->set_next_double_normal_sample(saved_double_);
  }
  SeededGenerator(const SeededGenerator&) = delete;
  SeededGenerator& operator=(const SeededGenerator&) = delete;

 private:
  at::Generator gen_;
  at::CPUGeneratorImpl* impl_;
  at::mt19937 saved_engine_;
  decltype(std::declval<at::CPUGeneratorImpl&>().next_float_normal_sample()) saved_float_;
  decltype(std::declval<at::CPUGeneratorImpl&>().next_double_normal_sample()) saved_double_;
};

namespace detail {

inline torch::nn::AnyValue call_any(torch::nn::AnyModule& m, const std::vector<at::Tensor>& in) {
  switch (in.size()) {
    case 1: return m.any_forward(in[0]);
    case 2: return m.any_forward(in[0], in[1]);
    case 3: return m.any_forward(in[0], in[1], in[2]);
    case 4: return m.any_forward(in[0], in[1], in[2], in[3]);
    case 5: return m.any_forward(in[0], in[1], in[2], in[3], in[4]);
    case 6: return m.any_forward(in[0], in[1], in[2], in[3], in[4], in[5]);
    default:
      throw Error("a torch module node takes 1 to 6 tensor inputs, this one has " + std::to_string(in.size()));
  }
}

// A forward's result as tensors: a Tensor, a std::vector of them, or a tuple of 2 or 3.
inline std::vector<at::Tensor> tensors_of(torch::nn::AnyValue& v, const std::string& node) {
  if (auto* t = v.try_get<at::Tensor>()) return {*t};
  if (auto* t = v.try_get<std::vector<at::Tensor>>()) return *t;
  if (auto* t = v.try_get<std::tuple<at::Tensor, at::Tensor>>()) return {std::get<0>(*t), std::get<1>(*t)};
  if (auto* t = v.try_get<std::tuple<at::Tensor, at::Tensor, at::Tensor>>())
    return {std::get<0>(*t), std::get<1>(*t), std::get<2>(*t)};
  throw Error("node '" + node + "': forward returned a " + c10::demangle(v.type_info().name()) +
              "; a torch module node returns a Tensor, a std::vector<Tensor> or a tuple of 2 or 3 Tensors");
}

}  // namespace detail

// An smp Module over a torch::nn::Module (shared with whoever built it).
class TorchModule : public Module {
 public:
  // Binds the tensor-parallel layers inside (torch_parallel.hpp) to ctx's tp group.
  TorchModule(std::shared_ptr<torch::nn::Module> module, torch::nn::AnyModule callable, const ModuleContext& ctx)
      : module_(std::move(module)), callable_(std::move(callable)), node_(ctx.node_name) {
    placed_ = bind_placed(*module_, ctx);
    const std::map<std::string, Param> planned = bind_plan(*module_, ctx);  // parallelize()'s layers
    planned_ = ctx.tp_size > 1 && !planned.empty();
    placed_.insert(planned.begin(), planned.end());
    sync_norms_ = bind_converted_batch_norms(*module_, ctx);  // convert_sync_batchnorm()'s
  }

  std::vector<at::Tensor> forward(const Call& call) override {
    module_->train(call.training);
    SeededGenerator seeded(call.rng_seed);
    if (planned_) plan_reshard(*module_);  // made whole for the program (gather_into_modules): split again
    PlanScope plan(planned_ || sync_norms_);
    try {
      torch::nn::AnyValue out = detail::call_any(callable_, call.inputs);
      return detail::tensors_of(out, node_);
    } catch (const std::exception& e) {  // c10::Error, or what AnyModule makes of it
      const std::string what = e.what();
      if (!planned_ || what.find("is invalid for input of size") == std::string::npos) throw;
      throw Error("node '" + node_ + "' has tensor-parallel layers (parallelize): a colwise layer's output holds "
                  "this rank's share of its features, so a reshape with the whole model's head count fails; take "
                  "the count from the size (view({B, T, -1, head_dim})). LibTorch: " + what.substr(0, what.find('\n')));
    }
  }

  std::vector<Param> parameters() override {
    std::vector<Param> out;
    for (const auto& item : module_->named_parameters(/*recurse=*/true)) {
      auto placed = placed_.find(item.key());
      Param p = placed == placed_.end() ? Param{} : placed->second;
      p.name = item.key();
      p.tensor = item.value();
      out.push_back(std::move(p));
    }
    // Buffers (BatchNorm's running statistics): saved in checkpoints, and the
    // same on every data-parallel replica before each step.
    for (const auto& item : module_->named_buffers(/*recurse=*/true)) {
      if (!item.value().defined()) continue;
      Param p;
      p.name = item.key();
      p.tensor = item.value();
      p.buffer = true;
      out.push_back(std::move(p));
    }
    return out;
  }

 private:
  std::shared_ptr<torch::nn::Module> module_;
  torch::nn::AnyModule callable_;
  std::string node_;
  std::map<std::string, Param> placed_;  // tensor-parallel layers' parameters, by full name
  bool planned_ = false;                 // holds parallelize()'s layers, split over tp > 1
  bool sync_norms_ = false;              // holds convert_sync_batchnorm()'s modules
};

// A kind from a module class M: M(const Json& config) when it has that
// constructor, else M(); made under the node's init seed.
template <class M>
ModuleFactory torch_module_factory() {
  return [](const Json& config, const ModuleContext& ctx) -> std::unique_ptr<Module> {
    std::shared_ptr<M> m;
    {
      SeededGenerator seeded(ctx.init_seed);
      if constexpr (std::is_constructible_v<M, const Json&>)
        m = std::make_shared<M>(config);
      else
        m = std::make_shared<M>();
    }
    return std::make_unique<TorchModule>(m, torch::nn::AnyModule(m), ctx);
  };
}

// A program's model: the modules it built, wired by named values, and its
// loss. Nodes run in the order they are added; smp partitions them over pp.
//
//   smp::sdk::TorchModel model("mixer");
//   model.input("images").input("labels")
//        .sequential("net", net, "images", "logits")       // each child a node: net.0, net.1, ...
//        .loss("loss", [](at::Tensor y, at::Tensor t) { return torch::nn::functional::cross_entropy(y, t); },
//              {"logits", "labels"});
//   auto rt = smp::Runtime::create(config, env, {model.plugin()}, example_batch);
//
// The loss is a mean over the microbatch's samples (loss_sum: a sum with a
// count). A module added twice (or at two nodes) is one module: its nodes
// share its parameters (tied weights, summed gradients across stages).
// Every rank builds the whole model the same way, as under DDP; a rank then
// holds and trains only its stages' modules: once Runtime::create has
// returned, a program that drops its TorchModel and its handles to the
// modules frees those of the other stages.
class TorchModel {
 public:
  explicit TorchModel(std::string name = "model") : name_(std::move(name)) {}

  TorchModel& input(const std::string& value) {
    inputs_.push_back(value);
    return *this;
  }

  // One node calling `module` (a module holder such as torch::nn::Linear, a
  // std::shared_ptr to a module, or an AnyModule) on named values.
  template <class M>
  TorchModel& node(const std::string& name, M module, std::vector<std::string> inputs,
                   std::vector<std::string> outputs) {
    torch::nn::AnyModule any(std::move(module));
    std::shared_ptr<torch::nn::Module> ptr = any.ptr();
    add(name, ptr, std::move(any), std::move(inputs), std::move(outputs));
    return *this;
  }

  // Each child of a Sequential as a node "<prefix>.<i>", chained from `input` to `output`.
  TorchModel& sequential(const std::string& prefix, torch::nn::Sequential seq, const std::string& input,
                         const std::string& output) {
    std::string value = input;
    const size_t n = seq->size();
    if (n == 0) throw Error("TorchModel '" + name_ + "': Sequential '" + prefix + "' has no children");
    for (size_t i = 0; i < n; ++i) {
      const std::string next = i + 1 == n ? output : prefix + "." + std::to_string(i) + ":out";
      torch::nn::AnyModule any = *(seq->begin() + static_cast<std::ptrdiff_t>(i));  // shares the child
      add(prefix + "." + std::to_string(i), seq->ptr(i), std::move(any), {value}, {next});
      value = next;
    }
    return *this;
  }

  // The loss: fn of the named values, a scalar mean over the microbatch's samples.
  template <class Fn>
  TorchModel& loss(const std::string& name, Fn fn, std::vector<std::string> inputs) {
    loss_fn(name, std::move(fn), std::move(inputs));
    loss_value_ = name + ":loss";
    return *this;
  }
  // The loss as a sum over items, with their count: fn returns {sum, count}
  // (scalars); the core divides by the step's total count once.
  template <class Fn>
  TorchModel& loss_sum(const std::string& name, Fn fn, std::vector<std::string> inputs) {
    loss_fn(name, std::move(fn), std::move(inputs), 2);
    loss_value_ = name + ":loss";
    count_value_ = name + ":count";
    return *this;
  }

  // Batches served by smp's own loop instead (an adapter's batch(): the
  // graph inputs of samples [first_sample, first_sample + num_samples) of the
  // global batch of `step`, for the train or validation split): then
  // Runtime::train_step() and evaluate(n), and smp::Trainer's steps and
  // validation (train.val_every), work as with any adapter.
  using BatchFn = std::function<std::vector<at::Tensor>(const BatchRequest&)>;
  TorchModel& batches(BatchFn fn) {
    batches_ = std::move(fn);
    return *this;
  }

  // The in-process plugin: one module kind per node ("<model>/<node>") and
  // the adapter "<model>" whose graph this describes. Its batches are the
  // program's (Runtime::train_step(batch)), or batches()'.
  InProcessPlugin plugin() const {
    if (inputs_.empty()) throw Error("TorchModel '" + name_ + "': no input (TorchModel::input)");
    if (loss_value_.empty()) throw Error("TorchModel '" + name_ + "': no loss (TorchModel::loss)");
    PluginBuilder b(name_, "program");
    for (const auto& n : nodes_) {
      if (!n->shared_key.empty() && n->shared_key != n->name) continue;  // a shared module's kind is its first node's
      // A node holding tensor-parallel layers is split over tp: a rule says so (the kind splits itself).
      if (n->module && (holds_placed(*n->module) || holds_planned(*n->module)))
        b.rule("tp", name_ + "/" + n->name, name_ + "/" + n->name);
      // Weak: once the runtime is made, the program may drop its model, and the
      // modules of the stages this rank does not run go with it.
      std::weak_ptr<const NodeSpec> weak = n;
      const std::string model = name_;
      b.module(name_ + "/" + n->name, [weak, model](const Json&, const ModuleContext& ctx) -> std::unique_ptr<Module> {
        const std::shared_ptr<const NodeSpec> spec = weak.lock();
        if (!spec)
          throw Error("node '" + ctx.node_name + "': TorchModel '" + model + "' was destroyed before smp created the "
                      "node; keep it (and its modules) until Runtime::create returns");
        if (spec->function) return std::make_unique<FunctionModule>(spec->function, ctx.node_name);
        return std::make_unique<TorchModule>(spec->module, spec->callable, ctx);
      });
    }
    auto described =
        std::make_shared<Description>(Description{name_, inputs_, {}, loss_value_, count_value_, batches_});
    for (const auto& n : nodes_)
      described->nodes.push_back({n->name, name_ + "/" + (n->shared_key.empty() ? n->name : n->shared_key), n->inputs,
                                  n->outputs, n->shared_key});
    b.adapter(name_, [described](const Json&, const AdapterContext&) -> std::unique_ptr<Adapter> {
      return std::make_unique<ProgramAdapter>(described);
    });
    return InProcessPlugin(std::move(b));
  }

  const std::string& name() const { return name_; }

  // Splits again the layers a plan split over tp that an earlier
  // load_state_dict made whole (tp_plan.hpp's plan_reshard), so that the
  // runtime reads the shards it describes: smp::gather_into_modules calls it
  // before it gathers.
  void reshard_planned() const {
    for (const auto& n : nodes_)
      if (n->module) plan_reshard(*n->module);
  }

  // Copies whole tensors named as smp names them (Runtime::model_state_dict:
  // "<node>.<parameter>", the node of a Sequential's child "<prefix>.<i>")
  // into the program's own modules: every parameter and buffer of every node,
  // so they compute what the trained model computes. A name missing from
  // `whole` or a shape that differs from the module's (a module holding the
  // SDK's tensor-parallel layers keeps its shard) is refused naming it.
  void load_state_dict(const std::vector<std::pair<std::string, at::Tensor>>& whole) const {
    std::map<std::string, at::Tensor> by_name(whole.begin(), whole.end());
    torch::NoGradGuard no_grad;
    for (const auto& n : nodes_) {
      if (!n->module || (!n->shared_key.empty() && n->shared_key != n->name)) continue;
      auto copy = [&](const std::string& local, at::Tensor target) {  // shares the module's tensor
        const std::string name = n->name + "." + local;
        auto it = by_name.find(name);
        if (it == by_name.end())
          throw Error("TorchModel '" + name_ + "': load_state_dict: no tensor named '" + name + "'");
        if (it->second.sizes() != target.sizes() && take_whole(target, it->second)) return;  // a plan's shard
        if (it->second.sizes() != target.sizes())
          throw Error("TorchModel '" + name_ + "': load_state_dict: '" + name + "' is " +
                      c10::str(it->second.sizes()) + " whole, the module holds " + c10::str(target.sizes()) +
                      " (a tensor-parallel shard keeps its own values)");
        target.copy_(it->second);
      };
      for (const auto& item : n->module->named_parameters(/*recurse=*/true)) copy(item.key(), item.value());
      for (const auto& item : n->module->named_buffers(/*recurse=*/true))
        if (item.value().defined()) copy(item.key(), item.value());
    }
  }

 private:
  using TensorFn = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;
  struct NodeSpec {
    std::string name;
    std::shared_ptr<torch::nn::Module> module;
    torch::nn::AnyModule callable;
    TensorFn function;  // the loss: a function, not a module
    std::vector<std::string> inputs, outputs;
    std::string shared_key;
  };
  struct Description {
    struct Node {
      std::string name, kind;
      std::vector<std::string> inputs, outputs;
      std::string shared_key;
    };
    std::string model;
    std::vector<std::string> inputs;
    std::vector<Node> nodes;
    std::string loss, count;
    BatchFn batches;  // null: the program feeds every step
  };

  // A parameterless node computing a function of its inputs (the loss).
  class FunctionModule : public Module {
   public:
    FunctionModule(TensorFn fn, std::string node) : fn_(std::move(fn)), node_(std::move(node)) {}
    std::vector<at::Tensor> forward(const Call& call) override { return fn_(call.inputs); }

   private:
    TensorFn fn_;
    std::string node_;
  };

  class ProgramAdapter : public Adapter {
   public:
    explicit ProgramAdapter(std::shared_ptr<const Description> d) : d_(std::move(d)) {}
    void describe(GraphBuilder& graph) override {
      for (const auto& in : d_->inputs) graph.input(in);
      for (const auto& n : d_->nodes) {
        GraphBuilder::Node node;
        node.name = n.name;
        node.kind = n.kind;
        node.inputs = n.inputs;
        node.outputs = n.outputs;
        node.shared_key = n.shared_key;
        graph.node(node);
      }
      if (d_->count.empty())
        graph.loss(d_->loss);
      else
        graph.loss_sum(d_->loss, d_->count);
    }
    std::vector<at::Tensor> batch(const BatchRequest& request) override {
      if (d_->batches) return d_->batches(request);
      throw Error("model '" + d_->model + "' is fed by the program: pass its batches to Runtime::train_step(batch), "
                  "evaluate(batch) or forward(batch, outputs) (smp::Trainer's validation and evaluate(n) need an "
                  "adapter's batches: TorchModel::batches)");
    }

   private:
    std::shared_ptr<const Description> d_;
  };

  void add(const std::string& name, std::shared_ptr<torch::nn::Module> module, torch::nn::AnyModule callable,
           std::vector<std::string> inputs, std::vector<std::string> outputs) {
    check_new(name);
    auto spec = std::make_shared<NodeSpec>(
        NodeSpec{name, module, std::move(callable), nullptr, std::move(inputs), std::move(outputs), ""});
    // The same module at two nodes is one module (tied): both nodes name the first.
    for (auto& n : nodes_)
      if (n->module && n->module.get() == module.get()) {
        if (n->shared_key.empty()) n->shared_key = n->name;
        spec->shared_key = n->shared_key;
        break;
      }
    nodes_.push_back(std::move(spec));
  }

  template <class Fn>
  void loss_fn(const std::string& name, Fn fn, std::vector<std::string> inputs, size_t n_out = 1) {
    TensorFn f;
    if constexpr (std::is_invocable_v<Fn, at::Tensor, at::Tensor> &&
                  std::is_convertible_v<std::invoke_result_t<Fn, at::Tensor, at::Tensor>, at::Tensor>) {
      if (inputs.size() != 2)
        throw Error("TorchModel '" + name_ + "': loss '" + name + "' takes two values, " + std::to_string(inputs.size()) +
                    " are named");
      f = [fn](const std::vector<at::Tensor>& in) { return std::vector<at::Tensor>{fn(in[0], in[1])}; };
    } else if constexpr (std::is_invocable_v<Fn, at::Tensor, at::Tensor>) {  // {sum, count}
      f = [fn](const std::vector<at::Tensor>& in) {
        auto [sum, count] = fn(in[0], in[1]);
        return std::vector<at::Tensor>{sum, count};
      };
    } else {
      f = [fn](const std::vector<at::Tensor>& in) {
        auto r = fn(in);
        if constexpr (std::is_convertible_v<decltype(r), at::Tensor>)
          return std::vector<at::Tensor>{r};
        else
          return std::vector<at::Tensor>(r.begin(), r.end());
      };
    }
    std::vector<std::string> outs{name + ":loss"};
    if (n_out == 2) outs.push_back(name + ":count");
    check_new(name);
    nodes_.push_back(std::make_shared<NodeSpec>(
        NodeSpec{name, nullptr, torch::nn::AnyModule(), std::move(f), std::move(inputs), std::move(outs), ""}));
  }

  void check_new(const std::string& name) const {
    for (const auto& n : nodes_)
      if (n->name == name) throw Error("TorchModel '" + name_ + "': node '" + name + "' added twice");
  }

  std::string name_;
  std::vector<std::string> inputs_;
  std::vector<std::shared_ptr<NodeSpec>> nodes_;  // shared by copies of this TorchModel
  BatchFn batches_;
  std::string loss_value_, count_value_;
};

}  // namespace smp::sdk
