#include "planned_layout.h"

#include "supervisor.h"

#include <smp/process_env.h>

#include <smp/sdk/toml_nesting.hpp>

#include <nlohmann/json.hpp>
#include <toml++/toml.h>

#include <dlfcn.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
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

namespace {

// The job's --config file, read as the worker reads it: a regular file (a
// named pipe is refused, not waited on), its size and nesting bounded before
// toml++ sees it. A file that is not there, or does not parse, is the
// worker's to report (it names the line): then no table.
bool read_job_file(const JobArgs& j, toml::table& file) {
  if (j.config.empty()) return false;
  std::string text;
  try {
    text = smp::input::read_toml_file(j.config, j.config);
  } catch (const smp::input::Error& e) {
    struct stat st {};
    if (::stat(j.config.c_str(), &st) == 0) throw std::runtime_error(std::string("--config: ") + e.what());
    return false;
  }
  try {
    file = toml::parse(text, j.config);
    return true;
  } catch (const toml::parse_error&) {
    return false;
  }
}

}  // namespace

std::string auto_layout_cluster(const std::vector<std::string>& worker_args) {
  const JobArgs j = job_args(worker_args);
  toml::table file;
  const toml::table* table = read_job_file(j, file) ? &file : nullptr;
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

namespace {

// What an [elastic.layouts] entry may set: the layout's own keys in [parallel].
const std::vector<std::string> kElasticLayoutKeys = {"tp", "pp", "dp", "cp", "ep", "microbatches", "schedule",
                                                     "virtual_stages", "zero"};

// The --set lines of the job file's [elastic.layouts] entries, by world size;
// every key and value checked, refused naming it.
std::map<int, std::vector<std::string>> elastic_layouts(const JobArgs& j, const toml::table* file) {
  std::map<int, std::vector<std::string>> out;
  if (!file || !file->contains("elastic")) return out;
  const std::string at = j.config + ": ";
  const toml::table* elastic = (*file)["elastic"].as_table();
  if (!elastic) throw std::runtime_error(at + "elastic: expected a table ([elastic])");
  for (auto&& [k, v] : *elastic)
    if (k.str() != "layouts")
      throw std::runtime_error(at + "elastic." + std::string(k.str()) + ": unknown key (smp-launch reads elastic.layouts)");
  const toml::table* layouts = (*elastic)["layouts"].as_table();
  if (!layouts) throw std::runtime_error(at + "elastic.layouts: expected a table of layouts by world size");
  for (auto&& [k, v] : *layouts) {
    const std::string world_text(k.str());
    const std::string name = "elastic.layouts." + world_text;
    if (world_text.empty() || world_text.size() > 7 || world_text.find_first_not_of("0123456789") != std::string::npos ||
        world_text[0] == '0' ||
        std::stoi(world_text) < 1 || std::stoi(world_text) > smp::kMaxWorldSize)
      throw std::runtime_error(at + name + ": expected a world size (a number of ranks in [1, " +
                               std::to_string(smp::kMaxWorldSize) + "]) as the key");
    const toml::table* entry = v.as_table();
    if (!entry) throw std::runtime_error(at + name + ": expected a table of [parallel] keys, e.g. { pp = 2, dp = 1 }");
    std::vector<std::string> sets;
    for (auto&& [key, value] : *entry) {
      const std::string kname(key.str());
      if (std::find(kElasticLayoutKeys.begin(), kElasticLayoutKeys.end(), kname) == kElasticLayoutKeys.end())
        throw std::runtime_error(at + name + "." + kname + ": not a layout key (tp, pp, dp, cp, ep, microbatches, "
                                 "schedule, virtual_stages, zero)");
      if (const auto i = value.value_exact<int64_t>()) {
        if (*i < 0 || *i > smp::kMaxWorldSize)
          throw std::runtime_error(at + name + "." + kname + ": " + std::to_string(*i) + " is out of range");
        sets.push_back("parallel." + kname + "=" + std::to_string(*i));
      } else if (const auto str = value.value_exact<std::string>()) {
        if (str->empty() || str->size() > 64 || str->find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_-") != std::string::npos)
          throw std::runtime_error(at + name + "." + kname + ": expected a name such as \"1f1b\"");
        sets.push_back("parallel." + kname + "=\"" + *str + "\"");
      } else {
        throw std::runtime_error(at + name + "." + kname + ": expected an integer or a name");
      }
    }
    out[std::stoi(world_text)] = sets;
  }
  return out;
}

int64_t integer_of(const JobArgs& j, const toml::table* file, const std::string& key, std::string* origin) {
  for (auto it = j.sets.rbegin(); it != j.sets.rend(); ++it)
    if (key_of(*it) == key) {
      *origin = "--set " + *it;
      try {
        return std::stoll(text_of(*it));
      } catch (const std::exception&) {
        return 0;  // the worker refuses it, naming it
      }
    }
  if (file)
    if (const auto v = file->at_path(key).value<int64_t>()) {
      *origin = j.config;
      return *v;
    }
  *origin = "its default";
  return 0;
}

}  // namespace

void check_elastic_job(const std::vector<std::string>& worker_args) {
  const JobArgs j = job_args(worker_args);
  toml::table file;
  const toml::table* table = read_job_file(j, file) ? &file : nullptr;
  std::string origin;
  std::string snapshot_origin;
  if (integer_of(j, table, "run.checkpoint_every", &origin) <= 0 &&
      integer_of(j, table, "run.snapshot_every", &snapshot_origin) <= 0)
    throw std::runtime_error("an elastic job (--nnodes MIN:MAX) re-forms from its last committed checkpoint, and "
                             "run.checkpoint_every is 0 (" + origin + "): set it, e.g. --set run.checkpoint_every=100, "
                             "or keep snapshots in memory (run.snapshot_every)");
  elastic_layouts(j, table);  // refused now, by name, rather than at the first re-formation
}

std::vector<std::string> elastic_layout(int world, const std::vector<std::string>& worker_args) {
  const JobArgs j = job_args(worker_args);
  toml::table file;
  const toml::table* table = read_job_file(j, file) ? &file : nullptr;
  const auto layouts = elastic_layouts(j, table);
  if (auto it = layouts.find(world); it != layouts.end()) return it->second;
  const std::string cluster = auto_layout_cluster(worker_args);
  if (!cluster.empty()) {
    std::vector<std::string> sets =
        planned_layout(cluster, world, worker_args, "a world of " + std::to_string(world) + " ranks on " + cluster);
    sets.push_back("parallel.layout=\"planned\"");
    return sets;
  }
  if (!layouts.empty()) {
    std::string listed;
    for (const auto& [w, sets] : layouts) listed += (listed.empty() ? "" : ", ") + std::to_string(w);
    throw std::runtime_error("no layout for a world of " + std::to_string(world) + " ranks: " + j.config +
                             " lists [elastic.layouts] for " + listed +
                             " only; add one for " + std::to_string(world) +
                             ", or set parallel.layout = \"auto\" to plan it");
  }
  return {};  // the job's own layout, parallel.dp derived from the world
}

std::string job_digest(const std::vector<std::string>& worker_args) {
  const JobArgs j = job_args(worker_args);
  // The plugin by its file name: installs may differ in where they put it.
  std::string text = j.plugin.substr(j.plugin.rfind('/') + 1);
  for (const auto& set : j.sets) text += '\n' + set;
  if (!j.config.empty()) {
    try {
      text += '\n' + smp::input::read_toml_file(j.config, j.config);
    } catch (const std::exception&) {
      text += "\n(unreadable)";  // the worker reports it
    }
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016zx", std::hash<std::string>{}(text));
  return hex;
}

}  // namespace smp::launch
