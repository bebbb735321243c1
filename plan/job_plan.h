// A plan: the search over a shape and, for a job, smp's own memory estimate
// over the fastest layouts; what smp-plan prints and what plan_job
// (<smp/plan.h>) returns are both made here.
#pragma once

#include "plan/search.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace smp::plan {

// The job a plan is for: its file, adapter plugin and --set lines (empty
// `config`: no job, the shape as given).
struct JobFile {
  std::string config, plugin = "gpt";
  std::vector<std::string> sets;
};

struct Plan {
  Shape shape;
  SearchResult result;           // with a job: the layouts smp's estimate keeps, `top` at most
  double search_seconds = 0;
  int64_t left_out = 0;          // of the fastest, those smp's estimate puts over the memory
};

// Throws smp::Error naming the flag when the shape lacks a size, or its heads do not split its hidden size.
void check_shape(const Shape& s);

// The ranked layouts for `s` on `c` (with a job: those smp's memory estimate
// keeps under the accelerator's memory, `top` at most, each with that estimate
// as its memory).
Plan make_plan(const Cluster& c, const Shape& s, const SearchOptions& o, size_t top, const JobFile& job);

// smp-plan --json's object: cluster, candidates, fitting, search_seconds,
// memory, left_out_by_smps_estimate, top (`top` at most), shape.
nlohmann::json plan_json(const Cluster& c, const Plan& p, size_t top, const JobFile& job);

// Why `p` has no layout: none exists for the world and options, or none fits.
std::string no_layout_reason(const Cluster& c, const Plan& p, int world);

// The job's settings as the planner reads them: its --set lines and
// parallel.layout = "manual" (the layout is what the search varies: a job that
// leaves it to the planner, "auto", is read as any other).
std::vector<std::string> planning_sets(const std::vector<std::string>& sets);

}  // namespace smp::plan
