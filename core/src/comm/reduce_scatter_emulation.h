// Reduce-scatter where the backend has none (Gloo in LibTorch 1.13): an
// all-to-all of the slices, then a local reduction of the n slices received
// (the same bytes on the wire as a direct reduce-scatter). Slices follow
// torch.tensor_split: with N rows and n ranks, rank i gets N/n rows plus one
// when i < N % n; `out` has this rank's.
#pragma once

#include "comm/communicator.h"

#include <ATen/core/Tensor.h>

#include <functional>
#include <vector>

namespace smp {

struct EmulatedReduceScatter {
  std::vector<int64_t> in_splits, out_splits;  // rows to and from each rank
  at::Tensor received;                         // n slices of out's shape, rank after rank
  std::function<void()> finish;                // reduces `received` into out, once the all-to-all completed
};

// in: dense, contiguous (kept alive by finish); out: this rank's slice.
EmulatedReduceScatter emulate_reduce_scatter(const at::Tensor& in, at::Tensor out, int n, ReduceOp op);

}  // namespace smp
