// Runs a real job through smp-launch and reads back what it wrote.
#pragma once

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <map>
#include <string>
#include <vector>

namespace smp::testing {

struct JobResult {
  int exit_code = -1;
  std::string output;
  nlohmann::json summary;  // <run.dir>/summary.json, null when missing
  std::string run_dir;
};

// smp-launch --nproc-per-node nproc --master-port <free> <extra...> --plugin P --config C --set k=v...
// run.dir is a fresh temporary folder unless an override sets it.
JobResult run_job(int nproc, const std::string& plugin, const std::string& config,
                  std::vector<std::string> overrides, const std::vector<std::string>& launcher_args = {});

// Reassembles the full parameters from <run.dir>/<folder>/rank-*.json (folder
// "parameters": at the end of the run; "parameters-initial": before its first
// step): tp shards concatenated along their shard dim; replicas (dp, tied
// stages, tp-replicated) checked equal within tol, else a message in *problem.
std::map<std::string, at::Tensor> assemble_parameters(const std::string& run_dir, double tol, std::string* problem,
                                                      const std::string& folder = "parameters");

// A job's per-step losses (summary.json "losses").
std::vector<double> losses_of(const JobResult& r);
// Largest |a[i] - b[i]| / |b[i]| over the common steps.
// The largest |a - b| / |b| element by element; infinity when the lengths differ or both are empty.
double worst_relative(const std::vector<double>& a, const std::vector<double>& b);
// Overrides a, then b.
std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b);

std::string source_path(const std::string& relative);
std::string plugin_path(const std::string& name);  // built plugin, by file stem

}  // namespace smp::testing
