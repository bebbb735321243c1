// Everything a LibTorch program includes to train its own modules through
// smp: the public API (Runtime, Config, ...) and the SDK's TorchModel, which
// turns the program's torch::nn modules and loss into an in-process plugin.
#pragma once

#include <smp/smp.h>
#include <smp/sdk/torch_module.hpp>
