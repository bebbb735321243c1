// Activation checkpointing of one module call: forward runs without keeping
// the call's intermediate activations (only its inputs), and backward runs the
// call again with gradients on, then back-propagates through the recomputed
// graph (the reentrant scheme of torch.utils.checkpoint). Module calls take
// their random seed explicitly, so the recomputation draws the same dropout
// masks as the first forward.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <string>
#include <vector>

namespace smp::sdk {
struct InputStash;  // smp/sdk/checkpoint.hpp
}

namespace smp {

struct ModelGraph;

// memory.checkpoint / memory.checkpoint_every (or another list, `key`): per
// graph node, whether it is selected. An entry matches a node by kind, by name,
// or as a name prefix ("blocks" matches "blocks.3"); of the matching nodes in
// graph order, every `every`-th from the first. An entry that matches nothing
// is an error naming `origin` and `key`.
std::vector<bool> select_checkpointed(const ModelGraph& graph, const std::vector<std::string>& entries, int every,
                                      const std::string& origin, const std::string& key = "memory.checkpoint");

using ModuleCall = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>& inputs)>;

// Runs `call` on `inputs` keeping only the inputs for backward (in `stash`
// when given: activation offload). Under no-grad (evaluation) it is just call(inputs).
std::vector<at::Tensor> checkpointed(const ModuleCall& call, const std::vector<at::Tensor>& inputs,
                                     sdk::InputStash* stash = nullptr);

}  // namespace smp
