// Partition strategies of the smp_partition plugin (plugins/partition/).
//
// Hand-computed expectations use the model `transformer()` below: an embedding
// (compute 1), six blocks of costs [1, 1, 4, 1, 1, 1], each split into equal
// "attn" and "mlp" halves, and a head (compute 1); memory = compute, so the memory
// weight doesn't matter and every cost is compute / 11.
#include "partition_algorithms.h"

#include <smp/abi.h>
#include <smp/sdk/host.hpp>

#include <gtest/gtest.h>

#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <vector>

namespace smp::partition {
namespace {

using sdk::CostGraph;
using sdk::CostNode;
using Json = nlohmann::json;

struct GraphBuilder {
  CostGraph g;
  std::map<std::string, int64_t> index;
  GraphBuilder& node(const std::string& name, double compute, double memory = -1, const std::string& key = "") {
    index[name] = static_cast<int64_t>(g.nodes.size());
    g.nodes.push_back(CostNode{name, compute, memory < 0 ? compute : memory, key});
    return *this;
  }
  GraphBuilder& edge(const std::string& a, const std::string& b) {
    g.edges.emplace_back(index.at(a), index.at(b));
    return *this;
  }
  GraphBuilder& chain() {  // an edge from each node to the next
    for (size_t i = 1; i < g.nodes.size(); ++i) g.edges.emplace_back(static_cast<int64_t>(i - 1), i);
    return *this;
  }
};

CostGraph transformer(const std::string& tie_key = "") {
  GraphBuilder b;
  b.node("embed", 1, -1, tie_key);
  const double block[] = {1, 1, 4, 1, 1, 1};
  for (int i = 0; i < 6; ++i) {
    b.node("blocks." + std::to_string(i) + ".attn", block[i] / 2);
    b.node("blocks." + std::to_string(i) + ".mlp", block[i] / 2);
  }
  b.node("head", 1, -1, tie_key);
  b.chain();
  // residual edges inside each block: attn input -> mlp
  return b.g;
}

PartitionRequest request(const CostGraph& g, int stages, Json options = Json::object(), bool tie = false) {
  PartitionRequest r;
  r.graph = g;
  r.num_stages = stages;
  r.options = std::move(options);
  r.tie_across_stages = tie;
  return r;
}

std::map<std::string, int> by_name(const CostGraph& g, const std::vector<int>& stages) {
  std::map<std::string, int> m;
  for (size_t i = 0; i < g.nodes.size(); ++i) m[g.nodes[i].name] = stages[i];
  return m;
}

// Stage costs in units of compute (memory = compute in these models).
std::vector<double> stage_compute(const CostGraph& g, const std::vector<int>& stages, int k) {
  std::vector<double> c(k, 0.0);
  for (size_t i = 0; i < g.nodes.size(); ++i) c[stages[i]] += g.nodes[i].compute;
  return c;
}

double max_of(const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); }

// Brute force: the minimal max stage compute over all contiguous splits.
double brute_force_min_max(const std::vector<double>& costs, int k) {
  const int n = static_cast<int>(costs.size());
  double best = std::numeric_limits<double>::infinity();
  std::vector<int> cuts;
  std::function<void(int, int)> rec = [&](int start, int left) {
    if (left == 1) {
      double worst = 0, acc = 0;
      int prev = 0;
      std::vector<int> all = cuts;
      all.push_back(n);
      for (int c : all) {
        acc = 0;
        for (int i = prev; i < c; ++i) acc += costs[i];
        worst = std::max(worst, acc);
        prev = c;
      }
      best = std::min(best, worst);
      return;
    }
    for (int c = start + 1; c <= n - left + 1; ++c) {
      cuts.push_back(c);
      rec(c, left - 1);
      cuts.pop_back();
    }
  };
  rec(0, k);
  return best;
}

std::vector<int> expect_valid(const std::function<std::vector<int>(const PartitionRequest&)>& fn,
                              const PartitionRequest& r) {
  std::vector<int> s = fn(r);
  EXPECT_EQ(s.size(), r.graph.nodes.size());
  EXPECT_NO_THROW(check_partition(r, s, "test"));
  return s;
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const sdk::Error& e) {
    return e.what();
  }
  return "<no error>";
}

#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << "message: " << (haystack)

// ---- building blocks ------------------------------------------------------------

