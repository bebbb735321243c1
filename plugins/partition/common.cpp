// Shared pieces of the partition strategies: request validation, costs, tied-node
// atoms, the min-max split DP, d'Hondt, and the final result check.
#include "partition_algorithms.h"

#include <smp/sdk/host.hpp>
#include <smp/sdk/module.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <sstream>

namespace smp::partition {

namespace {
std::string quoted(const std::string& s) { return "'" + s + "'"; }
}  // namespace

void validate_request(const PartitionRequest& r, const char* strategy) {
  const std::string who = std::string("partition strategy '") + strategy + "': ";
  const auto& nodes = r.graph.nodes;
  if (r.num_stages < 1) throw sdk::Error(who + "num_stages must be >= 1, got " + std::to_string(r.num_stages));
  if (static_cast<int>(nodes.size()) < r.num_stages)
    throw sdk::Error(who + "the graph has " + std::to_string(nodes.size()) + " nodes, fewer than the " +
                     std::to_string(r.num_stages) + " pipeline stages; every stage needs at least one node");
  const int64_t n = static_cast<int64_t>(nodes.size());
  for (const auto& [src, dst] : r.graph.edges) {
    if (src < 0 || src >= n || dst < 0 || dst >= n)
      throw sdk::Error(who + "edge " + std::to_string(src) + " -> " + std::to_string(dst) +
                       " names a node outside [0, " + std::to_string(n) + ")");
    if (src >= dst)
      throw sdk::Error(who + "edge " + quoted(nodes[src].name) + " -> " + quoted(nodes[dst].name) +
                       " goes against the execution order (nodes must be topologically ordered)");
  }
}

void expect_options(const PartitionRequest& r, std::initializer_list<const char*> known, const char* strategy) {
  std::string names;
  const std::string bad = sdk::first_unknown_key(r.options, known, &names);
  if (!bad.empty())
    throw sdk::Error("partition." + bad + ": not an option of the '" + strategy + "' partition strategy (known: " +
                     names + ")");
}

double resolve_memory_weight(const nlohmann::json& options, double fallback) {
  if (!options.is_object()) return fallback;
  if (options.contains("memory_weight")) {
    const auto& w = options.at("memory_weight");
    if (!w.is_number())
      throw sdk::Error("partition option 'memory_weight' must be a number in [0, 1], got " + w.dump());
    const double v = w.get<double>();
    if (!(v >= 0.0 && v <= 1.0))
      throw sdk::Error("partition option 'memory_weight' must be in [0, 1], got " + w.dump());
    return v;
  }
  if (options.contains("optimize")) {
    const auto& o = options.at("optimize");
    if (o.is_string() && o.get<std::string>() == "memory") return 0.8;
    if (o.is_string() && o.get<std::string>() == "speed") return 0.2;
    throw sdk::Error("partition option 'optimize' must be \"speed\" or \"memory\", got " + o.dump());
  }
  return fallback;
}

std::vector<double> node_costs(const sdk::CostGraph& g, double w) {
  double total_compute = 0, total_memory = 0;
  for (const auto& n : g.nodes) {
    if (!(n.compute >= 0) || !std::isfinite(n.compute))
      throw sdk::Error("node " + quoted(n.name) + " has an invalid compute cost " + std::to_string(n.compute));
    if (!(n.memory >= 0) || !std::isfinite(n.memory))
      throw sdk::Error("node " + quoted(n.name) + " has an invalid memory cost " + std::to_string(n.memory));
    total_compute += n.compute;
    total_memory += n.memory;
  }
  std::vector<double> cost(g.nodes.size(), 0.0);
  double total = 0;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    if (total_memory > 0) cost[i] += w * g.nodes[i].memory / total_memory;
    if (total_compute > 0) cost[i] += (1 - w) * g.nodes[i].compute / total_compute;
    total += cost[i];
  }
  if (total <= 0)  // nothing measured (or all weight on an all-zero term): count nodes
    std::fill(cost.begin(), cost.end(), g.nodes.empty() ? 0.0 : 1.0 / static_cast<double>(g.nodes.size()));
  return cost;
}

