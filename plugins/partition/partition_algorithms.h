// Pipeline partition strategies of the smp_partition plugin, as plain functions
// (plugin.cpp registers them; the tests call them directly).
//
// Every strategy returns the stage of each node of request.graph and guarantees,
// or throws smp::sdk::Error naming the option / node at fault:
//   * value edges never go backwards: stage(src) <= stage(dst);
//   * every stage gets at least one node (there must be >= num_stages nodes, or
//     >= num_stages units after merging tied nodes, see below);
//   * with tie_across_stages == false, nodes sharing a shared_key are on one stage.
//     tree and balanced split the execution order contiguously, so such nodes and
//     everything executed between them form one unit ("atom"), as SMP merges
//     modules that share parameters into one node; manual checks it.
#pragma once

#include <smp/sdk/partition.hpp>

#include <nlohmann/json.hpp>

#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

namespace smp::partition {

using sdk::PartitionRequest;

// The paper's (SageMaker MP, arXiv 2111.05972) hierarchical algorithm over the
// module tree given by the dotted node names. Options: optimize = "speed" |
// "memory" (memory_weight 0.2 | 0.8), memory_weight in [0, 1] overrides.
std::vector<int> tree_partition(const PartitionRequest& request);

// Exact contiguous split of the execution order minimising the maximum stage cost.
// Cost = compute unless optimize / memory_weight are given (then as tree's).
std::vector<int> balanced_partition(const PartitionRequest& request);

// options.manual = { "<dotted name prefix>" = stage, ... }; longest prefix wins.
std::vector<int> manual_partition(const PartitionRequest& request);

// ---- building blocks (exposed for tests) --------------------------------------

// d'Hondt apportionment of `seats` among parties with the given weights: every
// party first gets one seat, then each further seat goes to the party with the
// largest weight / (seats_so_far + 1) (ties: lowest index) among those below their
// capacity (capacity empty = unlimited). Throws if seats < parties or the
// capacities can't absorb all seats.
std::vector<int> dhondt(const std::vector<double>& weights, int seats, const std::vector<int>& capacity = {});

// Contiguous split of `costs` into exactly `parts` non-empty segments minimising
// the maximum segment sum (exact DP, O(n^2 * parts)); among optimal splits the one
// with the smallest sum of squared segment sums, then the earliest cuts (so any
// remaining slack lands on the later segments -- later pipeline stages hold fewer
// in-flight microbatches). Returns
// the segment index of every item. Requires 1 <= parts <= costs.size().
std::vector<int> min_max_split(const std::vector<double>& costs, int parts);

// The memory weight w of cost = w * memory + (1 - w) * compute:
// options.memory_weight if present (must be a number in [0, 1]), else 0.8 for
// optimize = "memory", 0.2 for optimize = "speed", else `fallback`.
double resolve_memory_weight(const nlohmann::json& options, double fallback);
// Refuses a [partition] option the strategy does not read, naming it:
// "partition.<key>: not an option of the '<strategy>' partition strategy (known: ...)".
void expect_options(const PartitionRequest& r, std::initializer_list<const char*> known, const char* strategy);

// Per-node cost w * memory/sum(memory) + (1 - w) * compute/sum(compute) (a term
// whose total is 0 is dropped; all costs 0 -> 1/n each). Throws on negative / NaN.
std::vector<double> node_costs(const sdk::CostGraph& graph, double memory_weight);

// Units that must stay on one stage, as contiguous [first, last] node ranges in
// execution order, covering all nodes. Without ties (or with tie_across_stages)
// every node is its own unit.
std::vector<std::pair<int, int>> atoms(const PartitionRequest& request);

// Throws, naming the shared keys involved, when tied-node merging leaves fewer
// units than stages.
void check_atom_count(const PartitionRequest& request, const std::vector<std::pair<int, int>>& units,
                      const char* strategy);

// Checks the request itself: num_stages >= 1, at least num_stages nodes, edges
// within range and in execution order. Throws naming what's wrong.
void validate_request(const PartitionRequest& request, const char* strategy);

// Checks a result against the guarantees above. Throws naming the node / edge / stage.
void check_partition(const PartitionRequest& request, const std::vector<int>& stages, const char* strategy);

}  // namespace smp::partition
