// A batch of the program's own tensors, named by graph input.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <string>

namespace smp {

// One tensor per graph input ("tokens", "target"), samples along dimension 0.
// Given to Runtime::train_step / evaluate / forward, it is this rank's share of
// the global batch: the samples of its data-parallel coordinate (every rank of
// one dp coordinate, across pp and tp, passes the same tensors).
using Batch = std::map<std::string, at::Tensor>;

}  // namespace smp