TEST(PartitionBlocks, DHondt) {
  EXPECT_EQ(dhondt({5, 3, 2}, 5), (std::vector<int>{3, 1, 1}));
  EXPECT_EQ(dhondt({1, 9, 1}, 4), (std::vector<int>{1, 2, 1}));
  // Classic example: 100/80/30/20 votes, 8 seats: after the one-seat minimum,
  // quotients 50, 40, 40 (B), 33.3 (A), ... -> A 3, B 3, C 1, D 1.
  EXPECT_EQ(dhondt({100, 80, 30, 20}, 8), (std::vector<int>{3, 3, 1, 1}));
  EXPECT_EQ(dhondt({1, 1}, 2), (std::vector<int>{1, 1}));
  EXPECT_EQ(dhondt({2, 2}, 3), (std::vector<int>{2, 1}));  // tie -> lowest index
  // Capacities: a party never gets more seats than it can hold.
  EXPECT_EQ(dhondt({10, 2}, 3, {1, 2}), (std::vector<int>{1, 2}));
  EXPECT_EQ(dhondt({10, 2, 1}, 5, {2, 5, 1}), (std::vector<int>{2, 2, 1}));
  EXPECT_THROW(dhondt({1, 1, 1}, 2), sdk::Error);
  EXPECT_THROW(dhondt({1, 1}, 5, {2, 2}), sdk::Error);
}

TEST(PartitionBlocks, MinMaxSplit) {
  EXPECT_EQ(min_max_split({1, 1, 4, 1, 1, 1}, 2), (std::vector<int>{0, 0, 0, 1, 1, 1}));  // 6 | 3
  EXPECT_EQ(min_max_split({1, 1, 4, 1, 1, 1}, 3), (std::vector<int>{0, 0, 1, 2, 2, 2}));  // 2 | 4 | 3
  EXPECT_EQ(min_max_split({5}, 1), (std::vector<int>{0}));
  EXPECT_EQ(min_max_split({1, 2, 3}, 3), (std::vector<int>{0, 1, 2}));
  // Ties in the max broken by the sum of squares: 2|2|2 beats 1|3|2 etc.
  EXPECT_EQ(min_max_split({1, 1, 1, 1, 1, 1}, 3), (std::vector<int>{0, 0, 1, 1, 2, 2}));
  // Exactness against brute force on a few irregular vectors.
  const std::vector<std::vector<double>> cases = {
      {3, 1, 4, 1, 5, 9, 2, 6, 5, 3}, {0.1, 7, 0.2, 0.3, 6, 0.1, 0.1, 5}, {1, 0, 0, 0, 1}};
  for (const auto& c : cases) {
    for (int k = 1; k <= static_cast<int>(c.size()); ++k) {
      const auto part = min_max_split(c, k);
      std::vector<double> seg(k, 0.0);
      for (size_t i = 0; i < c.size(); ++i) {
        ASSERT_GE(part[i], 0);
        ASSERT_LT(part[i], k);
        if (i > 0) ASSERT_GE(part[i], part[i - 1]);
        seg[part[i]] += c[i];
      }
      EXPECT_EQ(part.front(), 0);
      EXPECT_EQ(part.back(), k - 1);  // exactly k non-empty segments
      EXPECT_NEAR(max_of(seg), brute_force_min_max(c, k), 1e-9) << "k=" << k;
    }
  }
}

