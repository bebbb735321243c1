// Everything a LibTorch program includes to train its own modules through
// smp: the public API (Runtime, Options, ...), the SDK's TorchModel, which
// turns the program's torch::nn modules and loss into an in-process plugin,
// and smp::Model, which wraps the program's model as DDP wraps a module.
#pragma once

#include <smp/smp.h>
#include <smp/sdk/torch_module.hpp>

#include <torch/optim/adam.h>  // the option classes smp::Options::optimizer takes
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace smp {

// Tensor parallelism by a plan on the program's unmodified layers (smp/sdk/tp_plan.hpp).
using sdk::parallelize;
using sdk::TpStyle;
// BatchNorm synchronised over dp without changing the model's source (smp/sdk/sync_batch_norm.hpp).
using sdk::convert_sync_batchnorm;

// The program's own modules (those `model` was built from) made to hold the
// runtime's current whole parameters and buffers, on every rank: a pipeline
// rank's copies of the stages it does not run are stale otherwise, and under
// ZeRO-3 a module smp runs has no storage between steps (gather_parameters
// gives it back until the next step). Collective over the world; call it
// after training, or whenever the program calls its modules itself. Layers a
// plan split over tp (parallelize) become whole for the program; smp splits
// them again when it next runs their node or gathers, and a runtime made
// later over the same model splits them for its own layout.
inline void gather_into_modules(Runtime& runtime, const sdk::TorchModel& model) {
  model.reshard_planned();  // a second gather: the runtime reads the shards it describes
  runtime.gather_parameters();
  model.load_state_dict(runtime.model_state_dict());
}

// A program's model trained through smp, the way DDP wraps a module: the
// program keeps its modules (gather() makes them hold the trained values on
// every rank), its loop and its optimizer's options (smp::Options).
//
//   smp::Model model(net, torch::nn::CrossEntropyLoss(), smp::Options().optimizer(torch::optim::SGDOptions(0.1)));
//   for (...) double loss = model.train_step({{"input", x}, {"target", y}}).loss;
//   model.gather();  // net->forward(x) is the trained model's, on every rank
//
// The runtime is made collectively at the first call that brings a batch,
// with that batch as the example (what the pipeline partition profiles) and,
// unless the options set train.batch_size, its rows as the global batch: each
// rank passes the whole batch, as the plain program does, and smp takes the
// rows of its data-parallel share. create() makes it earlier.
class Model {
 public:
  // A Sequential and a loss module (or function) called as loss(output,
  // target): graph inputs "input" and "target", the Sequential's output "output".
  template <class Loss>
  Model(torch::nn::Sequential net, Loss loss, Options options) : options_(std::move(options)) {
    auto fn = std::make_shared<Loss>(std::move(loss));  // shared by the copies of the loss node's function
    model_.input("input").input("target").sequential("net", std::move(net), "input", "output").loss(
        "loss", [fn](at::Tensor output, at::Tensor target) { return call(*fn, output, target); }, {"output", "target"});
  }
  // Any graph of the program's modules.
  Model(sdk::TorchModel model, Options options) : model_(std::move(model)), options_(std::move(options)) {}

  // Makes the runtime now (every rank): `example` as Options::example.
  Runtime& create(const Batch& example = {}) { return make(example, false); }
  Runtime& runtime() { return create(); }

  StepResult train_step(const Batch& batch) { return make(batch, true).train_step(batch); }
  double evaluate(const Batch& batch) { return create(batch).evaluate(batch); }
  Batch forward(const Batch& inputs, const std::vector<std::string>& outputs) {
    return create(inputs).forward(inputs, outputs);
  }
  int64_t steps_done() { return runtime().steps_done(); }
  void set_learning_rate(double lr) { runtime().set_learning_rate(lr); }
  // The program's modules hold the current whole parameters and buffers (collective).
  void gather() { gather_into_modules(runtime(), model_); }
  const sdk::TorchModel& graph() const { return model_; }

 private:
  // A training batch sets train.batch_size (its rows) unless the options do.
  Runtime& make(const Batch& example, bool training) {
    if (runtime_) return *runtime_;
    Options o = options_;
    if (!example.empty()) {
      o.example(example);
      if (training && !options_.config().has("train.batch_size"))
        o.batch_size(example.begin()->second.dim() > 0 ? example.begin()->second.size(0) : 1);
    }
    runtime_ = Runtime::create(o, ProcessEnv::from_environment(), {model_.plugin()});
    return *runtime_;
  }

  template <class Loss>
  static at::Tensor call(Loss& loss, const at::Tensor& output, const at::Tensor& target) {
    if constexpr (std::is_invocable_v<Loss&, at::Tensor, at::Tensor>)
      return loss(output, target);
    else
      return loss->forward(output, target);  // a module holder (torch::nn::CrossEntropyLoss)
  }

  sdk::TorchModel model_{"model"};
  Options options_;
  std::unique_ptr<Runtime> runtime_;
};

}  // namespace smp
