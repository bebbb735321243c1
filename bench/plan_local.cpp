#include "plan_local.h"

#include "jobs.h"
#include "plan/job_shape.h"
#include "plan/search.h"

#include <smp/config.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iostream>
#include <limits>
#include <numeric>
#include <sstream>
#include <stdexcept>

namespace bench {

namespace {

namespace plan = smp::plan;

struct Model {
  std::string name, config, plugin;
  int64_t batch;
  plan::SearchOptions search;
};

std::vector<Model> models() {
  const std::string dir = paths().source_dir + "/bench/configs/";
  Model gpt{"gpt", dir + "gpt-bench.toml", "gpt", 8, {}};
  gpt.search.world = 2;
  gpt.search.recompute = {false};
  Model moe{"moe", dir + "moe-bench.toml", "moe", 16, {}};
  moe.search.world = 2;
  moe.search.recompute = {false};
  moe.search.tp = 1, moe.search.pp = 1;  // dp 2: ep 1 against ep 2
  moe.search.zero_stages = {0, 1};
  return {gpt, moe};
}

std::vector<double> ranks_of(const std::vector<double>& v) {
  std::vector<size_t> order(v.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return v[a] < v[b]; });
  std::vector<double> rank(v.size());
  for (size_t i = 0; i < order.size();) {
    size_t j = i;
    while (j + 1 < order.size() && v[order[j + 1]] == v[order[i]]) ++j;
    for (size_t k = i; k <= j; ++k) rank[order[k]] = 0.5 * static_cast<double>(i + j) + 1;
    i = j + 1;
  }
  return rank;
}

// Per model: the predictions against the measurements.
json compare(const json& layouts) {
  std::vector<double> predicted, measured, errors;
  std::string best_predicted, best_measured;
  double best_p = std::numeric_limits<double>::infinity(), best_m = best_p, measured_of_best_p = 0;
  for (const json& l : layouts) {
    if (!l.contains("measured_step_seconds")) continue;
    const double p = l["predicted"]["step_seconds"], m = l["measured_step_seconds"];
    predicted.push_back(p), measured.push_back(m), errors.push_back(std::abs(p - m) / m);
    // The search's order: the first of equal predictions is the one it lists first.
    if (p < best_p) best_p = p, best_predicted = l["layout"], measured_of_best_p = m;
    if (m < best_m) best_m = m, best_measured = l["layout"];
  }
  const double rho = spearman(predicted, measured), mae = median_from(errors, 0),
               top = measured_of_best_p / best_m - 1;
  return {{"layouts_measured", predicted.size()},
          {"spearman", rho},
          {"median_abs_error", mae},
          {"largest_abs_error", errors.empty() ? 0.0 : *std::max_element(errors.begin(), errors.end())},
          {"predicted_best", best_predicted},
          {"predicted_best_measured_seconds", measured_of_best_p},
          {"measured_best", best_measured},
          {"measured_best_seconds", best_m},
          {"predicted_best_over_measured_best", top},
          {"goals", {{"spearman", ">= 0.8"}, {"median_abs_error", "<= 0.15"}, {"predicted_best_over_measured_best", "<= 0.05"}}},
          {"goals_met", rho >= 0.8 && mae <= 0.15 && top <= 0.05}};
}

}  // namespace

double spearman(const std::vector<double>& x, const std::vector<double>& y) {
  const size_t n = x.size();
  if (n < 2 || y.size() != n) return std::numeric_limits<double>::quiet_NaN();
  const std::vector<double> rx = ranks_of(x), ry = ranks_of(y);
  const double mx = std::accumulate(rx.begin(), rx.end(), 0.0) / n, my = std::accumulate(ry.begin(), ry.end(), 0.0) / n;
  double sxy = 0, sxx = 0, syy = 0;
  for (size_t i = 0; i < n; ++i)
    sxy += (rx[i] - mx) * (ry[i] - my), sxx += (rx[i] - mx) * (rx[i] - mx), syy += (ry[i] - my) * (ry[i] - my);
  return sxx > 0 && syy > 0 ? sxy / std::sqrt(sxx * syy) : std::numeric_limits<double>::quiet_NaN();
}