TEST(PartitionBlocks, MemoryWeightAndCosts) {
  EXPECT_DOUBLE_EQ(resolve_memory_weight(Json::object(), 0.2), 0.2);
  EXPECT_DOUBLE_EQ(resolve_memory_weight({{"optimize", "memory"}}, 0.0), 0.8);
  EXPECT_DOUBLE_EQ(resolve_memory_weight({{"optimize", "speed"}}, 0.0), 0.2);
  EXPECT_DOUBLE_EQ(resolve_memory_weight({{"optimize", "memory"}, {"memory_weight", 0.5}}, 0.0), 0.5);
  EXPECT_CONTAINS(error_of([] { resolve_memory_weight({{"optimize", "fast"}}, 0); }), "'optimize'");
  EXPECT_CONTAINS(error_of([] { resolve_memory_weight({{"memory_weight", 2}}, 0); }), "'memory_weight'");
  EXPECT_CONTAINS(error_of([] { resolve_memory_weight({{"memory_weight", "x"}}, 0); }), "'memory_weight'");

  GraphBuilder b;
  b.node("a", 1, 3).node("b", 3, 1);
  auto c = node_costs(b.g, 0.25);  // 0.25 * mem/4 + 0.75 * comp/4
  EXPECT_NEAR(c[0], 0.25 * 0.75 + 0.75 * 0.25, 1e-12);
  EXPECT_NEAR(c[1], 0.25 * 0.25 + 0.75 * 0.75, 1e-12);
  EXPECT_NEAR(c[0] + c[1], 1.0, 1e-12);  // normalised: the root's total is 1
  GraphBuilder z;
  z.node("a", 0, 0).node("b", 0, 0).node("c", 0, 0);
  EXPECT_EQ(node_costs(z.g, 0.5), (std::vector<double>{1.0 / 3, 1.0 / 3, 1.0 / 3}));  // nothing measured
  GraphBuilder neg;
  neg.node("bad.node", -1, 0);
  EXPECT_CONTAINS(error_of([&] { node_costs(neg.g, 0); }), "'bad.node'");
}

TEST(PartitionBlocks, Atoms) {
  GraphBuilder b;
  b.node("a", 1).node("b", 1, -1, "k").node("c", 1).node("d", 1, -1, "k").node("e", 1, -1, "j").node("f", 1)
      .node("g", 1, -1, "j");
  auto r = request(b.g, 2);
  using P = std::pair<int, int>;
  EXPECT_EQ(atoms(r), (std::vector<P>{{0, 0}, {1, 3}, {4, 6}}));
  r.tie_across_stages = true;
  EXPECT_EQ(atoms(r).size(), 7u);
  // Overlapping ties chain together.
  GraphBuilder o;
  o.node("a", 1, -1, "x").node("b", 1, -1, "y").node("c", 1, -1, "x").node("d", 1, -1, "y").node("e", 1);
  EXPECT_EQ(atoms(request(o.g, 1)), (std::vector<P>{{0, 3}, {4, 4}}));
}

// ---- balanced -------------------------------------------------------------------

TEST(Balanced, HandComputedOptima) {
  const CostGraph g = transformer();
  {  // 2 stages: 11 -> 5 | 6 (cut inside block 2: it's a flat split over nodes)
    auto s = by_name(g, expect_valid(balanced_partition, request(g, 2)));
    EXPECT_EQ(s["blocks.2.attn"], 0);
    EXPECT_EQ(s["blocks.2.mlp"], 1);
    EXPECT_EQ(max_of(stage_compute(g, expect_valid(balanced_partition, request(g, 2)), 2)), 6);
  }
  {  // 3 stages: embed+b0+b1 = 3 | b2 = 4 | b3..head = 4 (unique optimum)
    auto st = expect_valid(balanced_partition, request(g, 3));
    EXPECT_EQ(stage_compute(g, st, 3), (std::vector<double>{3, 4, 4}));
    auto s = by_name(g, st);
    EXPECT_EQ(s["blocks.1.mlp"], 0);
    EXPECT_EQ(s["blocks.2.attn"], 1);
    EXPECT_EQ(s["blocks.2.mlp"], 1);
    EXPECT_EQ(s["blocks.3.attn"], 2);
  }
  for (int k : {2, 3, 4, 5, 8}) {  // exact against brute force
    std::vector<double> c;
    for (const auto& n : g.nodes) c.push_back(n.compute);
    auto st = expect_valid(balanced_partition, request(g, k));
    EXPECT_NEAR(max_of(stage_compute(g, st, k)), brute_force_min_max(c, k), 1e-9) << "k=" << k;
  }
  // 4 stages: optimum 3 (2.5 is infeasible: each half of block 2 costs 2).
  EXPECT_NEAR(max_of(stage_compute(g, expect_valid(balanced_partition, request(g, 4)), 4)), 3, 1e-9);
}

// A huge-parameter, cheap embedding: memory and compute disagree.
CostGraph embedding_heavy() {
  GraphBuilder b;
  b.node("embed", 1, 20);
  for (int i = 0; i < 4; ++i) b.node("blocks." + std::to_string(i), 4, 1);
  b.node("head", 1, 1);
  b.chain();
  return b.g;
}

int nodes_on_stage0(const std::vector<int>& s) { return static_cast<int>(std::count(s.begin(), s.end(), 0)); }

