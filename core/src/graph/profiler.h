// Measures per-node costs by running the serial model one node at a time, for
// graphs whose adapter gave no cost hints. Each module lives only while nodes
// still use it, so peak memory is about one module plus live activations.
#pragma once

#include <smp/model_graph.h>
#include <smp/stage_plan.h>

#include <ATen/core/Tensor.h>

#include <functional>
#include <vector>

namespace smp {

class PluginRegistry;

std::vector<NodeCost> profile_costs(const ModelGraph& graph, const PluginRegistry& registry,
                                    const std::function<std::vector<at::Tensor>(int microbatch)>& batch,
                                    uint64_t seed);

}  // namespace smp