json run_plan_local(const PlanLocalOptions& o) {
  json result;
  json earlier;
  if (!o.measured.empty()) {
    std::ifstream in(o.measured);
    if (!in) throw std::runtime_error(o.measured + ": cannot read");
    earlier = json::parse(in);
    result["measurements_from"] = o.measured;
  }
  // This machine's cluster file: calibrated now (or given).
  std::string cluster_path = o.cluster;
  if (cluster_path.empty()) {
    cluster_path = (paths().work_dir.empty() ? std::string("/tmp") : paths().work_dir) + "/this-machine.toml";
    // On a quiet machine: the calibration is what every prediction rests on.
    const double busy = wait_for_quiet_cores(o.quiet_cores, o.job_wait_s);
    const double machine0 = machine_busy_seconds(), own0 = children_cpu_seconds();
    const CommandResult c = run_command(paths().bin_dir + "/smp-plan --calibrate " + cluster_path + " --threads 1");
    if (c.code != 0) throw std::runtime_error("smp-plan --calibrate failed:\n" + c.output);
    const double others = (machine_busy_seconds() - machine0 - (children_cpu_seconds() - own0)) / c.seconds;
    result["calibrate"] = {{"seconds", c.seconds}, {"competing_cores_before", busy}, {"competing_cores_during", others}};
    std::cerr << "smp-bench: calibrated in " << fmt(c.seconds, 1) << " s (other processes used " << fmt(others, 2)
              << " cores meanwhile)\n";
    if (others > o.quiet_cores)
      throw std::runtime_error("other processes kept " + fmt(others, 2) + " cores busy while smp-plan --calibrate "
                               "measured: its figures would be theirs too; run again on a quiet machine");
  }
  {
    std::ifstream in(cluster_path);
    std::stringstream text;
    text << in.rdbuf();
    result["cluster_file"] = text.str();
  }
  const plan::Cluster cluster = plan::load_cluster(cluster_path);
  json parts = json::object();
  std::vector<Job> jobs;
  std::vector<std::pair<std::string, size_t>> job_of;  // (model, index in its layouts)
  for (const Model& m : models()) {
    std::vector<std::string> base = o.overrides;
    base.push_back("train.batch_size=" + std::to_string(m.batch));
    const plan::Shape s = plan::shape_of_job(smp::Config::load(m.config, base), m.search.world, m.plugin);
    const plan::SearchResult found = plan::search(cluster, s, m.search);
    json part = {{"config", m.config}, {"plugin", m.plugin}, {"overrides", base}, {"candidates", found.candidates},
                 {"layouts", json::array()}};
    for (const plan::Candidate& k : found.ranked) {
      json l = {{"layout", k.layout.describe()}, {"sets", k.layout.sets(s)}, {"predicted", k.prediction.to_json()}};
      Job job{m.name + ": " + k.layout.describe(), false, m.search.world, m.config, base};
      job.plugin = m.plugin;
      for (const std::string& set : k.layout.sets(s)) job.overrides.push_back(set);
      job_of.emplace_back(m.name, part["layouts"].size());
      jobs.push_back(job);
      part["layouts"].push_back(l);
    }
    parts[m.name] = part;
  }
  if (earlier.is_null()) {
    const std::vector<Measured> measured = run_repeated(jobs, o.repeat, o.quiet_cores, o.job_wait_s);
    for (size_t i = 0; i < measured.size(); ++i) {
      json& l = parts[job_of[i].first]["layouts"][job_of[i].second];
      l["median_step_seconds_per_repeat"] = measured[i].median_step_all;
      l["competing_cores_per_repeat"] = measured[i].competing_cores_all;
      if (measured[i].ok) l["measured_step_seconds"] = median_from(measured[i].median_step_all, 0);
      else l["error_output"] = measured[i].best.output;
    }
  } else {
    for (auto& [name, part] : parts.items())
      for (json& l : part["layouts"])
        for (const json& e : earlier["models"][name]["layouts"])
          if (e["layout"] == l["layout"])
            for (const char* key : {"median_step_seconds_per_repeat", "competing_cores_per_repeat", "measured_step_seconds"})
              if (e.contains(key)) l[key] = e[key];
  }
  for (auto& [name, part] : parts.items()) {
    part["comparison"] = compare(part["layouts"]);
    const json& c = part["comparison"];
    std::cout << "smp-bench plan-local " << name << ": " << c["layouts_measured"] << " layouts, Spearman "
              << fmt(c["spearman"].get<double>(), 3) << ", median |error| "
              << fmt(100 * c["median_abs_error"].get<double>(), 1) << "%, predicted best " << c["predicted_best"]
              << " is " << fmt(100 * c["predicted_best_over_measured_best"].get<double>(), 1)
              << "% slower than the measured best " << c["measured_best"] << "\n";
  }
  result["models"] = parts;
  return result;
}

}  // namespace bench