TEST(Balanced, MemoryVersusSpeed) {
  const CostGraph g = embedding_heavy();
  // Default: compute only, 1 + 4 + 4 | 4 + 4 + 1.
  const auto plain = expect_valid(balanced_partition, request(g, 2));
  EXPECT_EQ(plain, (std::vector<int>{0, 0, 0, 1, 1, 1}));
  // optimize = "speed" (w = 0.2): embed .204, blocks .186, head .052 -> same split.
  EXPECT_EQ(expect_valid(balanced_partition, request(g, 2, {{"optimize", "speed"}})), plain);
  // optimize = "memory" (w = 0.8): embed .651 alone.
  const auto mem = expect_valid(balanced_partition, request(g, 2, {{"optimize", "memory"}}));
  EXPECT_EQ(mem, (std::vector<int>{0, 1, 1, 1, 1, 1}));
  EXPECT_LT(nodes_on_stage0(mem), nodes_on_stage0(plain));
  EXPECT_EQ(expect_valid(balanced_partition, request(g, 2, {{"memory_weight", 1.0}})), mem);
  EXPECT_CONTAINS(error_of([&] { balanced_partition(request(g, 2, {{"optimize", "fast"}})); }), "'optimize'");
}

// ---- tree -----------------------------------------------------------------------

TEST(Tree, HandComputedOptima) {
  const CostGraph g = transformer();
  {
    // Root children embed 1 | blocks 9 | head 1 with 2 devices: blocks exceeds one
    // device's share (5.5) and is opened into its blocks; the min-max split over
    // embed, b0..b5, head is 7 | 4 (block boundaries kept: b2 isn't opened, 4 <= 5.5).
    auto st = expect_valid(tree_partition, request(g, 2));
    EXPECT_EQ(stage_compute(g, st, 2), (std::vector<double>{7, 4}));
    auto s = by_name(g, st);
    EXPECT_EQ(s["blocks.2.attn"], 0);
    EXPECT_EQ(s["blocks.2.mlp"], 0);
    EXPECT_EQ(s["blocks.3.attn"], 1);
  }
  {
    // 3 devices: share 11/3; blocks opened, then b2 (4 > 3.67) opened into attn/mlp;
    // min-max over [1, 1,1, 2,2, 1,1,1, 1] into 3 = 3 | 4 | 4, unique.
    auto st = expect_valid(tree_partition, request(g, 3));
    EXPECT_EQ(stage_compute(g, st, 3), (std::vector<double>{3, 4, 4}));
    auto s = by_name(g, st);
    EXPECT_EQ(s["blocks.1.mlp"], 0);
    EXPECT_EQ(s["blocks.2.attn"], 1);
    EXPECT_EQ(s["blocks.2.mlp"], 1);
    EXPECT_EQ(s["blocks.3.attn"], 2);
  }
  {
    // 4 devices: share 2.75; units [e1, b0 1, b1 1, b2.attn 2, b2.mlp 2, b3 1, b4 1,
    // b5 1, h1]; best max 3, two splits tie on sum of squares (2|3|3|3 and 3|2|3|3):
    // the earliest cuts win -> embed+b0 | b1+b2.attn | b2.mlp+b3 | b4+b5+head.
    auto st = expect_valid(tree_partition, request(g, 4));
    EXPECT_EQ(stage_compute(g, st, 4), (std::vector<double>{2, 3, 3, 3}));
    auto s = by_name(g, st);
    EXPECT_EQ(s["blocks.0.mlp"], 0);
    EXPECT_EQ(s["blocks.1.attn"], 1);
    EXPECT_EQ(s["blocks.1.mlp"], 1);  // block 1 not split: it's a unit at this level
    EXPECT_EQ(s["blocks.2.attn"], 1);
    EXPECT_EQ(s["blocks.2.mlp"], 2);
    EXPECT_EQ(s["blocks.4.attn"], 3);
  }
  // The tree never cuts a unit it didn't need to open: every block whose cost is
  // within a device share stays whole.
  for (int k : {2, 3, 4}) {
    auto s = by_name(g, expect_valid(tree_partition, request(g, k)));
    for (int b : {0, 1, 3, 4, 5}) {
      const std::string p = "blocks." + std::to_string(b);
      EXPECT_EQ(s[p + ".attn"], s[p + ".mlp"]) << p << " k=" << k;
    }
  }
}

