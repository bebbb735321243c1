// Which virtual pipeline stage runs each graph node, and what flows between stages.
#pragma once

#include <smp/model_graph.h>

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

// Exported from libsmp_core (built with hidden visibility): the public API.
#pragma GCC visibility push(default)
namespace smp {

class PluginRegistry;

// Cost of one node for the partitioner (per microbatch).
struct NodeCost {
  double compute = 0;  // FLOPs (hints) or seconds (profiled), forward + backward
  double memory = 0;   // bytes: parameters with gradients and optimizer state + activations
};

struct StagePlan {
  int pp = 1;
  int chunks = 1;  // virtual stages per rank: virtual stage s runs on rank s % pp as chunk s / pp
  std::vector<int> stage_of_node;
  std::vector<std::vector<int>> nodes_of_stage;           // per virtual stage, execution order
  std::vector<std::vector<std::string>> sent_after;       // values virtual stage s sends to s+1
  std::vector<std::vector<std::string>> inputs_of_stage;  // graph inputs stage s reads from the batch
  std::vector<NodeCost> costs;

  int num_stages() const { return pp * chunks; }
  int rank_of(int stage) const { return stage % pp; }
  int chunk_of(int stage) const { return stage / pp; }

  // Checks the assignment (stages in range, every edge goes forward, the loss on
  // the last stage, every stage non-empty) and derives what flows between stages.
  // A value produced on stage i and read on stage j > i + 1 travels through every
  // stage in between. Throws smp::Error naming the node or stage.
  static StagePlan build(const ModelGraph& graph, std::vector<int> stage_of_node, int pp, int chunks);

  nlohmann::json to_json(const ModelGraph& graph) const;
};

// Costs from the adapter's hints (FLOPs x 3 for forward + backward; memory =
// 4 x parameter bytes (weights, gradient, two Adam moments) + activation bytes x
// microbatch samples). Returns false when some node has no hints.
bool costs_from_hints(const ModelGraph& graph, int64_t microbatch_samples, std::vector<NodeCost>& costs);

// Asks the named partition strategy for a stage per node.
std::vector<int> run_partitioner(const PluginRegistry& registry, const std::string& strategy,
                                 const ModelGraph& graph, const std::vector<NodeCost>& costs, int num_stages,
                                 const nlohmann::json& options, bool tie_across_stages);

}  // namespace smp
#pragma GCC visibility pop
