#include "planned_layout.h"

#include "supervisor.h"

#include <smp/sdk/toml_nesting.hpp>

#include <nlohmann/json.hpp>
#include <toml++/toml.h>

#include <dlfcn.h>
#include <sys/stat.h>

#include <cstdlib>
#include <iostream>
#include <stdexcept>

namespace smp::launch {

namespace {

// What the plan sets (plan/step_model.cpp, Layout::sets).
const std::vector<std::string> kPlannedKeys = {"parallel.tp",           "parallel.pp",    "parallel.dp",
                                               "parallel.cp",
                                               "parallel.ep",           "parallel.microbatches",
                                               "parallel.schedule",     "parallel.virtual_stages",
                                               "parallel.zero",         "memory.checkpoint"};

struct JobArgs {
  std::string plugin = "gpt", config;
  std::vector<std::string> sets;
};

JobArgs job_args(const std::vector<std::string>& worker) {
  JobArgs j;
  for (size_t i = 0; i + 1 < worker.size(); ++i) {
    if (worker[i] == "--plugin") j.plugin = worker[i + 1];
    if (worker[i] == "--config") j.config = worker[i + 1];
    if (worker[i] == "--set") j.sets.push_back(worker[i + 1]);
  }
  return j;
}

std::string key_of(const std::string& set) { return set.substr(0, set.find('=')); }

// A --set value as text: a TOML string's quotes dropped.
std::string text_of(const std::string& set) {
  std::string v = set.substr(set.find('=') + 1);
  if (v.size() >= 2 && (v.front() == '"' || v.front() == '\'') && v.back() == v.front()) v = v.substr(1, v.size() - 2);
  return v;
}

// The last --set of `key`, or the job file's value, or "".
std::string value_of(const JobArgs& j, const toml::table* file, const std::string& key, std::string* origin) {
  for (auto it = j.sets.rbegin(); it != j.sets.rend(); ++it)
    if (key_of(*it) == key) {
      *origin = "--set " + *it;
      return text_of(*it);
    }
  if (file)
    if (const auto v = file->at_path(key).value<std::string>()) {
      *origin = j.config;
      return *v;
    }
  return "";
}

}  // namespace

std::string auto_layout_cluster(const std::vector<std::string>& worker_args) {
  const JobArgs j = job_args(worker_args);
  toml::table file;
  const toml::table* table = nullptr;
  if (!j.config.empty()) {
    // Read as the worker reads it: a regular file (a named pipe is refused, not
    // waited on), its size and nesting bounded before toml++ sees it.
    // A file that is not there is the worker's to report, as one toml++ refuses.
    std::string text;
    bool read = false;
    try {
      text = smp::input::read_toml_file(j.config, j.config);
      read = true;
    } catch (const smp::input::Error& e) {
      struct stat st {};
      if (::stat(j.config.c_str(), &st) == 0) throw std::runtime_error(std::string("--config: ") + e.what());
    }
    try {
      if (read) {
        file = toml::parse(text, j.config);
        table = &file;
      }
    } catch (const toml::parse_error&) {
      // The worker reports a file it cannot parse, with the line.
    }
  }
  std::string origin;
  if (value_of(j, table, "parallel.layout", &origin) != "auto") return "";
  const std::string layout_origin = origin;
  const std::string cluster = value_of(j, table, "parallel.cluster", &origin);
  if (cluster.empty())
    throw std::runtime_error(layout_origin + ": parallel.layout = \"auto\" needs parallel.cluster: a preset "
                             "(dgx-a100-80gb, dgx-h100, dgx-h200) or a cluster file (smp-plan --calibrate FILE "
                             "writes one for this machine)");
  if (table)
    for (const std::string& key : kPlannedKeys)
      if (table->at_path(key))
        throw std::runtime_error(j.config + ": " + key + ": set by the job while parallel.layout = \"auto\" leaves "
                                 "it to the plan: drop one of them");
  return cluster;
}

namespace {

// The planner (plan/, <smp/plan.h>), loaded into this process when a job asks
// for a plan: libsmp_plan_job.so links the core and LibTorch, which
// smp-launch does not carry otherwise (it starts in milliseconds). It lies in
// lib/smp/ beside the core's libraries, as bin/ is beside lib/ in the
// build and in an installed tree.
using PlanJobJson = char* (*)(const char*, int*);

PlanJobJson planner(const std::string& why) {
  static PlanJobJson entry = nullptr;
  if (entry) return entry;
  const std::string self = default_worker_path();
  const std::string path = self.substr(0, self.rfind('/')) + "/../" SMP_LIBDIR "/smp/libsmp_plan_job.so";
  void* lib = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) throw std::runtime_error(why + ": cannot load the planner: " + ::dlerror());
  entry = reinterpret_cast<PlanJobJson>(::dlsym(lib, "smp_plan_job_json"));
  if (!entry) throw std::runtime_error(why + ": " + path + " has no smp_plan_job_json");
  return entry;
}

}  // namespace

std::vector<std::string> planned_layout(const std::string& cluster, int world,
                                        const std::vector<std::string>& worker_args, const std::string& why) {
  const JobArgs j = job_args(worker_args);
  if (j.config.empty()) throw std::runtime_error(why + ": the plan needs the job's --config");
  const nlohmann::json request = {{"cluster", cluster}, {"world", world}, {"config", j.config},
                                  {"plugin", j.plugin}, {"sets", j.sets}, {"top", 1}};
  int ok = 0;
  char* answer = planner(why)(request.dump().c_str(), &ok);
  if (!answer) throw std::runtime_error(why + ": the planner ran out of memory");
  const std::string out = answer;
  std::free(answer);
  if (!ok) throw std::runtime_error(why + ": " + out);
  const nlohmann::json plan = nlohmann::json::parse(out);
  if (plan["top"].empty()) throw std::runtime_error(why + ": no layout fits");
  const nlohmann::json& best = plan["top"][0];
  std::vector<std::string> chosen = best["sets"].get<std::vector<std::string>>();
  for (const auto& mine : j.sets)
    for (const auto& theirs : chosen)
      if (key_of(mine) == key_of(theirs))
        throw std::runtime_error(why + ": the plan chooses " + key_of(theirs) + ", which the job sets (--set " + mine +
                                 "): leave it to the plan or set the layout yourself");
  std::cerr << "smp-launch: " << why << ": " << best["layout"].get<std::string>() << ", predicted "
            << best["step_seconds"].get<double>() << " s per step (" << plan["candidates"].get<int64_t>()
            << " layouts predicted); running it with";
  for (const auto& s : chosen) std::cerr << " --set " << s;
  std::cerr << std::endl;
  return chosen;
}

}  // namespace smp::launch