TEST(Tree, DHondtGivesSeveralDevicesToAHeavySubtree) {
  // root: big (a leaf, 10) | rest (4 leaves of 0.5): 4 devices. big can't be
  // opened; rest (2) is within the share (3) so isn't opened either: 2 segments,
  // d'Hondt 4 seats -> big 1 (its capacity), rest 3, and rest recurses into its
  // 4 leaves with 3 devices: max 1 whichever segment takes two leaves; ties go to
  // the earliest cuts, so the last segment does: 0.5 | 0.5 | 0.5+0.5 (later
  // pipeline stages hold fewer in-flight microbatches, so that's the cheap side).
  GraphBuilder b;
  b.node("big", 10);
  for (int i = 0; i < 4; ++i) b.node("rest." + std::to_string(i), 0.5);
  b.chain();
  auto st = expect_valid(tree_partition, request(b.g, 4));
  EXPECT_EQ(st, (std::vector<int>{0, 1, 2, 3, 3}));
}

TEST(Tree, MemoryVersusSpeed) {
  const CostGraph g = embedding_heavy();
  // speed (w = 0.2, the default): blocks (.743) exceed the share (.5) -> opened;
  // embed+b0+b1 = .576 | .424.
  const auto speed = expect_valid(tree_partition, request(g, 2));
  EXPECT_EQ(speed, (std::vector<int>{0, 0, 0, 1, 1, 1}));
  EXPECT_EQ(expect_valid(tree_partition, request(g, 2, {{"optimize", "speed"}})), speed);
  // memory (w = 0.8): embed .651 | blocks .306 | head .043 -> embed alone.
  const auto mem = expect_valid(tree_partition, request(g, 2, {{"optimize", "memory"}}));
  EXPECT_EQ(mem, (std::vector<int>{0, 1, 1, 1, 1, 1}));
  EXPECT_LT(nodes_on_stage0(mem), nodes_on_stage0(speed));
  EXPECT_EQ(expect_valid(tree_partition, request(g, 2, {{"memory_weight", 0.9}})), mem);
}

TEST(Tree, NodeThatIsAlsoAPrefix) {
  // "enc" is a node and also the parent of "enc.0", "enc.1".
  GraphBuilder b;
  b.node("enc", 1).node("enc.0", 2).node("enc.1", 2).node("dec.0", 2).node("dec.1", 1);
  b.chain();
  for (int k : {1, 2, 3, 4, 5}) expect_valid(tree_partition, request(b.g, k));
  EXPECT_CONTAINS(error_of([&] {
                    GraphBuilder d;
                    d.node("x", 1).node("x", 1);
                    tree_partition(request(d.g, 1));
                  }),
                  "two graph nodes are named 'x'");
}

// ---- common requirements ----------------------------------------------------------

using Strategy = std::vector<int> (*)(const PartitionRequest&);
const std::vector<std::pair<const char*, Strategy>> kAuto = {{"tree", &tree_partition},
                                                             {"balanced", &balanced_partition}};

TEST(Partition, EveryStageGetsANodeAndEdgesGoForward) {
  const CostGraph g = transformer();
  for (const auto& [name, fn] : kAuto) {
    for (int k = 1; k <= static_cast<int>(g.nodes.size()); ++k) {
      SCOPED_TRACE(std::string(name) + " k=" + std::to_string(k));
      auto st = expect_valid(fn, request(g, k));
      std::vector<int> count(k, 0);
      for (int s : st) ++count[s];
      for (int c : count) EXPECT_GE(c, 1);
      EXPECT_TRUE(std::is_sorted(st.begin(), st.end()));
    }
    EXPECT_CONTAINS(error_of([&] { fn(request(g, 15)); }), "14 nodes, fewer than the 15 pipeline stages");
    EXPECT_CONTAINS(error_of([&] { fn(request(g, 0)); }), "num_stages must be >= 1");
  }
}

