// The planner in process: the layouts smp-plan --config ranks for a job (the
// step-time model's search over a cluster, then smp's own memory estimate),
// for a program that calls it instead of running smp-plan. smp-plan and the
// tests link it (smp_plan and the smp_plan_job objects); smp-launch, which
// carries no LibTorch, loads libsmp_plan_job.so (lib/smp/) through the C door
// below only when a job asks for a plan (--plan, parallel.layout = "auto").
//
//   smp::plan::JobRequest r;
//   r.cluster = "dgx-a100-80gb";  r.world = 8;  r.config = "job.toml";
//   const nlohmann::json plan = smp::plan::plan_job(r);  // smp-plan --json --top 5's object
//   for (const auto& set : plan["top"][0]["sets"]) ...   // the --set lines of the fastest layout
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <string>
#include <vector>

namespace smp::plan {

struct JobRequest {
  std::string cluster;            // a preset (configs/clusters/<name>.toml) or a cluster file
  int world = 1;                  // accelerators, 1 to smp::kMaxWorldSize
  std::string config;             // the job file: the model's shape from it, memory from smp's estimate
  std::string plugin = "gpt";     // the job's adapter plugin
  std::vector<std::string> sets;  // key=value over the job file
  size_t top = 5;                 // layouts to rank
  int tp = 0, pp = 0, ep = 0;     // only these (0: any)
};

// What `smp-plan --json --cluster C --world W --config F [--plugin P] [--set
// ...] [--top N]` prints: {"cluster", "candidates", "fitting",
// "search_seconds", "memory", "left_out_by_smps_estimate", "top": [{"layout",
// "step_seconds", "sets", ...}, ...], "shape"}, the fastest first. Throws
// smp::Error naming the cluster file, the job file and key at fault, or why no
// layout fits.
nlohmann::json plan_job(const JobRequest& request);

}  // namespace smp::plan

extern "C" {
// plan_job through a C door, for a program that loads the planner at run time
// (dlopen of libsmp_plan_job.so, as smp-launch does). `request`: a JobRequest
// as JSON ({"cluster", "world", "config", "plugin", "sets", "top"}; tp, pp,
// ep). Returns malloc'd text the caller frees: the plan's JSON when *ok is 1,
// else the error's message (*ok 0).
char* smp_plan_job_json(const char* request, int* ok);
}
