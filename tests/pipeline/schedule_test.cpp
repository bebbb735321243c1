// Pipeline schedules as data (core/src/schedule/schedule.cpp) and their simulator
// (core/src/schedule/schedule_simulator.cpp).
//
// Unit-cost conventions behind the bubble formulas checked here
// (bubble_ratio = (makespan - ideal) / ideal, ideal = per-rank compute time):
//   * GPipe, 1F1B: (p-1)/m. Exact for any forward/backward costs (the test uses
//     F=1, B=2 and F=1, B=1): makespan = (m+p-1)(F+B), ideal = m(F+B).
//   * Interleaved 1F1B with v chunks per rank: (p-1)/(v*m) when every chunk costs
//     F, B (i.e. a chunk is 1/v of the rank's layers, so the per-rank time is v*m*(F+B));
//     makespan = (v*m + p - 1)(F+B). Exact for any F:B (the test uses F=1, B=2 per
//     chunk and F=1, B=1); requires m % p == 0 as in Megatron.
//   * ZB-H1 (Qi et al. 2024, §2.1 / Table: "(p-1)/3m" at T_F = T_B = T_W): with
//     F = BI = BW = 1 and m >= p the bubble is (p-1)(F+B-W) against 1F1B's
//     (p-1)(F+B+W), i.e. bubble_ratio = (p-1)(F+B-W)/(m(F+B+W)) = (p-1)/(3m).
//     The same expression is exact for other costs with W <= min(F, B) (checked
//     with F=2, B=W=1 and F=1, B=1.5, W=0.5); it is not a formula for W > B.
//     For m < p no schedule can reach it: microbatch m-1's forward and input
//     backward chains plus stage 0's last BW give makespan >= 2p - 1 + 2m, so with
//     unit costs makespan = 3m + (p-1) + (p-m) and the ratio is (2p-1-m)/(3m); our
//     ZB-H1 attains that bound (checked below).
//     Costs are simulated as the executor runs them (zero_bubble_costs in
//     schedule_simulator.h): the first stage has no input gradient, so its BI
//     costs 0 and its BW is its whole backward, BI + BW.
#include <smp/error.h>

#include "schedule/schedule.h"
#include "schedule/schedule_simulator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <tuple>
#include <vector>