TEST(Partition, TiedNodesMerged) {
  // Tied embedding / head with tie_across_stages = false: the whole model is one unit.
  const CostGraph tied = transformer("wte");
  for (const auto& [name, fn] : kAuto) {
    SCOPED_TRACE(name);
    const std::string msg = error_of([&] { fn(request(tied, 2)); });
    EXPECT_CONTAINS(msg, "'wte' ties 'embed' .. 'head'");
    EXPECT_CONTAINS(msg, "1 unit(s) of 14 nodes for 2 stages");
    expect_valid(fn, request(tied, 1));
    // Allowed across stages: normal split.
    auto st = expect_valid(fn, request(tied, 2, Json::object(), /*tie=*/true));
    EXPECT_NE(st.front(), st.back());
  }
  // A key shared by blocks.1.mlp and blocks.3.attn pins blocks.1.mlp .. blocks.3.attn together.
  CostGraph g = transformer();
  auto find = [&](const std::string& n) {
    for (auto& node : g.nodes)
      if (node.name == n) return &node;
    return static_cast<CostNode*>(nullptr);
  };
  find("blocks.1.mlp")->shared_key = "adapter";
  find("blocks.3.attn")->shared_key = "adapter";
  for (const auto& [name, fn] : kAuto) {
    for (int k : {2, 3, 4, 5}) {
      SCOPED_TRACE(std::string(name) + " k=" + std::to_string(k));
      auto s = by_name(g, expect_valid(fn, request(g, k)));
      const int pinned = s["blocks.1.mlp"];
      for (const char* n : {"blocks.2.attn", "blocks.2.mlp", "blocks.3.attn"}) EXPECT_EQ(s[n], pinned) << n;
    }
  }
  // balanced: the merged unit (b1.mlp .5 + b2 4 + b3.attn .5 = 5 of 11) is
  // indivisible, so 2 stages give 2.5 | 8.5 or 7.5 | 3.5: the optimum is 7.5
  // (6 without the tie).
  auto st = expect_valid(balanced_partition, request(g, 2));
  EXPECT_NEAR(max_of(stage_compute(g, st, 2)), 7.5, 1e-9);
  EXPECT_NEAR(max_of(stage_compute(g, expect_valid(balanced_partition, request(g, 2, Json::object(), true)), 2)),
              6, 1e-9);
}

// inputs -> towerA.*, towerB.* -> concat -> head, plus a skip connection inputs -> concat.
CostGraph two_towers(bool interleaved) {
  GraphBuilder b;
  b.node("inputs", 1);
  if (interleaved) {
    b.node("towerA.0", 2).node("towerB.0", 1).node("towerA.1", 2).node("towerB.1", 1).node("towerB.2", 1);
  } else {
    b.node("towerA.0", 2).node("towerA.1", 2).node("towerB.0", 1).node("towerB.1", 1).node("towerB.2", 1);
  }
  b.node("concat", 0.5).node("head", 1.5);
  b.edge("inputs", "towerA.0").edge("towerA.0", "towerA.1").edge("towerA.1", "concat");
  b.edge("inputs", "towerB.0").edge("towerB.0", "towerB.1").edge("towerB.1", "towerB.2").edge("towerB.2", "concat");
  b.edge("inputs", "concat").edge("concat", "head").edge("inputs", "head");
  return b.g;
}

TEST(Partition, TwoTowerDagIsMonotone) {
  for (bool interleaved : {false, true}) {
    const CostGraph g = two_towers(interleaved);
    for (const auto& [name, fn] : kAuto) {
      for (int k = 1; k <= 8; ++k) {
        SCOPED_TRACE(std::string(name) + (interleaved ? " interleaved" : "") + " k=" + std::to_string(k));
        auto st = expect_valid(fn, request(g, k));  // checks edges, non-empty stages
        for (const auto& [src, dst] : g.edges) EXPECT_LE(st[src], st[dst]);
        EXPECT_TRUE(std::is_sorted(st.begin(), st.end()));
      }
    }
  }
  // Tree on the non-interleaved DAG with 2 stages: root children inputs 1 |
  // towerA 4 | towerB 3 | concat .5 | head 1.5 (total 10, share 5): 5 | 5.
  const CostGraph g = two_towers(false);
  auto s = by_name(g, expect_valid(tree_partition, request(g, 2)));
  EXPECT_EQ(s["towerA.1"], 0);
  EXPECT_EQ(s["towerB.0"], 1);
}

TEST(Partition, RejectsBadGraphs) {
  GraphBuilder b;
  b.node("a", 1).node("b", 1).node("c", 1);
  b.edge("b", "a");  // against the execution order
  for (const auto& [name, fn] : kAuto)
    EXPECT_CONTAINS(error_of([&] { fn(request(b.g, 2)); }), "edge 'b' -> 'a' goes against the execution order");
  GraphBuilder o;
  o.node("a", 1).node("b", 1);
  o.g.edges.emplace_back(0, 7);
  EXPECT_CONTAINS(error_of([&] { balanced_partition(request(o.g, 1)); }), "outside [0, 2)");
}

