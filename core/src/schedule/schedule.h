// Pipeline schedules as data: for every pipeline rank, the ordered list of compute
// and point-to-point actions it executes in one training step.
//
// Pure C++ (no LibTorch): the executor interprets a Schedule, the simulator
// (schedule_simulator.h) checks and times one.
//
// Conventions the executor relies on:
//   * Rank r holds `chunks` model chunks; chunk c of rank r is virtual stage
//     s = c * stages + r (Megatron's interleaved layout). With chunks == 1, s == r.
//   * `Action::chunk` is always the LOCAL chunk of the rank executing the action:
//     for SendActivation/SendGrad it is the chunk whose output/input-grad is sent,
//     for RecvActivation/RecvGrad it is the chunk that will consume the message.
//   * `Action::peer` is the other pp rank for the four comm ops, -1 otherwise.
//   * Forward(m,c) on virtual stage s > 0 is preceded by RecvActivation(m,c) from
//     the rank of s-1; on s < S-1 (S = stages*chunks) it is followed by
//     SendActivation(m,c) to the rank of s+1.
//   * Backward(m,c) (or BackwardInput in zero-bubble schedules) on s < S-1 is
//     preceded by RecvGrad(m,c) from the rank of s+1 (the last virtual stage starts
//     from the loss) and, on s > 0, followed by SendGrad(m,c) to the rank of s-1.
//     BackwardWeight needs no communication and always follows its BackwardInput.
//   * Receives are placed right before the compute that consumes them, sends right
//     after the compute that produces them. Messages on one (src rank, dst rank,
//     kind) channel are consumed in the order they were sent (the generators
//     guarantee it; the simulator checks it). Sends need not be buffered: under
//     NCCL a send completes when its receive runs, and the executor then keeps
//     each direction of a pair on a stream of its own (nccl_order.h).
#pragma once

#include <string>
#include <vector>

namespace smp {

enum class Op {
  Forward,
  Backward,        // input + weight gradient in one pass
  BackwardInput,   // zero-bubble "B": gradient w.r.t. the stage input only
  BackwardWeight,  // zero-bubble "W": gradient w.r.t. the parameters only
  SendActivation,
  RecvActivation,
  SendGrad,
  RecvGrad
};

const char* op_name(Op op);    // "F", "B", "BI", "BW", "send_act", "recv_act", "send_grad", "recv_grad"
bool is_compute(Op op);        // Forward, Backward, BackwardInput, BackwardWeight
bool is_comm(Op op);           // the four send/recv ops

struct Action {
  Op op;
  int microbatch;
  int chunk;
  int peer = -1;  // pp rank for send/recv, else -1
};

bool operator==(const Action& a, const Action& b);
inline bool operator!=(const Action& a, const Action& b) { return !(a == b); }

struct Schedule {
  std::string name;  // "gpipe" | "1f1b" | "interleaved-1f1b" | "zb-h1"
  int stages = 1;    // pp ranks
  int microbatches = 1;
  int chunks = 1;    // model chunks (virtual stages) per rank
  std::vector<std::vector<Action>> actions;  // per pp rank, in execution order

  int virtual_stage(int rank, int chunk) const { return chunk * stages + rank; }
  int num_virtual_stages() const { return stages * chunks; }
  int rank_of(int virtual_stage) const { return virtual_stage % stages; }
  int chunk_of(int virtual_stage) const { return virtual_stage / stages; }
};

// Names accepted by make_schedule.
std::vector<std::string> schedule_names();

// Builds a schedule. Throws smp::Error naming the offending argument:
//   stages >= 1, microbatches >= 1, chunks >= 1;
//   chunks > 1 only for "interleaved-1f1b", which then also needs stages >= 2 and
//   microbatches % stages == 0 (Megatron's constraint). "interleaved-1f1b" with
//   chunks == 1 is plain 1F1B.
//
//   gpipe:            all forwards (m = 0..M-1), then all backwards (m = 0..M-1).
//   1f1b:             rank r: min(stages-r-1, M) warm-up forwards, then one forward /
//                     one backward alternately, then the remaining backwards.
//   interleaved-1f1b: Megatron's depth-first order: the k-th forward of a rank runs
//                     chunk (k / stages) % chunks of microbatch
//                     (k / (stages*chunks)) * stages + k % stages; backwards the same
//                     with chunks reversed; warm-up 2*(stages-r-1) + (chunks-1)*stages
//                     forwards (capped at M*chunks), then 1F1B, then cool-down.
//   zb-h1:            Zero Bubble H1 (Qi et al. 2023): backward split into
//                     BackwardInput / BackwardWeight; forwards and input-backwards in
//                     1F1B's order with 1F1B's memory bound (stages - r microbatches
//                     with live activations on rank r), weight-backwards deferred to
//                     fill what would otherwise be idle time. make_zb_h1_schedule
//                     with zb_default_costs(stages) (see schedule.cpp).
Schedule make_schedule(const std::string& name, int stages, int microbatches, int chunks = 1);

// The per-stage costs the ZB-H1 order is planned for (any one unit). The first
// stage receives no activation that needs a gradient, so its BackwardInput has
// nothing to compute and its BackwardWeight is its whole backward (what the
// executor does, core/src/pipeline/backward_split.h); a plan says so with
// backward_input = 0 there, which also makes its memory bound count microbatches
// until their BackwardWeight.
struct ZbPlanCosts {
  std::vector<double> forward, backward_input, backward_weight;  // one per stage
  double comm = 0;  // latency of a send
};

// F = BI = BW = 1 per stage, the first stage BI = 0 and BW = 2 (the paper's
// unit costs, with the first stage as the executor runs it).
ZbPlanCosts zb_default_costs(int stages);

// ZB-H1 planned for `costs` (measured ones, say). Throws smp::Error for
// stages/microbatches < 1, a cost vector not one per stage, forward <= 0, or a
// negative backward or comm cost.
Schedule make_zb_h1_schedule(int stages, int microbatches, const ZbPlanCosts& costs);

// Readable per-rank listing, e.g.
//   rank 0: F0 send_act0>1 F1 send_act1>1 recv_grad0<1 B0 ...
// (compute as <op><microbatch>[.c<chunk>], comm as <op><microbatch>[.c<chunk>]{<|>}<peer>).
std::string to_string(const Schedule& schedule);
std::string to_string(const Action& action);

}  // namespace smp
