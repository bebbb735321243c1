// "tree": the SageMaker model parallelism auto-partition algorithm (Karakus et al.
// 2021, arXiv 2111.05972), over the module tree given by the dotted node names.
//
//   * The tree: node "blocks.3.mlp" is a leaf under "blocks.3" under "blocks" under
//     the root. A node whose name is also a prefix of others (e.g. "blocks.3" and
//     "blocks.3.mlp") is a leaf child of its own tree node. Children are ordered by
//     execution (their first node). A leaf costs its node's cost, an inner node the
//     sum of its leaves.
//   * Cost = w * memory + (1 - w) * compute, each term normalised so the root's
//     total is 1; w = memory_weight, else 0.8 for optimize = "memory", 0.2 for
//     "speed" (the default).
//   * Starting at the root with all num_stages devices: split the node's children,
//     in execution order, into min(#children, devices) contiguous segments
//     minimising the maximum segment cost (min-max DP); allocate the node's devices
//     to the segments in proportion to cost with d'Hondt (each segment >= 1); a
//     segment with one device takes its whole subtree; a single child with several
//     devices is recursed into; several children with several devices are recursed
//     into as a pseudo-node over those children. Devices are handed out in order,
//     so stages are contiguous and non-decreasing in execution order. The paper
//     walks the tree breadth-first; since sibling sub-problems are independent once
//     their devices are fixed, the depth-first recursion here gives the same result.
//
// Refinements of ours (the paper does not spell these cases out):
//   1. Opening heavy children. With several devices, a child whose cost exceeds one
//      device's share of its parent (cost > parent_cost / devices) and that has
//      children itself is replaced in place by its children before the split
//      (repeatedly). Without it a dominant container -- e.g. "blocks" (9/11 of a
//      transformer) next to a small "embed" and "head" -- ends up with one device
//      of two, or two of four, however unequal the costs.
//   2. Capacities. d'Hondt never gives a segment more devices than it has units
//      (nodes, or tied-node groups), so a leaf is never asked to span two devices;
//      the request-level check (>= num_stages units) makes the allocation feasible.
//   3. Interleaved subtrees. If the nodes of sibling subtrees interleave in
//      execution order (or a tied-node group spans them), the siblings are merged
//      into one unit that is split at node granularity, which keeps stages
//      non-decreasing in execution order.
#include "partition_algorithms.h"

#include <smp/sdk/host.hpp>

#include <algorithm>
#include <map>
#include <utility>

namespace smp::partition {

namespace {

struct TreeNode {
  std::string name;         // full dotted path ("" for the root)
  int graph_node = -1;      // the graph node with exactly this name, if any
  std::vector<int> kids;    // tree node indices
  int lo = 0, hi = -1;      // atom index range of the subtree
  double cost = 0;
};

// What a split operates on: a tree node (or a graph node that is a leaf child of its
// own tree node), or a contiguous range of atoms.
struct Unit {
  enum Kind { Tree, Self, Atoms } kind;
  int tree = -1;  // Tree / Self: tree node index
  int lo, hi;     // atom range
  double cost;
};

class TreePartitioner {
 public:
  explicit TreePartitioner(const PartitionRequest& r) : r_(r) {}

  std::vector<int> run() {
    validate_request(r_, "tree");
    expect_options(r_, {"optimize", "memory_weight"}, "tree");
    const double w = resolve_memory_weight(r_.options, 0.2);
    cost_ = node_costs(r_.graph, w);
    atoms_ = atoms(r_);
    check_atom_count(r_, atoms_, "tree");
    atom_of_.assign(r_.graph.nodes.size(), 0);
    atom_cost_.assign(atoms_.size(), 0.0);
    for (size_t a = 0; a < atoms_.size(); ++a)
      for (int i = atoms_[a].first; i <= atoms_[a].second; ++i) {
        atom_of_[i] = static_cast<int>(a);
        atom_cost_[a] += cost_[i];
      }
    build_tree();
    atom_stage_.assign(atoms_.size(), -1);
    place({Unit{Unit::Tree, 0, tree_[0].lo, tree_[0].hi, tree_[0].cost}}, 0, r_.num_stages);
    std::vector<int> stage(r_.graph.nodes.size());
    for (size_t i = 0; i < stage.size(); ++i) stage[i] = atom_stage_[atom_of_[i]];
    check_partition(r_, stage, "tree");
    return stage;
  }

 private:
  void build_tree() {
    tree_.push_back(TreeNode{});
    std::map<std::string, int> index{{"", 0}};
    for (int i = 0; i < static_cast<int>(r_.graph.nodes.size()); ++i) {
      const std::string& name = r_.graph.nodes[i].name;
      int cur = 0;
      size_t pos = 0;
      while (true) {
        const size_t dot = name.find('.', pos);
        const std::string path = name.substr(0, dot);
        auto it = index.find(path);
        int next;
        if (it == index.end()) {
          next = static_cast<int>(tree_.size());
          TreeNode fresh;
          fresh.name = path;
          tree_.push_back(std::move(fresh));
          index.emplace(path, next);
          tree_[cur].kids.push_back(next);
        } else {
          next = it->second;
        }
        cur = next;
        if (dot == std::string::npos) break;
        pos = dot + 1;
      }
      if (tree_[cur].graph_node >= 0)
        throw sdk::Error("partition strategy 'tree': two graph nodes are named '" + name + "'");
      tree_[cur].graph_node = i;
    }
    summarise(0);
  }

