// A traced pipeline run read back (run.trace: <run.dir>/trace/rank-<r>.json),
// in the simulator's terms: per rank the pipeline actions of every traced step
// in time order, the mean cost of each compute kind, the idle share of the
// pipeline phase, and the mean message delivery time. A measured run and its
// simulation (schedule_simulator.h) can then be compared action by action.
#pragma once

#include "schedule/schedule_simulator.h"

#include <nlohmann/json_fwd.hpp>

#include <string>
#include <vector>

namespace smp {

struct TracedPipeline {
  // [pp rank][traced step]: the compute and p2p actions of the pipeline phase,
  // named as to_string(Action) names them, in time order.
  std::vector<std::vector<std::vector<std::string>>> actions;
  // Per pp rank: mean over the traced steps of (pipeline phase - compute) / phase.
  std::vector<double> idle_fraction;
  // Microseconds. Per rank the mean F, B, BI and BW (the stages differ: the
  // first holds the embeddings, the last the head and the loss); comm = the
  // mean delivery time (a send's start to the end of the receive that waited
  // for it: sends are asynchronous, so what a rank waits for is the transfer).
  SimCosts costs;
  int deliveries = 0;  // messages averaged into costs.comm
  // Means over the traced steps of the slowest rank's step and pipeline phase.
  double step_us = 0, pipeline_us = 0;
};

// rank_traces[r]: pp rank r's trace (one process per pp rank: tp = dp = 1).
// Throws smp::Error when a trace has no pipeline phase or the ranks traced
// different numbers of steps.
TracedPipeline read_traced_pipeline(const std::vector<nlohmann::json>& rank_traces);

}  // namespace smp
