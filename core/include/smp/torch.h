// Everything a LibTorch program includes to train its own modules through
// smp: the public API (Runtime, Options, ...) and the SDK's TorchModel, which
// turns the program's torch::nn modules and loss into an in-process plugin.
#pragma once

#include <smp/smp.h>
#include <smp/sdk/torch_module.hpp>

#include <torch/optim/adam.h>  // the option classes smp::Options::optimizer takes
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

namespace smp {

// The program's own modules (those `model` was built from) made to hold the
// runtime's current whole parameters and buffers, on every rank: a pipeline
// rank's copies of the stages it does not run are stale otherwise, and under
// ZeRO-3 a module smp runs has no storage between steps (gather_parameters
// gives it back until the next step). Collective over the world; call it
// after training, or whenever the program calls its modules itself.
inline void gather_into_modules(Runtime& runtime, const sdk::TorchModel& model) {
  runtime.gather_parameters();
  model.load_state_dict(runtime.model_state_dict());
}

}  // namespace smp
