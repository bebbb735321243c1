// Pipeline schedule generators. See schedule.h for the conventions.
//
// Every generator first produces, per rank, the order of the compute actions
// (F / B / BI / BW with microbatch and local chunk); insert_comm() then adds the
// point-to-point actions around them: each receive right before the compute that
// consumes it, each send right after the compute that produces it. With
// buffered sends that placement cannot deadlock as long as the compute orders
// are consistent, which the simulator verifies for every schedule in the tests.
// NCCL's sends are not buffered: there the placement is safe only because the
// executor keeps each direction of a pair on its own stream (nccl_order.h,
// which the simulator also runs; on one stream per pair 1F1B deadlocks).
#include "schedule/schedule.h"

#include <smp/error.h>

#include <algorithm>
#include <deque>
#include <limits>
#include <sstream>

namespace smp {

const char* op_name(Op op) {
  switch (op) {
    case Op::Forward: return "F";
    case Op::Backward: return "B";
    case Op::BackwardInput: return "BI";
    case Op::BackwardWeight: return "BW";
    case Op::SendActivation: return "send_act";
    case Op::RecvActivation: return "recv_act";
    case Op::SendGrad: return "send_grad";
    case Op::RecvGrad: return "recv_grad";
  }
  return "?";
}

bool is_compute(Op op) {
  return op == Op::Forward || op == Op::Backward || op == Op::BackwardInput || op == Op::BackwardWeight;
}

bool is_comm(Op op) { return !is_compute(op); }

bool operator==(const Action& a, const Action& b) {
  return a.op == b.op && a.microbatch == b.microbatch && a.chunk == b.chunk && a.peer == b.peer;
}

std::vector<std::string> schedule_names() { return {"gpipe", "1f1b", "interleaved-1f1b", "zb-h1"}; }

namespace {

using Order = std::vector<std::vector<Action>>;  // compute actions only, per rank

Action compute(Op op, int m, int c) { return Action{op, m, c, -1}; }

Order gpipe_order(int p, int M) {
  Order order(p);
  for (int r = 0; r < p; ++r) {
    for (int m = 0; m < M; ++m) order[r].push_back(compute(Op::Forward, m, 0));
    for (int m = 0; m < M; ++m) order[r].push_back(compute(Op::Backward, m, 0));
  }
  return order;
}

Order one_f_one_b_order(int p, int M) {
  Order order(p);
  for (int r = 0; r < p; ++r) {
    const int warmup = std::min(p - r - 1, M);
    int f = 0, b = 0;
    for (; f < warmup; ++f) order[r].push_back(compute(Op::Forward, f, 0));
    while (f < M) {  // steady state: one forward, one backward
      order[r].push_back(compute(Op::Forward, f++, 0));
      order[r].push_back(compute(Op::Backward, b++, 0));
    }
    while (b < M) order[r].push_back(compute(Op::Backward, b++, 0));
  }
  return order;
}

// Megatron-LM's interleaved schedule (Narayanan et al. 2021, "depth-first"): the
// microbatches go through a rank's chunks in groups of `p`; the k-th forward (and
// k-th backward, chunks reversed) of a rank is fixed by k alone, the same on all
// ranks, so the per-channel message orders of sender and receiver agree.
Order interleaved_order(int p, int M, int v) {
  const int total = M * v;
  auto microbatch_of = [&](int k) { return (k / (p * v)) * p + k % p; };
  auto fwd_chunk = [&](int k) { return (k / p) % v; };
  auto bwd_chunk = [&](int k) { return v - 1 - (k / p) % v; };
  Order order(p);
  for (int r = 0; r < p; ++r) {
    const int warmup = std::min(2 * (p - r - 1) + (v - 1) * p, total);
    int f = 0, b = 0;
    for (; f < warmup; ++f) order[r].push_back(compute(Op::Forward, microbatch_of(f), fwd_chunk(f)));
    while (f < total) {
      order[r].push_back(compute(Op::Forward, microbatch_of(f), fwd_chunk(f)));
      ++f;
      order[r].push_back(compute(Op::Backward, microbatch_of(b), bwd_chunk(b)));
      ++b;
    }
    for (; b < total; ++b) order[r].push_back(compute(Op::Backward, microbatch_of(b), bwd_chunk(b)));
  }
  return order;
}

// Zero Bubble H1 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, §2.1).
//
// The backward is split into BI (input gradient, on the critical path: BI(m) on
// stage r only needs BI(m) of stage r+1) and BW (weight gradient, no dependants).
// H1 runs F and BI in 1F1B's order and puts the BWs into the time a rank would
// otherwise wait. The order comes from list-scheduling the pipeline in simulated
// time with the plan's costs: whenever a rank is free it runs its next F/BI if
// that is ready, else its oldest deferred BW, else it waits for the F/BI.
//
// Memory stays within 1F1B's peak, p microbatches' activations (the paper's
// p M_B: 1F1B's first stage). 1F1B's order keeps at most p - r microbatches
// forwarded but not input-backwarded on rank r; a deferred BW keeps less, only
// what the weight sides read (BI frees the input side). A forward also waits
// while p microbatches are forwarded and not weight-backwarded, so even counting
// pending BWs whole no rank holds more than p. On a rank whose BI costs nothing
// (the first stage: no input gradient, so its whole backward is its BW)
// activations live until BW, and there the bound is 1F1B's own, p - r.
//
// With the default plan (F = BI = BW = 1, the first stage's BI = 0 and BW = 2,
// as the executor runs it) the bubble is (p-1)(F+B-W) instead of 1F1B's
// (p-1)(F+B+W) once m >= p: the paper's (p-1)/(3m). The grid in
// tests/pipeline/schedule_test.cpp checks that and other costs. (Preferring a
// ready BI over a ready F instead of keeping 1F1B's order loses a unit at odd
// p, e.g. p = 3, m = 4: 15 against 14.)
Order zb_h1_order(int p, int M, const ZbPlanCosts& costs) {
  const double kNever = std::numeric_limits<double>::infinity();
  // F and BI in 1F1B's order; BWs go into the gaps.
  Order sequence = one_f_one_b_order(p, M);
  for (auto& rank : sequence)
    for (Action& a : rank)
      if (a.op == Op::Backward) a.op = Op::BackwardInput;
  std::vector<std::vector<double>> f_done(p, std::vector<double>(M, kNever));
  std::vector<std::vector<double>> bi_done(p, std::vector<double>(M, kNever));
  std::vector<size_t> next(p, 0);
  std::vector<int> next_f(p, 0), next_bi(p, 0), next_w(p, 0);
  std::vector<double> free_at(p, 0);
  Order order(p);
  for (int left = 3 * p * M; left > 0; --left) {
    // The rank that can start something soonest goes next (ties: the lower
    // rank), so every decision sees all work finished by its start time.
    int rank = -1;
    double start = kNever;
    Action chosen = compute(Op::Forward, -1, 0);
    for (int r = 0; r < p; ++r) {
      const double t0 = free_at[r];
      double ready = kNever;
      Action a = compute(Op::Forward, -1, 0);
      if (next[r] < sequence[r].size()) {
        a = sequence[r][next[r]];
        const int m = a.microbatch;
        if (a.op == Op::BackwardInput) {
          ready = r == p - 1 ? f_done[r][m] : bi_done[r + 1][m] + costs.comm;
        } else if (next_f[r] - next_w[r] < (costs.backward_input[r] > 0 ? p : p - r)) {
          ready = r == 0 ? 0.0 : f_done[r - 1][m] + costs.comm;
        }
      }
      double t = std::max(t0, ready);
      if (ready > t0 && next_w[r] < next_bi[r]) t = t0, a = compute(Op::BackwardWeight, next_w[r], 0);
      if (a.microbatch >= 0 && t < start) rank = r, start = t, chosen = a;
    }
    if (rank < 0) throw Error("zb-h1: schedule construction stalled (internal error)");
    order[rank].push_back(chosen);
    const int m = chosen.microbatch;
    if (chosen.op == Op::Forward) {
      free_at[rank] = f_done[rank][m] = start + costs.forward[rank];
      ++next_f[rank], ++next[rank];
    } else if (chosen.op == Op::BackwardInput) {
      free_at[rank] = bi_done[rank][m] = start + costs.backward_input[rank];
      ++next_bi[rank], ++next[rank];
    } else {
      free_at[rank] = start + costs.backward_weight[rank];
      ++next_w[rank];
    }
  }
  return order;
}

// Adds the point-to-point actions around the compute actions.
Schedule insert_comm(const std::string& name, int p, int M, int v, const Order& order) {
  Schedule s;
  s.name = name;
  s.stages = p;
  s.microbatches = M;
  s.chunks = v;
  s.actions.resize(p);
  const int S = p * v;
  for (int r = 0; r < p; ++r) {
    auto& out = s.actions[r];
    for (const Action& a : order[r]) {
      const int vs = s.virtual_stage(r, a.chunk);
      const int prev_rank = vs > 0 ? s.rank_of(vs - 1) : -1;
      const int next_rank = vs < S - 1 ? s.rank_of(vs + 1) : -1;
      switch (a.op) {
        case Op::Forward:
          if (vs > 0) out.push_back(Action{Op::RecvActivation, a.microbatch, a.chunk, prev_rank});
          out.push_back(a);
          if (vs < S - 1) out.push_back(Action{Op::SendActivation, a.microbatch, a.chunk, next_rank});
          break;
        case Op::Backward:
        case Op::BackwardInput:
          if (vs < S - 1) out.push_back(Action{Op::RecvGrad, a.microbatch, a.chunk, next_rank});
          out.push_back(a);
          if (vs > 0) out.push_back(Action{Op::SendGrad, a.microbatch, a.chunk, prev_rank});
          break;
        default:
          out.push_back(a);
      }
    }
  }
  return s;
}

}  // namespace

Schedule make_schedule(const std::string& name, int stages, int microbatches, int chunks) {
  auto bad = [&](const std::string& why) {
    return Error("pipeline schedule '" + name + "' (stages=" + std::to_string(stages) +
                 ", microbatches=" + std::to_string(microbatches) + ", chunks=" + std::to_string(chunks) +
                 "): " + why);
  };
  if (stages < 1) throw bad("stages must be >= 1");
  if (microbatches < 1) throw bad("microbatches must be >= 1");
  if (chunks < 1) throw bad("chunks must be >= 1");
  if (name == "gpipe" || name == "1f1b" || name == "zb-h1") {
    if (chunks != 1) throw bad("chunks > 1 is only supported by 'interleaved-1f1b'");
    if (name == "gpipe") return insert_comm(name, stages, microbatches, 1, gpipe_order(stages, microbatches));
    if (name == "1f1b") return insert_comm(name, stages, microbatches, 1, one_f_one_b_order(stages, microbatches));
    return insert_comm(name, stages, microbatches, 1, zb_h1_order(stages, microbatches, zb_default_costs(stages)));
  }
  if (name == "interleaved-1f1b") {
    if (chunks == 1) return insert_comm(name, stages, microbatches, 1, one_f_one_b_order(stages, microbatches));
    if (stages < 2) throw bad("chunks > 1 needs stages >= 2");
    if (microbatches % stages != 0)
      throw bad("microbatches must be a multiple of stages (" + std::to_string(microbatches) + " % " +
                std::to_string(stages) + " != 0)");
    return insert_comm(name, stages, microbatches, chunks, interleaved_order(stages, microbatches, chunks));
  }
  std::string known;
  for (const auto& n : schedule_names()) known += (known.empty() ? "" : ", ") + n;
  throw bad("unknown schedule name (known: " + known + ")");
}

std::string to_string(const Action& a) {
  std::ostringstream os;
  os << op_name(a.op) << a.microbatch;
  if (a.chunk != 0) os << ".c" << a.chunk;
  if (a.op == Op::SendActivation || a.op == Op::SendGrad) os << '>' << a.peer;
  if (a.op == Op::RecvActivation || a.op == Op::RecvGrad) os << '<' << a.peer;
  return os.str();
}

std::string to_string(const Schedule& s) {
  std::ostringstream os;
  os << "schedule " << s.name << " stages=" << s.stages << " microbatches=" << s.microbatches
     << " chunks=" << s.chunks << '\n';
  for (size_t r = 0; r < s.actions.size(); ++r) {
    os << "  rank " << r << ':';
    for (const Action& a : s.actions[r]) os << ' ' << to_string(a);
    os << '\n';
  }
  return os.str();
}

ZbPlanCosts zb_default_costs(int stages) {
  ZbPlanCosts c;
  c.forward.assign(std::max(stages, 0), 1.0);
  c.backward_input.assign(std::max(stages, 0), 1.0);
  c.backward_weight.assign(std::max(stages, 0), 1.0);
  if (stages >= 1) {
    c.backward_input[0] = 0;
    c.backward_weight[0] = 2;
  }
  return c;
}

Schedule make_zb_h1_schedule(int stages, int microbatches, const ZbPlanCosts& costs) {
  auto bad = [&](const std::string& why) {
    return Error("pipeline schedule 'zb-h1' (stages=" + std::to_string(stages) +
                 ", microbatches=" + std::to_string(microbatches) + "): " + why);
  };
  if (stages < 1) throw bad("stages must be >= 1");
  if (microbatches < 1) throw bad("microbatches must be >= 1");
  const size_t p = static_cast<size_t>(stages);
  if (costs.forward.size() != p || costs.backward_input.size() != p || costs.backward_weight.size() != p)
    throw bad("plan costs need one forward, backward_input and backward_weight per stage");
  for (size_t r = 0; r < p; ++r)
    if (!(costs.forward[r] > 0) || !(costs.backward_input[r] >= 0) || !(costs.backward_weight[r] >= 0))
      throw bad("plan costs of stage " + std::to_string(r) + " must be forward > 0, backward_input >= 0, backward_weight >= 0");
  if (!(costs.comm >= 0)) throw bad("plan cost comm must be >= 0");
  return insert_comm("zb-h1", stages, microbatches, 1, zb_h1_order(stages, microbatches, costs));
}

}  // namespace smp
