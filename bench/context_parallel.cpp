#include "context_parallel.h"

#include "jobs.h"

#include <algorithm>
#include <cmath>
#include <iostream>

namespace bench {

namespace {

// The model at sequence `seq`: the bench model's layers, narrower, so that
// long sequences fit this machine; batch `batch`, one microbatch.
std::vector<std::string> model_at(const ContextParallelOptions& o, int64_t seq, int64_t batch) {
  return with_extra(o.overrides, {"model.hidden=128", "model.heads=4", "model.layers=2", "model.seq_len=" + std::to_string(seq),
                            "train.batch_size=" + std::to_string(batch), "parallel.microbatches=1"});
}

// The largest peak activation bytes of any rank, NaN when the job failed.
double peak_activations(const JobResult& r) {
  if (r.exit_code != 0 || !r.summary.is_object() || !r.summary.contains("peak_activation_bytes"))
    return std::numeric_limits<double>::quiet_NaN();
  double peak = 0;
  for (const auto& v : r.summary["peak_activation_bytes"]) peak = std::max(peak, v.get<double>());
  return peak;
}

JobResult run_cp(const ContextParallelOptions& o, int cp, const std::vector<std::string>& sets, const std::string& label) {
  Job j{label, false, cp, o.config, with_extra(sets, {"parallel.cp=" + std::to_string(cp)})};
  wait_for_quiet_cores(o.quiet_cores, o.job_wait_s);
  JobResult r = run_job(j);
  std::cerr << "smp-bench context-parallel: " << label << " -> "
            << (r.exit_code == 0 ? human_bytes(peak_activations(r)) + " peak activations" : std::string("FAILED"))
            << "\n";
  if (r.exit_code != 0) std::cerr << r.output << "\n";
  return r;
}

json memory_part(const ContextParallelOptions& o) {
  json rows = json::array();
  double base = 0;
  for (int cp : {1, 2, 4}) {
    const JobResult r = run_cp(o, cp, model_at(o, o.memory_seq, 2), "memory cp" + std::to_string(cp));
    const double peak = peak_activations(r);
    if (cp == 1) base = peak;
    const double ratio = peak / base;
    json per_rank = r.summary.is_object() ? r.summary.value("peak_activation_bytes", json()) : json();
    rows.push_back({{"cp", cp},
                    {"ok", r.exit_code == 0},
                    {"peak_activation_bytes_per_rank", per_rank},
                    {"largest_rank_bytes", peak},
                    {"over_cp1", ratio},
                    {"goal", "<= 1/cp + 10% (" + fmt(1.1 / cp, 3) + ")"},
                    {"goal_met", ratio <= 1.1 / cp},
                    {"competing_cores", r.competing_cores}});
  }
  return {{"seq_len", o.memory_seq}, {"global_batch", 2}, {"rows", rows}};
}

json speed_part(const ContextParallelOptions& o) {
  const auto sets = model_at(o, o.speed_seq, o.speed_batch);
  const std::vector<Job> jobs{{"cp2", false, 2, o.config, with_extra(sets, {"parallel.cp=2"})},
                              {"dp2", false, 2, o.config, with_extra(sets, {"parallel.dp=2"})}};
  const auto m = run_repeated(jobs, o.repeat, o.quiet_cores, o.job_wait_s);
  std::vector<double> ratios;
  const size_t pairs = std::min(m[0].median_step_all.size(), m[1].median_step_all.size());
  for (size_t i = 0; i < pairs; ++i) ratios.push_back(m[0].median_step_all[i] / m[1].median_step_all[i]);
  json out = {{"seq_len", o.speed_seq}, {"global_batch", o.speed_batch}, {"pairs", pairs}};
  for (const auto& x : m)
    out[x.job.label] = {{"ok", x.ok},
                        {"median_step_seconds_per_run", x.median_step_all},
                        {"competing_cores_per_run", x.competing_cores_all},
                        {"median_step_seconds", median_from(x.median_step_all, 0)}};
  out["cp2_over_dp2_paired_ratios"] = ratios;
  out["cp2_over_dp2_median_ratio"] = median_from(ratios, 0);
  return out;
}

json longest_part(const ContextParallelOptions& o) {
  const double budget = o.budget_mib * 1024 * 1024;
  json out = {{"budget_bytes_per_rank", budget}, {"global_batch", 1}};
  for (int cp : {1, 4}) {
    json tried = json::array();
    int64_t longest = 0;
    for (int64_t seq = 256; seq <= o.longest_max; seq *= 2) {
      const JobResult r = run_cp(o, cp, with_extra(model_at(o, seq, 1), {"train.steps=2"}),
                                 "longest cp" + std::to_string(cp) + " seq " + std::to_string(seq));
      const double peak = peak_activations(r);
      tried.push_back({{"seq_len", seq}, {"ok", r.exit_code == 0}, {"largest_rank_bytes", peak}});
      if (!(peak <= budget)) break;
      longest = seq;
    }
    out["cp" + std::to_string(cp)] = {{"longest_seq_len", longest}, {"tried", tried}};
  }
  const double l1 = out["cp1"]["longest_seq_len"], l4 = out["cp4"]["longest_seq_len"];
  out["cp4_over_cp1"] = l1 > 0 ? l4 / l1 : 0.0;
  return out;
}

}  // namespace

json run_context_parallel(const ContextParallelOptions& o) {
  json result;
  result["model"] = "bench/configs/gpt-bench.toml with hidden 128, 4 heads, 2 layers, fp32, one microbatch";
  result["memory"] = memory_part(o);
  result["speed"] = speed_part(o);
  result["longest"] = longest_part(o);
  return result;
}

}  // namespace bench