std::vector<std::pair<int, int>> atoms(const PartitionRequest& r) {
  const int n = static_cast<int>(r.graph.nodes.size());
  // reach[i]: the last node that must share node i's stage because of a tie spanning i.
  std::vector<int> reach(n);
  for (int i = 0; i < n; ++i) reach[i] = i;
  if (!r.tie_across_stages) {
    std::map<std::string, std::pair<int, int>> span;  // key -> [first, last]
    for (int i = 0; i < n; ++i) {
      const auto& key = r.graph.nodes[i].shared_key;
      if (key.empty()) continue;
      auto it = span.find(key);
      if (it == span.end()) span.emplace(key, std::make_pair(i, i));
      else it->second.second = i;
    }
    for (const auto& [key, s] : span) reach[s.first] = std::max(reach[s.first], s.second);
  }
  std::vector<std::pair<int, int>> out;
  for (int i = 0; i < n;) {
    int last = reach[i];
    for (int j = i; j <= last; ++j) last = std::max(last, reach[j]);
    out.emplace_back(i, last);
    i = last + 1;
  }
  return out;
}

void check_atom_count(const PartitionRequest& r, const std::vector<std::pair<int, int>>& units,
                      const char* strategy) {
  if (static_cast<int>(units.size()) >= r.num_stages) return;
  std::string why;
  std::map<std::string, std::pair<int, int>> span;
  for (int i = 0; i < static_cast<int>(r.graph.nodes.size()); ++i) {
    const auto& key = r.graph.nodes[i].shared_key;
    if (key.empty()) continue;
    auto it = span.find(key);
    if (it == span.end()) span.emplace(key, std::make_pair(i, i));
    else it->second.second = i;
  }
  for (const auto& [key, s] : span)
    if (s.second > s.first)
      why += (why.empty() ? "" : ", ") + quoted(key) + " ties " + quoted(r.graph.nodes[s.first].name) + " .. " +
             quoted(r.graph.nodes[s.second].name);
  throw sdk::Error(std::string("partition strategy '") + strategy + "': with tie_across_stages = false, nodes " +
                   "sharing a key stay on one stage together with everything executed between them, which " +
                   "leaves " + std::to_string(units.size()) + " unit(s) of " + std::to_string(r.graph.nodes.size()) +
                   " nodes for " + std::to_string(r.num_stages) + " stages (" + why +
                   "); allow tie_across_stages or use fewer stages");
}