  void summarise(int t) {
    TreeNode& n = tree_[t];
    int lo = static_cast<int>(atoms_.size()), hi = -1;
    double cost = 0;
    if (n.graph_node >= 0) {
      lo = hi = atom_of_[n.graph_node];
      cost = cost_[n.graph_node];
    }
    for (int k : n.kids) {
      summarise(k);
      lo = std::min(lo, tree_[k].lo);
      hi = std::max(hi, tree_[k].hi);
      cost += tree_[k].cost;
    }
    tree_[t].lo = lo;
    tree_[t].hi = hi;
    tree_[t].cost = cost;
  }

  std::string label(const Unit& u) const {
    if (u.kind == Unit::Atoms) {
      const auto& a = atoms_[u.lo];
      const auto& b = atoms_[u.hi];
      return "'" + r_.graph.nodes[a.first].name + "' .. '" + r_.graph.nodes[b.second].name + "'";
    }
    return "'" + tree_[u.tree].name + "'";
  }

  bool openable(const Unit& u) const {
    if (u.kind == Unit::Tree) return !tree_[u.tree].kids.empty();
    if (u.kind == Unit::Atoms) return u.hi > u.lo;
    return false;
  }

  // The unit's children in execution order; siblings whose atom ranges overlap are
  // merged into one Atoms unit (refinement 3).
  std::vector<Unit> open(const Unit& u) const {
    std::vector<Unit> kids;
    if (u.kind == Unit::Atoms) {
      for (int a = u.lo; a <= u.hi; ++a) kids.push_back(Unit{Unit::Atoms, -1, a, a, atom_cost_[a]});
      return kids;
    }
    const TreeNode& n = tree_[u.tree];
    for (int k : n.kids) kids.push_back(Unit{Unit::Tree, k, tree_[k].lo, tree_[k].hi, tree_[k].cost});
    if (n.graph_node >= 0) {
      const int a = atom_of_[n.graph_node];
      kids.push_back(Unit{Unit::Self, u.tree, a, a, cost_[n.graph_node]});
    }
    std::stable_sort(kids.begin(), kids.end(), [](const Unit& x, const Unit& y) { return x.lo < y.lo; });
    std::vector<Unit> merged;
    for (const Unit& k : kids) {
      if (!merged.empty() && k.lo <= merged.back().hi) {
        Unit& m = merged.back();
        m.kind = Unit::Atoms;
        m.tree = -1;
        m.hi = std::max(m.hi, k.hi);
        m.cost += k.cost;
      } else {
        merged.push_back(k);
      }
    }
    // An Atoms unit's cost is that of its whole range (a tied atom can straddle kids).
    for (Unit& m : merged) {
      if (m.kind != Unit::Atoms) continue;
      m.cost = 0;
      for (int a = m.lo; a <= m.hi; ++a) m.cost += atom_cost_[a];
    }
    return merged;
  }

  void assign(const Unit& u, int device) {
    for (int a = u.lo; a <= u.hi; ++a) atom_stage_[a] = device;
  }

  // Places `units` (contiguous, in execution order) on devices [first, first + count).
  void place(std::vector<Unit> units, int first, int count) {
    if (count == 1) {
      for (const Unit& u : units) assign(u, first);
      return;
    }
    // A lone unit must be opened; heavy openable units are opened (refinement 1).
    for (bool changed = true; changed;) {
      changed = false;
      double total = 0;
      for (const Unit& u : units) total += u.cost;
      const double share = total / count;
      for (size_t i = 0; i < units.size(); ++i) {
        const bool lone = units.size() == 1;
        if (!lone && !(units[i].cost > share * (1 + 1e-9))) continue;
        if (!openable(units[i])) {
          if (lone)
            throw sdk::Error("partition strategy 'tree': " + label(units[i]) + " would need " +
                             std::to_string(count) + " devices but cannot be split further");
          continue;
        }
        std::vector<Unit> kids = open(units[i]);
        units.erase(units.begin() + static_cast<long>(i));
        units.insert(units.begin() + static_cast<long>(i), kids.begin(), kids.end());
        changed = true;
        break;
      }
    }
    const int segments = std::min(static_cast<int>(units.size()), count);
    std::vector<double> costs;
    for (const Unit& u : units) costs.push_back(u.cost);
    const std::vector<int> seg_of = min_max_split(costs, segments);
    std::vector<double> seg_cost(segments, 0.0);
    std::vector<int> seg_capacity(segments, 0);
    for (size_t i = 0; i < units.size(); ++i) {
      seg_cost[seg_of[i]] += units[i].cost;
      seg_capacity[seg_of[i]] += units[i].hi - units[i].lo + 1;  // refinement 2
    }
    const std::vector<int> seats = dhondt(seg_cost, count, seg_capacity);
    int device = first;
    size_t i = 0;
    for (int s = 0; s < segments; ++s) {
      std::vector<Unit> members;
      for (; i < units.size() && seg_of[i] == s; ++i) members.push_back(units[i]);
      place(std::move(members), device, seats[s]);
      device += seats[s];
    }
  }

  const PartitionRequest& r_;
  std::vector<double> cost_;
  std::vector<std::pair<int, int>> atoms_;
  std::vector<int> atom_of_;
  std::vector<double> atom_cost_;
  std::vector<TreeNode> tree_;
  std::vector<int> atom_stage_;
};

}  // namespace

std::vector<int> tree_partition(const PartitionRequest& request) { return TreePartitioner(request).run(); }

}  // namespace smp::partition