namespace smp {
namespace {

struct Config {
  std::string name;
  int p, m, v;
};

std::string label(const Config& c) {
  return c.name + " p=" + std::to_string(c.p) + " m=" + std::to_string(c.m) + " v=" + std::to_string(c.v);
}

// Every valid (schedule, stages, microbatches, chunks) of the brief's grid.
std::vector<Config> grid() {
  std::vector<Config> out;
  for (const auto& name : schedule_names())
    for (int p : {1, 2, 3, 4})
      for (int m : {1, 2, 4, 8})
        for (int v : {1, 2}) {
          const bool valid = v == 1 || (name == "interleaved-1f1b" && p >= 2 && m % p == 0);
          if (valid) out.push_back({name, p, m, v});
        }
  return out;
}

ZbPlanCosts plan_costs(int p, double f, double bi, double bw, bool first_stage_unsplit) {
  ZbPlanCosts c;
  c.forward.assign(p, f);
  c.backward_input.assign(p, bi);
  c.backward_weight.assign(p, bw);
  if (first_stage_unsplit) {
    c.backward_input[0] = 0;
    c.backward_weight[0] = bi + bw;
  }
  return c;
}

// Most microbatches forwarded and not yet weight-backwarded on a rank: what a
// stage whose whole backward is its BW (the first) keeps alive.
int peak_forwarded_not_weighted(const Schedule& s, int rank) {
  int f = 0, w = 0, peak = 0;
  for (const Action& a : s.actions[rank]) {
    f += a.op == Op::Forward;
    w += a.op == Op::BackwardWeight;
    peak = std::max(peak, f - w);
  }
  return peak;
}

SimCosts unit_costs() {
  SimCosts c;
  c.forward = 1;
  c.backward = 2;
  c.backward_input = 1;
  c.backward_weight = 1;
  return c;
}

int count(const Schedule& s, int rank, Op op) {
  return static_cast<int>(std::count_if(s.actions[rank].begin(), s.actions[rank].end(),
                                        [&](const Action& a) { return a.op == op; }));
}

TEST(Schedule, GridSimulatesWithoutErrors) {
  int n = 0;
  for (const auto& c : grid()) {
    SCOPED_TRACE(label(c));
    Schedule s = make_schedule(c.name, c.p, c.m, c.v);
    EXPECT_EQ(s.name, c.name);
    EXPECT_EQ(s.stages, c.p);
    EXPECT_EQ(s.microbatches, c.m);
    EXPECT_EQ(s.chunks, c.v);
    ASSERT_EQ(static_cast<int>(s.actions.size()), c.p);
    SimResult r = simulate(s, unit_costs());
    EXPECT_TRUE(r.ok) << r.error << "\n" << to_string(s);
    EXPECT_TRUE(r.error.empty());
    ++n;
  }
  EXPECT_EQ(n, 4 * 4 * 4 + 5);  // 4 schedules x 16 (p, m) with v = 1, plus 5 interleaved with v = 2
}

// Sends and receives pair up: per (src, dst, kind) channel, the sequence of
// (microbatch, sender virtual stage) sent equals the sequence received.
TEST(Schedule, SendsMatchReceivesPerChannel) {
  for (const auto& c : grid()) {
    SCOPED_TRACE(label(c));
    Schedule s = make_schedule(c.name, c.p, c.m, c.v);
    std::map<std::tuple<int, int, int>, std::vector<std::pair<int, int>>> sent, received;
    for (int r = 0; r < c.p; ++r) {
      for (const Action& a : s.actions[r]) {
        const int vs = s.virtual_stage(r, a.chunk);
        switch (a.op) {
          case Op::SendActivation: sent[{r, a.peer, 0}].push_back({a.microbatch, vs}); break;
          case Op::SendGrad: sent[{r, a.peer, 1}].push_back({a.microbatch, vs}); break;
          case Op::RecvActivation: received[{a.peer, r, 0}].push_back({a.microbatch, vs - 1}); break;
          case Op::RecvGrad: received[{a.peer, r, 1}].push_back({a.microbatch, vs + 1}); break;
          default:
            EXPECT_EQ(a.peer, -1) << to_string(a);
        }
      }
    }
    EXPECT_EQ(sent, received);
    // 2 * m * (S - 1) messages in all: one activation and one gradient per boundary.
    size_t total = 0;
    for (const auto& [k, v] : sent) total += v.size();
    EXPECT_EQ(total, static_cast<size_t>(2 * c.m * (c.p * c.v - 1)));
  }
}

// Receives right before the compute that consumes them, sends right after the
// compute that produces them; compute counts per rank.
TEST(Schedule, CommPlacementAndComputeCounts) {
  for (const auto& c : grid()) {
    SCOPED_TRACE(label(c));
    Schedule s = make_schedule(c.name, c.p, c.m, c.v);
    const int S = s.num_virtual_stages();
    const bool zb = c.name == "zb-h1";
    for (int r = 0; r < c.p; ++r) {
      const auto& acts = s.actions[r];
      EXPECT_EQ(count(s, r, Op::Forward), c.m * c.v);
      EXPECT_EQ(count(s, r, Op::Backward), zb ? 0 : c.m * c.v);
      EXPECT_EQ(count(s, r, Op::BackwardInput), zb ? c.m * c.v : 0);
      EXPECT_EQ(count(s, r, Op::BackwardWeight), zb ? c.m * c.v : 0);
      for (size_t i = 0; i < acts.size(); ++i) {
        const Action& a = acts[i];
        const int vs = s.virtual_stage(r, a.chunk);
        auto is = [&](size_t j, Op op) {
          return j < acts.size() && acts[j].op == op && acts[j].microbatch == a.microbatch &&
                 acts[j].chunk == a.chunk;
        };
        if (a.op == Op::Forward) {
          if (vs > 0) EXPECT_TRUE(i > 0 && is(i - 1, Op::RecvActivation)) << "rank " << r << " #" << i;
          if (vs < S - 1) EXPECT_TRUE(is(i + 1, Op::SendActivation)) << "rank " << r << " #" << i;
        }
        if (a.op == Op::Backward || a.op == Op::BackwardInput) {
          if (vs < S - 1) EXPECT_TRUE(i > 0 && is(i - 1, Op::RecvGrad)) << "rank " << r << " #" << i;
          if (vs > 0) EXPECT_TRUE(is(i + 1, Op::SendGrad)) << "rank " << r << " #" << i;
        }
        if (a.op == Op::RecvActivation) EXPECT_TRUE(is(i + 1, Op::Forward));
        if (a.op == Op::SendActivation) EXPECT_TRUE(i > 0 && is(i - 1, Op::Forward));
        if (a.op == Op::RecvGrad) EXPECT_TRUE(is(i + 1, zb ? Op::BackwardInput : Op::Backward));
        if (a.op == Op::SendGrad) EXPECT_TRUE(i > 0 && is(i - 1, zb ? Op::BackwardInput : Op::Backward));
      }
    }
  }
}

TEST(Schedule, BubbleFormulas) {
  for (const auto& c : grid()) {
    SCOPED_TRACE(label(c));
    const double p = c.p, m = c.m, v = c.v;
    Schedule s = make_schedule(c.name, c.p, c.m, c.v);
    if (c.name == "zb-h1") {
      SimResult r = simulate(s, zero_bubble_costs(c.p, 1, 1, 1));  // F = BI = BW = 1
      ASSERT_TRUE(r.ok) << r.error;
      const double expected = c.m >= c.p ? (p - 1) / (3 * m) : (2 * p - 1 - m) / (3 * m);
      EXPECT_NEAR(r.bubble_ratio, expected, 1e-12);
      EXPECT_NEAR(r.makespan, 3 * m + (p - 1) + std::max(0.0, p - m), 1e-12);
      continue;
    }
    for (double b : {2.0, 1.0}) {
      SimCosts costs;
      costs.forward = 1;
      costs.backward = b;
      SimResult r = simulate(s, costs);
      ASSERT_TRUE(r.ok) << r.error;
      EXPECT_NEAR(r.bubble_ratio, (p - 1) / (v * m), 1e-12) << "B=" << b;
      EXPECT_NEAR(r.makespan, (v * m + p - 1) * (1 + b), 1e-12) << "B=" << b;
      for (double busy : r.busy) EXPECT_NEAR(busy, v * m * (1 + b), 1e-12);
      // bubble_fraction: every rank is idle (p-1)(F+B) of the makespan.
      EXPECT_NEAR(r.bubble_fraction, (p - 1) / (v * m + p - 1), 1e-12) << "B=" << b;
    }
  }
}

// The paper's ZB-H1 expression for non-unit costs with W <= min(F, B), and ZB-H1
// never slower than 1F1B (same costs, 1F1B's B = BI + BW) on a wider grid; the
// default plan and one planned for the simulated costs. Memory: 1F1B's in-flight
// bound on every rank but the first, and on every rank at most p (1F1B's peak,
// the first stage's) microbatches forwarded and not weight-backwarded.
TEST(Schedule, ZeroBubbleH1AgainstOneFOneB) {
  const double costs[][3] = {{1, 1, 1}, {2, 1, 1}, {1, 1.5, 0.5}, {1, 0.5, 1.5}, {1, 2, 2}};
  for (const auto& fbw : costs) {
    const double F = fbw[0], B = fbw[1], W = fbw[2];
    for (int p : {1, 2, 3, 4, 5, 6, 8}) {
      for (int m : {1, 2, 3, 4, 6, 8, 12, 16}) {
        const SimCosts c = zero_bubble_costs(p, F, B, W);
        const SimResult ob = simulate(make_schedule("1f1b", p, m), c);
        ASSERT_TRUE(ob.ok) << ob.error;
        for (bool planned : {false, true}) {
          SCOPED_TRACE("F=" + std::to_string(F) + " BI=" + std::to_string(B) + " BW=" + std::to_string(W) +
                       " p=" + std::to_string(p) + " m=" + std::to_string(m) + (planned ? " planned" : " default"));
          const Schedule s =
              planned ? make_zb_h1_schedule(p, m, plan_costs(p, F, B, W, true)) : make_schedule("zb-h1", p, m);
          const SimResult zb = simulate(s, c);
          ASSERT_TRUE(zb.ok) << zb.error;
          EXPECT_LE(zb.makespan, ob.makespan + 1e-12);
          if (m >= p && W <= std::min(F, B))
            EXPECT_NEAR(zb.makespan, m * (F + B + W) + (p - 1) * (F + B - W), 1e-12);
          for (int r = 1; r < p; ++r) EXPECT_LE(zb.peak_in_flight[r], ob.peak_in_flight[r]) << "rank " << r;
          for (int r = 0; r < p; ++r) EXPECT_LE(peak_forwarded_not_weighted(s, r), std::min(p, m)) << "rank " << r;
        }
      }
    }
  }
}

// The planner is not tied to the first stage's costs: planned for stages that
// all split their backward (and simulated so), ZB-H1 reaches the same bubble.
TEST(Schedule, ZeroBubbleH1PlannedForEveryStageSplitting) {
  for (int p : {2, 3, 4, 8})
    for (int m : {4, 8, 16}) {
      if (m < p) continue;
      SCOPED_TRACE("p=" + std::to_string(p) + " m=" + std::to_string(m));
      SimResult r = simulate(make_zb_h1_schedule(p, m, plan_costs(p, 1, 1, 1, false)), unit_costs());
      ASSERT_TRUE(r.ok) << r.error;
      EXPECT_NEAR(r.makespan, 3 * m + (p - 1), 1e-12);
    }
}

// F and BI keep 1F1B's order. Preferring a ready BI over a ready F (as this
// generator once did) put BI2 before F3 here and made the step 15 units, not
// the 14 of (p-1)(F+B-W) + m(F+B+W) at unit costs.
TEST(Schedule, ZeroBubbleH1KeepsOneFOneBOrder) {
  const Schedule s = make_schedule("zb-h1", 3, 4);
  std::vector<std::string> rank1;
  for (const Action& a : s.actions[1])
    if (a.op == Op::Forward || a.op == Op::BackwardInput) rank1.push_back(to_string(a));
  EXPECT_EQ(rank1, (std::vector<std::string>{"F0", "F1", "BI0", "F2", "BI1", "F3", "BI2", "BI3"}));
  EXPECT_NEAR(simulate(s, zero_bubble_costs(3, 1, 1, 1)).makespan, 14, 1e-12);
}

TEST(Schedule, PeakInFlight) {
  for (const auto& c : grid()) {
    SCOPED_TRACE(label(c));
    SimResult r = simulate(make_schedule(c.name, c.p, c.m, c.v), unit_costs());
    ASSERT_TRUE(r.ok) << r.error;
    ASSERT_EQ(static_cast<int>(r.peak_in_flight.size()), c.p);
    for (int rank = 0; rank < c.p; ++rank) {
      const int got = r.peak_in_flight[rank];
      if (c.name == "gpipe") {
        EXPECT_EQ(got, c.m) << "rank " << rank;
      } else if (c.name == "1f1b" || (c.name == "interleaved-1f1b" && c.v == 1)) {
        EXPECT_EQ(got, std::min(c.p - rank, c.m)) << "rank " << rank;
      } else if (c.name == "zb-h1") {
        EXPECT_LE(got, std::min(c.p - rank, c.m)) << "rank " << rank;
        EXPECT_GE(got, 1);
      } else {  // interleaved, v > 1: Megatron's warm-up + 1, (microbatch, chunk) pairs
        EXPECT_EQ(got, std::min(2 * (c.p - rank - 1) + (c.v - 1) * c.p + 1, c.m * c.v)) << "rank " << rank;
      }
    }
  }
}

TEST(Schedule, OneFOneBOrderOnRankZero) {
  // p=3, m=4, rank 0: 2 warm-up forwards, then F/B alternating, then cool-down.
  Schedule s = make_schedule("1f1b", 3, 4);
  std::vector<std::string> compute;
  for (const Action& a : s.actions[0])
    if (is_compute(a.op)) compute.push_back(to_string(a));
  EXPECT_EQ(compute, (std::vector<std::string>{"F0", "F1", "F2", "B0", "F3", "B1", "B2", "B3"}));
  // Last rank: no warm-up.
  compute.clear();
  for (const Action& a : s.actions[2])
    if (is_compute(a.op)) compute.push_back(to_string(a));
  EXPECT_EQ(compute, (std::vector<std::string>{"F0", "B0", "F1", "B1", "F2", "B2", "F3", "B3"}));
}

TEST(Schedule, InterleavedDepthFirstOrder) {
  // p=2, m=4, v=2, rank 0: forwards go through chunk 0 then chunk 1 in groups of p.
  Schedule s = make_schedule("interleaved-1f1b", 2, 4, 2);
  std::vector<std::string> fwd;
  for (const Action& a : s.actions[0])
    if (a.op == Op::Forward) fwd.push_back(to_string(a));
  EXPECT_EQ(fwd, (std::vector<std::string>{"F0", "F1", "F0.c1", "F1.c1", "F2", "F3", "F2.c1", "F3.c1"}));
  // Virtual stage layout and the wrap-around channel rank 1 -> rank 0.
  EXPECT_EQ(s.virtual_stage(1, 0), 1);
  EXPECT_EQ(s.virtual_stage(0, 1), 2);
  EXPECT_EQ(s.actions[1][1], (Action{Op::Forward, 0, 0, -1}));
  bool wraps = false;
  for (const Action& a : s.actions[1])
    wraps = wraps || (a.op == Op::SendActivation && a.chunk == 0 && a.peer == 0);
  EXPECT_TRUE(wraps);
}

TEST(Schedule, ZeroBubbleH1Shape) {
  // Every BW after its BI; the first rank defers no more than the last rank in
  // the tail (W fills 1F1B's end bubble on the last stages).
  Schedule s = make_schedule("zb-h1", 4, 8);
  for (int r = 0; r < 4; ++r) {
    std::vector<bool> bi(8, false);
    for (const Action& a : s.actions[r]) {
      if (a.op == Op::BackwardInput) bi[a.microbatch] = true;
      if (a.op == Op::BackwardWeight) EXPECT_TRUE(bi[a.microbatch]) << "rank " << r;
    }
  }
  auto trailing_w = [&](int r) {
    int n = 0;
    for (auto it = s.actions[r].rbegin(); it != s.actions[r].rend() && it->op == Op::BackwardWeight; ++it) ++n;
    return n;
  };
  EXPECT_GE(trailing_w(3), trailing_w(0));
  EXPECT_GE(trailing_w(3), 2);
}

TEST(Schedule, CommLatencyDelaysButStaysValid) {
  for (const auto& c : grid()) {
    if (c.p == 1) continue;
    SCOPED_TRACE(label(c));
    Schedule s = make_schedule(c.name, c.p, c.m, c.v);
    SimCosts slow = unit_costs();
    slow.comm = 0.25;
    SimResult a = simulate(s, unit_costs()), b = simulate(s, slow);
    ASSERT_TRUE(b.ok) << b.error;
    EXPECT_GT(b.makespan, a.makespan);
    // The forward and backward chains of one microbatch pay the latency 2(S-1) times.
    const int S = c.p * c.v;
    EXPECT_GE(b.makespan, S * 1.0 + S * 1.0 + 0.25 * 2 * (S - 1) - 1e-9);
  }
  // Exact single-microbatch case: GPipe p=2, m=1: F, comm, F, B, comm, B.
  SimCosts c = unit_costs();
  c.comm = 0.5;
  SimResult r = simulate(make_schedule("gpipe", 2, 1), c);
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_DOUBLE_EQ(r.makespan, 1 + 0.5 + 1 + 2 + 0.5 + 2);
}

TEST(Schedule, BadArgumentsNameTheProblem) {
  auto message = [](auto&& f) -> std::string {
    try {
      f();
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(message([] { make_schedule("interleaved-1f1b", 4, 6, 2); }).find("multiple of stages"),
            std::string::npos);
  EXPECT_NE(message([] { make_schedule("1f1b", 4, 8, 2); }).find("chunks > 1"), std::string::npos);
  EXPECT_NE(message([] { make_schedule("gpipe", 2, 4, 2); }).find("chunks > 1"), std::string::npos);
  EXPECT_NE(message([] { make_schedule("zb-h1", 2, 4, 2); }).find("chunks > 1"), std::string::npos);
  EXPECT_NE(message([] { make_zb_h1_schedule(2, 4, plan_costs(3, 1, 1, 1, true)); }).find("one forward"),
            std::string::npos);
  ZbPlanCosts zero_forward = plan_costs(2, 1, 1, 1, true);
  zero_forward.forward[1] = 0;
  EXPECT_NE(message([&] { make_zb_h1_schedule(2, 4, zero_forward); }).find("stage 1"), std::string::npos);
  ZbPlanCosts negative_comm = plan_costs(2, 1, 1, 1, true);
  negative_comm.comm = -1;
  EXPECT_NE(message([&] { make_zb_h1_schedule(2, 4, negative_comm); }).find("comm"), std::string::npos);
  EXPECT_NE(message([] { make_zb_h1_schedule(2, 0, plan_costs(2, 1, 1, 1, true)); }).find("microbatches"),
            std::string::npos);
  EXPECT_NE(message([] { make_schedule("interleaved-1f1b", 1, 4, 2); }).find("stages >= 2"), std::string::npos);
  EXPECT_NE(message([] { make_schedule("1f1b", 0, 4); }).find("stages must be >= 1"), std::string::npos);
  EXPECT_NE(message([] { make_schedule("1f1b", 2, 0); }).find("microbatches must be >= 1"), std::string::npos);
  EXPECT_NE(message([] { make_schedule("gpipe", 2, 2, 0); }).find("chunks must be >= 1"), std::string::npos);
  const std::string unknown = message([] { make_schedule("pipedream", 2, 2); });
  EXPECT_NE(unknown.find("unknown schedule"), std::string::npos);
  EXPECT_NE(unknown.find("'pipedream'"), std::string::npos);
  EXPECT_NE(unknown.find("zb-h1"), std::string::npos);
  // interleaved with one chunk is plain 1F1B, without the divisibility constraint.
  Schedule a = make_schedule("interleaved-1f1b", 4, 6, 1), b = make_schedule("1f1b", 4, 6);
  EXPECT_EQ(a.actions, b.actions);
}

TEST(Schedule, ToStringIsReadable) {
  Schedule s = make_schedule("1f1b", 2, 2);
  const std::string text = to_string(s);
  EXPECT_NE(text.find("schedule 1f1b stages=2 microbatches=2 chunks=1"), std::string::npos) << text;
  EXPECT_NE(text.find("rank 0: F0 send_act0>1 F1 send_act1>1 recv_grad0<1 B0"), std::string::npos) << text;
  EXPECT_NE(text.find("rank 1: recv_act0<0 F0 B0 send_grad0>0"), std::string::npos) << text;
  EXPECT_EQ(to_string(Action{Op::Forward, 3, 1, -1}), "F3.c1");
}

// ---- the simulator must be able to fail ---------------------------------------

Schedule small(const std::string& name = "1f1b", int p = 2, int m = 2) { return make_schedule(name, p, m); }

size_t find(const std::vector<Action>& acts, Op op, int m, int c = 0) {
  for (size_t i = 0; i < acts.size(); ++i)
    if (acts[i].op == op && acts[i].microbatch == m && acts[i].chunk == c) return i;
  ADD_FAILURE() << "action not found";
  return 0;
}

TEST(Simulator, DetectsDeadlock) {
  Schedule s = small();
  // Rank 0 waits for the gradient of microbatch 0 before sending any activation.
  auto& a0 = s.actions[0];
  const size_t i = find(a0, Op::RecvGrad, 0);
  Action recv = a0[i];
  a0.erase(a0.begin() + static_cast<long>(i));
  a0.insert(a0.begin(), recv);
  SimResult r = simulate(s);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.error.find("deadlock"), std::string::npos) << r.error;
  EXPECT_NE(r.error.find("rank 0 waits"), std::string::npos) << r.error;
  EXPECT_NE(r.error.find("rank 1 waits"), std::string::npos) << r.error;
}

TEST(Simulator, DetectsOutOfOrderMessages) {
  Schedule s = small("gpipe", 2, 2);
  // Rank 1 consumes microbatch 1's activation first: FIFO mismatch.
  auto& a1 = s.actions[1];
  std::swap(a1[find(a1, Op::RecvActivation, 0)], a1[find(a1, Op::RecvActivation, 1)]);
  SimResult r = simulate(s);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.error.find("out-of-order"), std::string::npos) << r.error;
  EXPECT_NE(r.error.find("expected microbatch 1"), std::string::npos) << r.error;
}

TEST(Simulator, DetectsInterleavedChannelMisorder) {
  // Swap two forwards of different chunks on rank 0 in an interleaved schedule: the
  // wrap-around channel rank 1 -> rank 0 then delivers in a different order.
  Schedule s = make_schedule("interleaved-1f1b", 2, 4, 2);
  auto& a0 = s.actions[0];
  const size_t i = find(a0, Op::RecvActivation, 0, 1), j = find(a0, Op::RecvActivation, 1, 1);
  std::swap(a0[i], a0[j]);
  SimResult r = simulate(s);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.error.find("out-of-order"), std::string::npos) << r.error;
}

TEST(Simulator, DetectsUnreceivedSendAndMissingReceive) {
  {
    Schedule s = small();
    auto& a1 = s.actions[1];
    a1.erase(a1.begin() + static_cast<long>(find(a1, Op::RecvActivation, 1)));
    SimResult r = simulate(s);
    EXPECT_FALSE(r.ok);
    EXPECT_NE(r.error.find("before its activation was received"), std::string::npos) << r.error;
  }
  {
    Schedule s = small();
    s.actions[0].push_back(Action{Op::SendActivation, 1, 0, 1});  // a second, unmatched send
    SimResult r = simulate(s);
    EXPECT_FALSE(r.ok);
    EXPECT_NE(r.error.find("never received"), std::string::npos) << r.error;
  }
  {
    Schedule s = small();
    s.actions[1].push_back(Action{Op::RecvActivation, 1, 0, 0});  // nobody sends it
    SimResult r = simulate(s);
    EXPECT_FALSE(r.ok);
    EXPECT_NE(r.error.find("deadlock"), std::string::npos) << r.error;
    EXPECT_NE(r.error.find("rank 0 finished"), std::string::npos) << r.error;
  }
}

TEST(Simulator, DetectsDependencyViolations) {
  {  // forward consumed before its receive
    Schedule s = small();
    auto& a1 = s.actions[1];
    const size_t i = find(a1, Op::RecvActivation, 0);
    std::swap(a1[i], a1[i + 1]);
    SimResult r = simulate(s);
    EXPECT_FALSE(r.ok);
    EXPECT_NE(r.error.find("before its activation was received"), std::string::npos) << r.error;
  }
  {  // backward before its own forward (p = 1)
    Schedule s = small("gpipe", 1, 2);
    auto& a = s.actions[0];
    std::swap(a[find(a, Op::Forward, 1)], a[find(a, Op::Backward, 1)]);
    SimResult r = simulate(s);
    EXPECT_FALSE(r.ok);
    EXPECT_NE(r.error.find("backward before its own forward"), std::string::npos) << r.error;
  }
  {  // BW before its BI
    Schedule s = small("zb-h1", 2, 2);
    auto& a = s.actions[0];
    std::swap(a[find(a, Op::BackwardInput, 0)], a[find(a, Op::BackwardWeight, 0)]);
    SimResult r = simulate(s);
    EXPECT_FALSE(r.ok);
    EXPECT_NE(r.error.find("weight backward before its input backward"), std::string::npos) << r.error;
  }
  {  // send of something not computed yet
    Schedule s = small();
    auto& a0 = s.actions[0];
    const size_t i = find(a0, Op::SendActivation, 0);
    std::swap(a0[i - 1], a0[i]);
    SimResult r = simulate(s);
    EXPECT_FALSE(r.ok);
    EXPECT_NE(r.error.find("sent before the forward computed it"), std::string::npos) << r.error;
  }
  {  // wrong peer
    Schedule s = small("1f1b", 3, 2);
    s.actions[0][find(s.actions[0], Op::SendActivation, 0)].peer = 2;
    SimResult r = simulate(s);
    EXPECT_FALSE(r.ok);
    EXPECT_NE(r.error.find("is on rank 1, not 2"), std::string::npos) << r.error;
  }
}

TEST(Simulator, DetectsMissingOrDuplicatedCompute) {
  {
    Schedule s = small("gpipe", 1, 2);
    auto& a = s.actions[0];
    a.erase(a.begin() + static_cast<long>(find(a, Op::Backward, 1)));
    SimResult r = simulate(s);
    EXPECT_FALSE(r.ok);
    EXPECT_NE(r.error.find("microbatch 1 chunk 0 is never backwarded"), std::string::npos) << r.error;
  }
  {
    Schedule s = small("gpipe", 1, 2);
    s.actions[0].push_back(Action{Op::Backward, 0, 0, -1});
    SimResult r = simulate(s);
    EXPECT_FALSE(r.ok);
    EXPECT_NE(r.error.find("backwarded twice"), std::string::npos) << r.error;
  }
  {
    Schedule s = small("zb-h1", 1, 2);
    auto& a = s.actions[0];
    a.erase(a.begin() + static_cast<long>(find(a, Op::BackwardWeight, 0)));
    SimResult r = simulate(s);
    EXPECT_FALSE(r.ok);
    EXPECT_NE(r.error.find("no weight backward"), std::string::npos) << r.error;
  }
  {
    Schedule s = small();
    s.actions[0].push_back(Action{Op::Forward, 5, 0, -1});
    SimResult r = simulate(s);
    EXPECT_FALSE(r.ok);
    EXPECT_NE(r.error.find("microbatch out of range"), std::string::npos) << r.error;
  }
  {
    Schedule s = small();
    s.actions.pop_back();
    SimResult r = simulate(s);
    EXPECT_FALSE(r.ok);
    EXPECT_NE(r.error.find("1 action lists for 2 stages"), std::string::npos) << r.error;
  }
}

}  // namespace
}  // namespace smp

