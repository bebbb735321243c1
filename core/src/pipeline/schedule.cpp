// Pipeline schedule generators. See schedule.h for the conventions.
//
// Every generator first produces, per rank, the order of the compute actions
// (F / B / BI / BW with microbatch and local chunk); insert_comm() then adds the
// point-to-point actions around them: each receive right before the compute that
// consumes it, each send right after the compute that produces it. Because sends
// are buffered, that placement cannot deadlock as long as the compute orders are
// consistent, which the simulator verifies for every schedule in the tests.
#include "pipeline/schedule.h"

#include <smp/error.h>

#include <algorithm>
#include <deque>
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
// H1 keeps 1F1B's memory bound -- at most p - r microbatches forwarded but not yet
// input-backwarded on rank r -- and uses the freedom of BW to fill what would be
// idle time in 1F1B. The order is derived by list-scheduling the pipeline with unit
// costs F = BI = BW = 1 (the paper's handcrafted setting): whenever a rank is free
// it runs, in priority order, the next BI if its gradient has arrived, else the
// next F if its activation has arrived and the in-flight bound allows, else the
// oldest deferred BW. With those costs this reproduces the paper's Figure 3 (top):
// 1F1B's warm-up, then F/BI alternating with BWs slotted into the gaps, and the
// last stages keeping BWs back to fill the tail that 1F1B leaves idle; the bubble
// becomes (p-1)(F+B-W) instead of 1F1B's (p-1)(F+B+W) once M >= p (verified by
// the simulator in tests/pipeline/schedule_test.cpp).
Order zb_h1_order(int p, int M) {
  const long kNever = -1;
  // finish times (integer unit steps) of F and BI per (rank, microbatch); -1 = not done
  std::vector<std::vector<long>> f_done(p, std::vector<long>(M, kNever));
  std::vector<std::vector<long>> bi_done(p, std::vector<long>(M, kNever));
  std::vector<int> next_f(p, 0), next_bi(p, 0);
  std::vector<std::deque<int>> pending_w(p);
  std::vector<long> busy_until(p, 0);
  std::vector<int> remaining(p, 3 * M);
  Order order(p);
  auto ready = [](long done, long t) { return done != kNever && done <= t; };
  int left = p * 3 * M;
  for (long t = 0; left > 0; ++t) {
    // Decisions at time t only look at work finished by t; every op takes one step,
    // so what a rank starts at t finishes at t + 1 and can't influence another
    // rank's decision at t.
    std::vector<Action> started(p, compute(Op::Forward, -1, 0));
    for (int r = 0; r < p; ++r) {
      if (busy_until[r] > t || remaining[r] == 0) continue;
      const int in_flight = next_f[r] - next_bi[r];
      const int b = next_bi[r], f = next_f[r];
      const bool bi_ok = b < f && (r == p - 1 || ready(bi_done[r + 1][b], t));
      const bool f_ok = f < M && in_flight < p - r && (r == 0 || ready(f_done[r - 1][f], t));
      if (bi_ok) {
        started[r] = compute(Op::BackwardInput, b, 0);
      } else if (f_ok) {
        started[r] = compute(Op::Forward, f, 0);
      } else if (!pending_w[r].empty()) {
        started[r] = compute(Op::BackwardWeight, pending_w[r].front(), 0);
      } else {
        continue;  // idle this step
      }
    }
    for (int r = 0; r < p; ++r) {
      const Action& a = started[r];
      if (a.microbatch < 0) continue;
      order[r].push_back(a);
      busy_until[r] = t + 1;
      --remaining[r];
      --left;
      if (a.op == Op::Forward) {
        f_done[r][a.microbatch] = t + 1;
        ++next_f[r];
      } else if (a.op == Op::BackwardInput) {
        bi_done[r][a.microbatch] = t + 1;
        ++next_bi[r];
        pending_w[r].push_back(a.microbatch);
      } else {
        pending_w[r].pop_front();
      }
    }
    if (t > 64L * p * (M + p)) throw Error("zb-h1: schedule construction did not converge (internal error)");
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
    return insert_comm(name, stages, microbatches, 1, zb_h1_order(stages, microbatches));
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

}  // namespace smp
