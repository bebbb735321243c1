// Published runs against the planner: each row's layout (tp, pp, world, batch)
// predicted with the microbatch size and virtual stages searched, as the
// publications tuned them, under their settings (no ZeRO, full
// recomputation); the error of the predicted TFLOP/s per accelerator; and the
// layout the unconstrained search picks. The rows are a JSON file
// (bench/configs/plan-published.json).
#pragma once

#include "plan/search.h"

#include <nlohmann/json.hpp>

#include <string>

namespace smp::plan {

// {"rows": [... each row with "predicted", "predicted_tflops_per_gpu", "error",
// "within_15_percent", "search": {...}], "largest_abs_error", "all_within_15_percent"}.
nlohmann::json validate_published(const Cluster& c, const nlohmann::json& published);

nlohmann::json candidate_json(const Candidate& k, const Shape& s);

}  // namespace smp::plan
