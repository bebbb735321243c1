// The planner's search: every layout of a world size for a shape (tp within a
// node, pp, dp, ep dividing dp when the model has experts, schedule and virtual stages, microbatch size, ZeRO 0-3, full
// recomputation or none), each predicted (step_model.h); the ones that fit the accelerator's
// memory ranked by step time, ties broken by the layout's text (deterministic).
#pragma once

#include "plan/step_model.h"

#include <vector>

namespace smp::plan {

struct SearchOptions {
  int world = 1;
  // Samples per microbatch: these, or (empty) every divisor of the batch per
  // dp rank up to max_microbatch.
  std::vector<int64_t> microbatch_sizes;
  int64_t max_microbatch = 64;
  std::vector<int> zero_stages = {0, 1, 2, 3};
  std::vector<bool> recompute = {true, false};
  int max_virtual_stages = 8;
  std::vector<std::string> schedules = {"1f1b", "gpipe", "zb-h1"};  // with one virtual stage
  bool overlap_dp = true;  // Layout::overlap_dp of every candidate
  // Only these (0: any). cp: every divisor of world / (tp pp) up to a node (a
  // ring of intra-node links) for a shape without experts whose sequence
  // cuts into 2 cp chunks; max_cp bounds it (1: no context parallelism).
  int tp = 0, pp = 0, ep = 0, cp = 0;
  int max_cp = 0;  // 0: a node
};

struct Candidate {
  Layout layout;
  Prediction prediction;
};

struct SearchResult {
  int64_t candidates = 0;  // layouts predicted
  int64_t fitting = 0;     // of them, those that fit
  std::vector<Candidate> ranked;  // the fitting ones, fastest first
};

SearchResult search(const Cluster& c, const Shape& s, const SearchOptions& o);

}  // namespace smp::plan
