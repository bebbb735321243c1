#include "pipeline/offload_prefetch.h"

#include <algorithm>

namespace smp {

std::vector<std::vector<SlotKey>> offload_prefetches(const std::vector<Action>& actions, int horizon) {
  // The backwards that recompute (and so read the offloaded inputs), in order.
  std::vector<SlotKey> order;
  for (const Action& a : actions)
    if (a.op == Op::Backward || a.op == Op::BackwardInput) order.emplace_back(a.microbatch, a.chunk);
  std::vector<std::vector<SlotKey>> out(actions.size());
  size_t done = 0;
  for (size_t i = 0; i < actions.size(); ++i) {
    const Op op = actions[i].op;
    if (op != Op::Backward && op != Op::BackwardInput) continue;
    const size_t end = std::min(order.size(), done + 1 + static_cast<size_t>(std::max(horizon, 0)));
    out[i].assign(order.begin() + static_cast<std::ptrdiff_t>(done), order.begin() + static_cast<std::ptrdiff_t>(end));
    ++done;
  }
  return out;
}

}  // namespace smp
