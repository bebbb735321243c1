// A batch of the program's own tensors, named by graph input.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <string>
#include <vector>

namespace smp {

// One tensor per graph input ("tokens", "target"), samples along dimension 0.
// Given to Runtime::train_step / evaluate / forward, it is this rank's share of
// the global batch: the samples of its data-parallel coordinate (every rank of
// one dp coordinate, across pp and tp, passes the same tensors).
using Batch = std::map<std::string, at::Tensor>;

// Where a decoding call's inputs lie in each sample's sequence
// (Runtime::decode): sample i's inputs are its positions [start[i], start[i] + s).
struct DecodePositions {
  std::vector<int64_t> start;  // one per sample, >= 0
  int64_t capacity = 0;        // positions the modules' caches hold: start[i] + s <= capacity
};

}  // namespace smp