std::vector<int> min_max_split(const std::vector<double>& costs, int parts) {
  const int n = static_cast<int>(costs.size());
  if (parts < 1 || parts > n)
    throw sdk::Error(SMP_ERR_INTERNAL, "min_max_split: cannot split " + std::to_string(n) + " items into " +
                                           std::to_string(parts) + " non-empty segments");
  std::vector<double> prefix(n + 1, 0.0);
  for (int i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + costs[i];
  const double eps = 1e-12 * std::max(1.0, prefix[n]);
  const double inf = std::numeric_limits<double>::infinity();
  auto seg = [&](int a, int b) { return prefix[b] - prefix[a]; };  // items [a, b)

  // Phase 1: best[j][i] = minimal max segment sum splitting items [0, i) into j segments.
  std::vector<std::vector<double>> best(parts + 1, std::vector<double>(n + 1, inf));
  best[0][0] = 0;
  for (int j = 1; j <= parts; ++j)
    for (int i = j; i <= n - (parts - j); ++i)
      for (int t = j - 1; t < i; ++t)
        if (best[j - 1][t] < inf) best[j][i] = std::min(best[j][i], std::max(best[j - 1][t], seg(t, i)));
  const double limit = best[parts][n] + eps;

  // Phase 2: among splits whose segments all stay within the optimum, the smallest
  // sum of squares; earliest cut on ties (strict improvement needed to move a cut).
  std::vector<std::vector<double>> ss(parts + 1, std::vector<double>(n + 1, inf));
  std::vector<std::vector<int>> from(parts + 1, std::vector<int>(n + 1, -1));
  ss[0][0] = 0;
  for (int j = 1; j <= parts; ++j)
    for (int i = j; i <= n - (parts - j); ++i)
      for (int t = j - 1; t < i; ++t) {
        if (ss[j - 1][t] == inf || seg(t, i) > limit) continue;
        const double v = ss[j - 1][t] + seg(t, i) * seg(t, i);
        if (ss[j][i] == inf || v < ss[j][i] - 1e-12 * std::max(1.0, ss[j][i])) {
          ss[j][i] = v;
          from[j][i] = t;
        }
      }
  std::vector<int> part(n, 0);
  for (int j = parts, i = n; j > 0; --j) {
    const int t = from[j][i];
    if (t < 0) throw sdk::Error(SMP_ERR_INTERNAL, "min_max_split: no feasible split (internal error)");
    for (int k = t; k < i; ++k) part[k] = j - 1;
    i = t;
  }
  return part;
}

std::vector<int> dhondt(const std::vector<double>& weights, int seats, const std::vector<int>& capacity) {
  const int n = static_cast<int>(weights.size());
  if (!capacity.empty() && static_cast<int>(capacity.size()) != n)
    throw sdk::Error(SMP_ERR_INTERNAL, "dhondt: capacity has the wrong size");
  if (seats < n)
    throw sdk::Error(SMP_ERR_INTERNAL, "dhondt: " + std::to_string(seats) + " seats for " + std::to_string(n) +
                                           " parties that need one each");
  long total_capacity = 0;
  for (int i = 0; i < n; ++i) total_capacity += capacity.empty() ? seats : capacity[i];
  if (total_capacity < seats)
    throw sdk::Error(SMP_ERR_INTERNAL, "dhondt: capacities hold " + std::to_string(total_capacity) + " of " +
                                           std::to_string(seats) + " seats");
  std::vector<int> alloc(n, 1);
  for (int s = n; s < seats; ++s) {
    int pick = -1;
    double best = -1;
    for (int i = 0; i < n; ++i) {
      if (!capacity.empty() && alloc[i] >= capacity[i]) continue;
      const double q = weights[i] / (alloc[i] + 1);
      if (q > best * (1 + 1e-12) + 1e-300 || pick < 0) {
        best = q;
        pick = i;
      }
    }
    ++alloc[pick];
  }
  return alloc;
}

void check_partition(const PartitionRequest& r, const std::vector<int>& stages, const char* strategy) {
  const std::string who = std::string("partition strategy '") + strategy + "': ";
  const auto& nodes = r.graph.nodes;
  if (stages.size() != nodes.size())
    throw sdk::Error(SMP_ERR_INTERNAL, who + "returned " + std::to_string(stages.size()) + " stages for " +
                                           std::to_string(nodes.size()) + " nodes");
  std::vector<int> used(r.num_stages, 0);
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (stages[i] < 0 || stages[i] >= r.num_stages)
      throw sdk::Error(who + "node " + quoted(nodes[i].name) + " is on stage " + std::to_string(stages[i]) +
                       ", outside [0, " + std::to_string(r.num_stages) + ")");
    ++used[stages[i]];
  }
  for (const auto& [src, dst] : r.graph.edges)
    if (stages[src] > stages[dst])
      throw sdk::Error(who + "edge " + quoted(nodes[src].name) + " -> " + quoted(nodes[dst].name) +
                       " would go backwards from stage " + std::to_string(stages[src]) + " to stage " +
                       std::to_string(stages[dst]));
  if (!r.tie_across_stages) {
    std::map<std::string, size_t> first;
    for (size_t i = 0; i < nodes.size(); ++i) {
      const auto& key = nodes[i].shared_key;
      if (key.empty()) continue;
      auto [it, fresh] = first.emplace(key, i);
      if (!fresh && stages[it->second] != stages[i])
        throw sdk::Error(who + "nodes " + quoted(nodes[it->second].name) + " (stage " +
                         std::to_string(stages[it->second]) + ") and " + quoted(nodes[i].name) + " (stage " +
                         std::to_string(stages[i]) + ") share key " + quoted(key) +
                         " but tie_across_stages is false: they must be on one stage");
    }
  }
  for (int s = 0; s < r.num_stages; ++s)
    if (used[s] == 0) throw sdk::Error(who + "stage " + std::to_string(s) + " gets no node");
}

}  // namespace smp::partition
