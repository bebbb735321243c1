// Which offloaded activations to load back ahead of each backward pass.
//
// memory.offload keeps a checkpointed slot's (microbatch, chunk) inputs in
// host memory between its forward and its backward. Each backward of a rank's
// schedule, whole (Backward) or its input part (BackwardInput, zero-bubble
// schedules: the weight part needs no recompute), starts loading the inputs of
// itself and of the next `horizon` backwards, so the copies overlap compute.
#pragma once

#include "schedule/schedule.h"

#include <utility>
#include <vector>

namespace smp {

using SlotKey = std::pair<int, int>;  // (microbatch, chunk)

// Per action of `actions` (one rank's schedule, in order): the slots whose
// inputs to start loading just before that action runs (empty for actions that
// are not backwards): the k-th backward names backwards k .. k + horizon, so a
// slot is named by every window that reaches it (loading is idempotent, and a
// slot not forwarded yet when first named is loaded by a later window).
std::vector<std::vector<SlotKey>> offload_prefetches(const std::vector<Action>& actions, int horizon);

}  // namespace smp