namespace smp {
namespace {

// NCCL's point-to-point rules (schedule/nccl_order.h): a send completes when
// its receive runs, ops run in posted order on a stream.
TEST(NcclOrder, OneFOneBAtTwoStagesDeadlocksOnOneStreamPerPairAndNamesTheOps) {
  const Schedule s = make_schedule("1f1b", 2, 2);
  for (NcclStreams model : {NcclStreams::OnePerPair, NcclStreams::OnePerRank}) {
    const std::string e = check_nccl_order(s, model);
    EXPECT_NE(e.find("deadlock under NCCL's rules"), std::string::npos) << e;
    // The issue's replay: rank 0 queues send A0, send A1, recv G0; rank 1 recv A0, send G0, recv A1.
    EXPECT_NE(e.find("rank 0 waits for recv_grad0<1"), std::string::npos) << e;
    EXPECT_NE(e.find("is stuck at send_act1>1 (rank 1's receive #2 from rank 0, recv_act1<0, is queued behind "
                     "send_grad0>0) with recv_grad0<1 behind it"),
              std::string::npos)
        << e;
    EXPECT_NE(e.find("rank 1 waits for recv_act1<0"), std::string::npos) << e;
    EXPECT_NE(e.find("is stuck at send_grad0>0 (rank 0's receive #1 from rank 1, recv_grad0<1, is queued behind "
                     "send_act1>1)"),
              std::string::npos)
        << e;
  }
  EXPECT_EQ(check_nccl_order(s, NcclStreams::OnePerDirection), "");
  EXPECT_EQ(check_nccl_order(s, NcclStreams::OnePerGroup), "");
}

// Every schedule, far beyond the equivalence tests' layouts: none can hang on
// the executor's streams (its two groups, with a stream per pair and
// direction, or per group once connected at start). On one stream per pair
// GPipe never hangs and the others do, at some sizes; that is what the
// executor's second pp group is for.
TEST(NcclOrder, NoScheduleDeadlocksWithAStreamPerDirection) {
  std::map<std::string, int> hangs_on_one_stream;
  int schedules = 0;
  for (const auto& name : schedule_names())
    for (int p : {1, 2, 3, 4, 8})
      for (int m = 1; m <= 16; ++m)
        for (int v : {1, 2, 4}) {
          if (v > 1 && (name != "interleaved-1f1b" || p < 2 || m % p != 0)) continue;
          SCOPED_TRACE(label({name, p, m, v}));
          const Schedule s = make_schedule(name, p, m, v);
          ++schedules;
          EXPECT_EQ(check_nccl_order(s, NcclStreams::OnePerDirection), "");
          EXPECT_EQ(check_nccl_order(s, NcclStreams::OnePerGroup), "");
          EXPECT_TRUE(simulate(s).ok);
          if (!check_nccl_order(s, NcclStreams::OnePerPair).empty()) ++hangs_on_one_stream[name];
        }
  EXPECT_EQ(schedules, 358);
  EXPECT_EQ(hangs_on_one_stream.count("gpipe"), 0u);
  for (const char* name : {"1f1b", "interleaved-1f1b", "zb-h1"}) EXPECT_GT(hangs_on_one_stream[name], 0) << name;
}

// What a stuck receive waits for is named from its side: the peer's send to it.
TEST(NcclOrder, AStuckReceiveNamesThePeersSendToIt) {
  Schedule s = make_schedule("gpipe", 2, 1);
  auto& a0 = s.actions[0];  // rank 0: F0 send_act0>1 recv_grad0<1 B0: receive before sending
  std::swap(a0[1], a0[2]);
  const std::string e = check_nccl_order(s, NcclStreams::OnePerDirection);
  EXPECT_NE(e.find("rank 0 waits for recv_grad0<1, its stream of receives from rank 1 is stuck at recv_grad0<1 (rank "
                   "1's send #1 to rank 0, not posted)"),
            std::string::npos)
      << e;
}

// A receive that is not the one its sender posted next: NCCL, without tags,
// would hand it the other message.
TEST(NcclOrder, AReceiveOutOfPostedOrderIsNamed) {
  Schedule s = make_schedule("gpipe", 2, 2);
  auto& a1 = s.actions[1];  // rank 1: recv_act0 F0 recv_act1 F1 ...: take microbatch 1 first
  std::swap(a1[0], a1[2]);
  std::swap(a1[1], a1[3]);
  const std::string e = check_nccl_order(s, NcclStreams::OnePerDirection);
  EXPECT_NE(e.find("NCCL would match rank 0's send_act0>1 with rank 1's recv_act1<0 (both the #1 on their "
                   "direction), another message"),
            std::string::npos)
      << e;
}

}  // namespace
}  // namespace smp
