// Discrete-event simulation of a pipeline Schedule: checks that it is executable
// (no deadlock, every send received in order, dependencies respected, every
// microbatch/chunk computed exactly once) and times it under simple costs.
// Pure C++ (no LibTorch).
#pragma once

#include "schedule/nccl_order.h"
#include "schedule/schedule.h"

#include <string>
#include <vector>

namespace smp {

// Cost of one action on one virtual stage (all virtual stages cost the same).
struct SimCosts {
  double forward = 1;
  double backward = 2;  // full backward (Op::Backward)
  double backward_input = 1;
  double backward_weight = 1;
  double comm = 0;      // latency from a send to the earliest matching receive
  // Time a send occupies its rank, and a receive whose message is already
  // there (both count as idle, not busy: measured traces show them).
  double send = 0, recv = 0;
  // Per pp rank, when the stages differ (e.g. measured): replace forward,
  // backward, backward_input and backward_weight on that rank (empty = the
  // uniform costs above).
  std::vector<double> forward_by_rank, backward_by_rank, backward_input_by_rank, backward_weight_by_rank;
};

// Costs of a zero-bubble schedule as the executor runs it: forward, BI and BW
// on every stage but the first, which has no input gradient to compute: its BI
// costs 0 and its BW is its whole backward (backward_split.h). `backward`
// (for the schedules without a split) is BI + BW.
SimCosts zero_bubble_costs(int stages, double forward, double backward_input, double backward_weight);

// One compute action as the simulator ran it.
struct SimSlice {
  Action action;
  double start = 0, end = 0;
};

struct SimResult {
  bool ok = false;
  std::string error;             // first problem found, naming rank / action; empty when ok
  double makespan = 0;           // time at which the last rank finishes
  double bubble_fraction = 0;    // mean over ranks of idle / makespan
  double bubble_ratio = 0;       // (makespan - ideal) / ideal, ideal = max per-rank compute time
  std::vector<int> peak_in_flight;  // per rank: max #(microbatch, chunk) pairs forwarded whose
                                    // backward (input part) is not done yet
  std::vector<double> busy;         // per rank: total compute time
  std::vector<double> finish;       // per rank: time its last action completed
  std::vector<std::vector<SimSlice>> timeline;  // per rank: its compute actions in order, timed
};

// Each rank executes its actions in order. A compute action takes its cost; a send
// takes `send` and its message is available `comm` after it; a receive waits for
// the oldest message on its (src rank, dst rank, kind) channel, which must be the
// one it expects (FIFO), and completes `recv` after that message is available.
// Reported as errors (ok = false): deadlock (every unfinished rank blocked on a
// receive; the message lists what each waits for), a receive that gets another
// microbatch/chunk than it names, a send/receive with the wrong peer, a message
// never received, F without its activation (s > 0), B/BI without its own F or
// without its gradient (s < S-1), a send of something not computed yet, BW before
// its BI, mixing B with BI/BW for one (microbatch, chunk), and any (microbatch,
// chunk) not forwarded / backwarded exactly once on its rank. Also checks shape:
// one action list per stage, microbatch and chunk indices in range. Finally
// the schedule must complete under NCCL's rules with the executor's streams
// (check_nccl_order, OnePerDirection and OnePerGroup), else ok = false naming
// the deadlock.
SimResult simulate(const Schedule& schedule, const SimCosts& costs = {});

// The simulated timeline in the format run.trace writes (Chrome trace /
// Perfetto JSON: a process per rank, the compute actions as slices named as
// to_string(Action) names them), one cost unit = us_per_unit microseconds, so
// a predicted and a measured timeline open side by side.
std::string chrome_trace(const Schedule& schedule, const SimResult& result, double us_per_unit);

}  // namespace smp