// ---- manual ---------------------------------------------------------------------

TEST(Manual, LongestDottedPrefixWins) {
  const CostGraph g = transformer();
  Json opts = {{"manual", {{"embed", 0}, {"blocks", 1}, {"blocks.0", 0}, {"blocks.1.attn", 0}, {"head", 1}}}};
  auto s = by_name(g, expect_valid(manual_partition, request(g, 2, opts)));
  EXPECT_EQ(s["embed"], 0);
  EXPECT_EQ(s["blocks.0.attn"], 0);
  EXPECT_EQ(s["blocks.0.mlp"], 0);
  EXPECT_EQ(s["blocks.1.attn"], 0);  // exact name
  EXPECT_EQ(s["blocks.1.mlp"], 1);   // falls back to "blocks"
  EXPECT_EQ(s["blocks.5.mlp"], 1);
  EXPECT_EQ(s["head"], 1);

  // "blocks.1" matches "blocks.1" and "blocks.1.x", never "blocks.10".
  GraphBuilder b;
  b.node("blocks.0", 1).node("blocks.1", 1).node("blocks.1.x", 1).node("blocks.10", 1).node("blocks.11", 1);
  b.chain();
  Json o2 = {{"manual", {{"blocks", 2}, {"blocks.0", 0}, {"blocks.1", 1}}}};
  EXPECT_EQ(expect_valid(manual_partition, request(b.g, 3, o2)), (std::vector<int>{0, 1, 1, 2, 2}));
  Json o3 = {{"manual", {{"blocks.0", 0}, {"blocks.1", 1}, {"blocks.10", 2}, {"blocks.11", 2}}}};
  EXPECT_EQ(expect_valid(manual_partition, request(b.g, 3, o3)), (std::vector<int>{0, 1, 1, 2, 2}));
}

TEST(Manual, ErrorsNameTheNodeOrPrefix) {
  const CostGraph g = transformer();
  auto run = [&](Json manual, int k = 2) { return error_of([&] { manual_partition(request(g, k, manual)); }); };
  EXPECT_CONTAINS(run(Json::object()), "needs the option 'manual'");
  EXPECT_CONTAINS(run({{"manual", Json::object()}}), "non-empty table");
  EXPECT_CONTAINS(run({{"manual", {{"embed", 0}, {"blocks", 1}}}}), "node 'head' matches no prefix");
  // "block" is not a dotted prefix of "blocks.0.attn".
  EXPECT_CONTAINS(run({{"manual", {{"embed", 0}, {"block", 1}, {"head", 1}}}}),
                  "node 'blocks.0.attn' matches no prefix");
  EXPECT_CONTAINS(run({{"manual", {{"embed", 0}, {"blocks", 7}, {"head", 1}}}}),
                  "manual.blocks = 7 is outside the stages [0, 2)");
  EXPECT_CONTAINS(run({{"manual", {{"embed", 0}, {"blocks", -1}, {"head", 1}}}}), "manual.blocks = -1");
  EXPECT_CONTAINS(run({{"manual", {{"embed", 0}, {"blocks", "one"}, {"head", 1}}}}),
                  "manual.blocks must be an integer stage");
  EXPECT_CONTAINS(run({{"manual", {{"embed", 1}, {"blocks", 0}, {"head", 1}}}}),
                  "edge 'embed' -> 'blocks.0.attn' would go backwards from stage 1 to stage 0");
  EXPECT_CONTAINS(run({{"manual", {{"embed", 0}, {"blocks", 0}, {"head", 0}}}}), "stage 1 gets no node");
  // Tied nodes split across stages.
  const CostGraph tied = transformer("wte");
  const std::string msg = error_of([&] {
    manual_partition(request(tied, 2, {{"manual", {{"embed", 0}, {"blocks", 0}, {"head", 1}}}}));
  });
  EXPECT_CONTAINS(msg, "share key 'wte'");
  EXPECT_CONTAINS(msg, "'embed' (stage 0)");
  // ... which is fine when ties may cross stages.
  expect_valid(manual_partition,
               request(tied, 2, {{"manual", {{"embed", 0}, {"blocks", 0}, {"head", 1}}}}, /*tie=*/true));
}

