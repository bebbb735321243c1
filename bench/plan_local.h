// smp-bench plan-local: the planner against this machine. Every layout of
// the GPT bench model on 2 ranks (dp, pp, tp; ZeRO 0-3, every microbatch
// size, every schedule; no recomputation) and of the moe bench model at dp 2
// (ep 1 and 2, every microbatch size, ZeRO 0 and 1) is predicted with a
// cluster file of this machine that smp-plan --calibrate writes first, and
// measured (interleaved repeats); the JSON holds both, and per model the
// Spearman rank correlation, the median absolute error and how far the
// predicted best is from the measured best.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace bench {

struct PlanLocalOptions {
  std::vector<std::string> overrides;  // for every job (steps, logging)
  int repeat = 5;
  double quiet_cores = 0.5, job_wait_s = 60;
  std::string cluster;   // a cluster file; empty: calibrate this machine first
  std::string measured;  // an earlier result: predict its measurements again, run no jobs
};

nlohmann::json run_plan_local(const PlanLocalOptions& o);

// Spearman's rank correlation (ties get their mean rank); NaN under 2 points.
double spearman(const std::vector<double>& x, const std::vector<double>& y);

}  // namespace bench
