#include "comm/reduce_scatter_emulation.h"

#include "comm/byte_accounting.h"

#include <ATen/ATen.h>

namespace smp {

EmulatedReduceScatter emulate_reduce_scatter(const at::Tensor& in, at::Tensor out, int n, ReduceOp op) {
  EmulatedReduceScatter e;
  const int64_t rows = in.size(0), mine = out.size(0);
  e.in_splits.resize(n);
  for (int i = 0; i < n; ++i) e.in_splits[i] = split_rows(rows, n, i);
  e.out_splits.assign(n, mine);
  auto received_shape = out.sizes().vec();
  received_shape[0] = mine * n;
  e.received = at::empty(received_shape, in.options());
  e.finish = [out, received = e.received, n, op, keep = in]() mutable {
    auto parts_shape = out.sizes().vec();
    parts_shape.insert(parts_shape.begin(), n);
    at::Tensor parts = received.view(parts_shape);
    switch (op) {
      case ReduceOp::Sum: out.copy_(parts.sum(0)); break;
      case ReduceOp::Max: out.copy_(std::get<0>(parts.max(0))); break;
      case ReduceOp::Min: out.copy_(std::get<0>(parts.min(0))); break;
      case ReduceOp::Product: out.copy_(parts.prod(0)); break;
    }
  };
  return e;
}

}  // namespace smp