// ---- the built plugin, through the ABI ---------------------------------------------

struct FakeError {
  smp_error_code code;
  std::string message;
};
smp_error* fake_error_create(smp_error_code code, const char* message) {
  return reinterpret_cast<smp_error*>(new FakeError{code, message ? message : ""});
}
smp_error_code fake_error_code(const smp_error* e) { return reinterpret_cast<const FakeError*>(e)->code; }
const char* fake_error_message(const smp_error* e) {
  return reinterpret_cast<const FakeError*>(e)->message.c_str();
}
void fake_error_destroy(smp_error* e) { delete reinterpret_cast<FakeError*>(e); }

TEST(PartitionPlugin, LoadsAndPartitionsThroughTheAbi) {
  const std::string path = std::string(SMP_PLUGIN_DIR) + "/smp_partition.so";
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(lib, nullptr) << dlerror();
  using Entry = const smp_plugin_descriptor* (*)(const smp_host_api*, smp_error**);
  auto entry = reinterpret_cast<Entry>(dlsym(lib, SMP_PLUGIN_ENTRY_SYMBOL));
  ASSERT_NE(entry, nullptr);

  smp_host_api host{};
  host.struct_size = sizeof(host);
  host.abi_major = SMP_ABI_VERSION_MAJOR;
  host.abi_minor = SMP_ABI_VERSION_MINOR;
  host.torch_version = "";
  host.error_create = &fake_error_create;
  host.error_code = &fake_error_code;
  host.error_message = &fake_error_message;
  host.error_destroy = &fake_error_destroy;
  smp_error* err = nullptr;
  const smp_plugin_descriptor* d = entry(&host, &err);
  ASSERT_NE(d, nullptr);
  ASSERT_EQ(err, nullptr);
  EXPECT_STREQ(d->name, "smp_partition");
  std::map<std::string, const smp_partition_strategy*> strategies;
  for (size_t i = 0; i < d->n_partitioners; ++i) strategies[d->partitioners[i]->name] = d->partitioners[i];
  ASSERT_EQ(strategies.size(), 3u);
  ASSERT_TRUE(strategies.count("tree") && strategies.count("balanced") && strategies.count("manual"));

  // The transformer model over the C structs.
  const CostGraph g = transformer();
  std::vector<smp_cost_node> nodes;
  for (const auto& n : g.nodes) {
    smp_cost_node c{};
    c.struct_size = SMP_COST_NODE_STRUCT_SIZE;
    c.name = n.name.c_str();
    c.compute = n.compute;
    c.memory = n.memory;
    c.shared_key = nullptr;
    nodes.push_back(c);
  }
  std::vector<int64_t> src, dst;
  for (const auto& [a, b] : g.edges) {
    src.push_back(a);
    dst.push_back(b);
  }
  smp_cost_graph cg{};
  cg.struct_size = SMP_COST_GRAPH_STRUCT_SIZE;
  cg.nodes = nodes.data();
  cg.n_nodes = nodes.size();
  cg.edge_src = src.data();
  cg.edge_dst = dst.data();
  cg.n_edges = src.size();
  std::vector<int32_t> out(nodes.size(), -1);
  smp_partition_request req{};
  req.struct_size = SMP_PARTITION_REQUEST_STRUCT_SIZE;
  req.graph = &cg;
  req.num_stages = 3;
  req.options_json = "{}";
  req.tie_across_stages = 0;
  req.stage_of_node = out.data();

  const smp_partition_strategy* tree = strategies["tree"];
  ASSERT_EQ(tree->partition(tree->state, &req), nullptr);
  EXPECT_EQ(std::vector<int>(out.begin(), out.end()), tree_partition(request(g, 3)));

  const smp_partition_strategy* manual = strategies["manual"];
  req.options_json = R"({"manual": {"embed": 0, "blocks": 1}})";
  smp_error* e = manual->partition(manual->state, &req);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(fake_error_code(e), SMP_ERR_INVALID_ARGUMENT);
  EXPECT_CONTAINS(fake_error_message(e), "node 'head' matches no prefix");
  fake_error_destroy(e);
  // Not dlclose'd: the plugin keeps its descriptor in statics (as the host does).
}

}  // namespace
}  // namespace smp::partition
