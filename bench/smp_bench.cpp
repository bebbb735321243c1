// smp-bench: side-by-side benchmarks of smp (see bench/README.md).
//
//   smp-bench gpt      [--steps N] [--out F]   plain LibTorch vs smp 1 rank vs dp=2 / pp=2 / tp=2
//   smp-bench pipeline [--steps N] [--out F]   pp=2, 4 schedules x m in {2,4,8} vs serial and theory
//   smp-bench tp       [--steps N] [--out F]   tp=2 with / without sequence parallelism vs serial
//   smp-bench plain-run --config C [--set k=v] --out F   (internal: the plain LibTorch loop, one process)
//
// Every smp job is a real `smp-launch ... --plugin gpt` run with one intra-op thread
// per rank; numbers come from its <run.dir>/summary.json (step_seconds = mean step
// time excluding the first step; the plain loop uses the same rule).
#include "analytic.h"
#include "checkpoint_bench.h"
#include "generate_bench.h"
#include "plan/validate.h"
#include "plan_local.h"
#include "context_parallel.h"
#include "moe_bench.h"
#include "comm_probe.h"
#include "jobs.h"
#include "plain_gpt.h"
#include "plain_encoder.h"
#include "plain_ncf.h"

#include <smp/config.h>

#include "schedule/schedule.h"
#include "schedule/schedule_simulator.h"
#include "schedule/traced_pipeline.h"

#include <ATen/Parallel.h>
#include <CLI/CLI.hpp>

#include <boost/filesystem.hpp>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>

namespace {

using bench::fmt;
using bench::Job;
using bench::with_extra;
using bench::json;
using bench::Measured;

struct Common {
  int steps = 12;
  int64_t batch = 8;
  int repeat = 1;
  std::string out;
  std::string config;
  std::vector<std::string> sets;  // extra overrides for every job
  double max_load = 1.5;
  double wait_s = 120;
  double quiet_cores = 0.5;
  double job_wait_s = 60;
};

void add_common(CLI::App* sub, Common& c, int default_steps, int64_t default_batch, const std::string& default_out) {
  c.steps = default_steps;
  c.batch = default_batch;
  c.out = default_out;
  sub->add_option("--steps", c.steps, "training steps per job (the first is excluded from timing)")
      ->capture_default_str();
  sub->add_option("--batch", c.batch, "global batch size (samples of seq_len tokens)")->capture_default_str();
  sub->add_option("--repeat", c.repeat, "run every job R times (interleaved) and keep each job's fastest run")
      ->capture_default_str();
  sub->add_option("--out", c.out, "JSON result file")->capture_default_str();
  sub->add_option("--config", c.config, "job TOML (default bench/configs/gpt-bench.toml)");
  sub->add_option("--set", c.sets, "extra config override for every job, e.g. --set train.lr=1e-3")->take_all();
  sub->add_option("--max-load", c.max_load, "wait for the 1-minute load average to drop below this first")
      ->capture_default_str();
  sub->add_option("--wait", c.wait_s, "seconds to wait at most for that")->capture_default_str();
  sub->add_option("--quiet-cores", c.quiet_cores,
                  "before each job, wait while other processes keep more than this many cores busy")
      ->capture_default_str();
  sub->add_option("--job-wait", c.job_wait_s, "seconds to wait at most for that, per job")->capture_default_str();
}

// Every job's steps, no validation, a log line per step; benchmarks that set
// each job's batch themselves start from these.
std::vector<std::string> step_overrides(const Common& c) {
  return {"train.steps=" + std::to_string(c.steps), "train.val_batches=0", "train.val_every=0", "train.log_every=1"};
}

std::vector<std::string> base_overrides(const Common& c) {
  std::vector<std::string> o = step_overrides(c);
  o.push_back("train.batch_size=" + std::to_string(c.batch));
  o.insert(o.end(), c.sets.begin(), c.sets.end());
  return o;
}

bench::Shape shape_of(const std::string& config, const std::vector<std::string>& overrides) {
  smp::Config cfg = smp::Config::load(config, overrides);
  bench::Shape m;
  m.layers = cfg.get_int("model.layers");
  m.hidden = cfg.get_int("model.hidden");
  m.heads = cfg.get_int("model.heads");
  m.seq = cfg.get_int("model.seq_len");
  m.vocab = cfg.get_int("model.vocab");
  m.ffn = cfg.has("model.ffn") ? cfg.get_int("model.ffn") : 4 * m.hidden;
  return m;
}

json shape_json(const bench::Shape& m) {
  return {{"layers", m.layers}, {"hidden", m.hidden}, {"heads", m.heads}, {"seq_len", m.seq},
          {"vocab", m.vocab},   {"ffn", m.ffn},       {"parameters", bench::param_count(m)},
          {"parameter_bytes", 4 * bench::param_count(m)}};
}

// comm_bytes_rank0 {axis: {transport: {op: bytes}}} (counted by the transport)
// / steps as {axis: {"transport op": bytes}}, dropping zero entries and the
// end-of-run "world" gather (one-off, for the summary itself).
json per_step_comm(const json& summary, int steps) {
  json out = json::object();
  if (!summary.contains("comm_bytes_rank0")) return out;
  for (auto& [axis, transports] : summary["comm_bytes_rank0"].items()) {
    if (axis == "world") continue;
    for (auto& [transport, ops] : transports.items())
      for (auto& [op, v] : ops.items()) {
        double b = v.get<double>();
        if (b > 0) out[axis][transport + " " + op] = b / steps;
      }
  }
  return out;
}
double axis_total(const json& per_step, const std::string& axis) {
  double t = 0;
  if (per_step.contains(axis))
    for (auto& [op, v] : per_step[axis].items()) t += v.get<double>();
  return t;
}

std::string sci(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1e", v);
  return buf;
}

double max_abs_diff(const json& a, const json& b) {
  double d = 0;
  if (!a.is_array() || !b.is_array()) return NAN;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    d = std::max(d, std::abs(a[i].get<double>() - b[i].get<double>()));
  return d;
}

json run_record(const Measured& m, double peak_1thread, int ranks) {
  json r;
  r["label"] = m.job.label;
  r["ranks"] = ranks;
  r["ok"] = m.ok;
  if (!m.ok) {
    r["error_output"] = m.best.output;
    return r;
  }
  const json& s = m.best.summary;
  const double step = s["step_seconds"].get<double>();
  const double flops = s["model_flops_per_step"].get<double>();
  r["step_seconds"] = step;
  r["step_seconds_all_repeats"] = m.step_seconds_all;
  r["tokens_per_s"] = s["tokens_per_s"];
  r["model_flops_per_step"] = flops;
  r["mfu"] = flops / step / (ranks * peak_1thread);
  if (s.contains("mfu")) r["mfu_worker_reported"] = s["mfu"];
  if (s.contains("peak_flops_per_rank")) r["peak_flops_per_rank_worker_measured"] = s["peak_flops_per_rank"];
  r["final_loss"] = s["final_loss"];
  r["losses"] = s["losses"];
  for (const char* k : {"peak_activation_bytes", "peak_memory_bytes", "layout", "phase_seconds", "mimic"})
    if (s.contains(k)) r[k] = s[k];
  r["step_seconds_each_best_run"] = m.best.step_seconds_each;
  r["median_step_seconds_best_run"] = bench::median_from(m.best.step_seconds_each, 1);
  r["median_step_seconds_all_repeats"] = m.median_step_all;
  r["wall_seconds_incl_startup"] = m.best.wall_s;
  r["competing_cores_during_best_run"] = m.best.competing_cores;
  r["competing_cores_all_repeats"] = m.competing_cores_all;
  r["own_cpu_cores_during_best_run"] = m.best.job_cpu_cores;
  return r;
}

void finish(json& result, const Common& c) {
  result["machine_after"] = bench::machine_json();
  // Which interleaved runs were measured on a busy machine (bench/jobs.h).
  result["validity"] = bench::validity_json(c.quiet_cores);
  bench::write_json(c.out, result);
}

json start(const std::string& name, const Common& c, const bench::Shape& shape, double* peak) {
  json result;
  result["benchmark"] = name;
  result["config_file"] = c.config;
  result["model"] = shape_json(shape);
  result["steps"] = c.steps;
  result["batch_size"] = c.batch;
  result["repeat"] = c.repeat;
  result["timing_rule"] =
      "step_seconds: mean step time over steps 2..N (first step excluded, as summary.json), fastest of the "
      "repeats; median_step_seconds_*: median over steps 2..N (per-step times from rank 0's log, 1 ms resolution)";
  result["malloc_env"] = bench::paths().malloc_env;
  double load = bench::wait_for_quiet(c.max_load, c.wait_s);
  result["machine_before"] = bench::machine_json();
  result["machine_before"]["load_when_started"] = load;
  result["machine_before"]["competing_cores_1s_sample"] = bench::competing_cores_now(1.0);
  *peak = bench::gemm_peak_flops_1thread();
  result["peak_flops_per_core"] = *peak;
  result["peak_flops_method"] = "best of 5 timed fp32 at::mm (n = 512 and 1024), 1 intra-op thread, in smp-bench";
  std::cout << "measured fp32 GEMM peak: " << fmt(*peak / 1e9, 1) << " GFLOP/s per core (1 thread); load "
            << fmt(bench::load_average()[0], 2) << " on " << bench::online_cores() << " cores\n";
  return result;
}

// The JSON head of an interleaved comparison: what ran, how it is timed, and
// the machine (after waiting for it to be quiet).
json interleaved_header(const std::string& name, const Common& c, const std::vector<std::string>& overrides) {
  json result;
  result["benchmark"] = name;
  result["config_file"] = c.config;
  result["overrides"] = overrides;
  result["steps"] = c.steps;
  result["batch_size"] = c.batch;
  result["repeat"] = c.repeat;
  result["timing_rule"] = "step_seconds: mean step time over steps 2..N (first excluded, as summary.json)";
  result["malloc_env"] = bench::paths().malloc_env;
  result["machine_before"] = bench::machine_json();
  result["machine_before"]["load_when_started"] = bench::wait_for_quiet(c.max_load, c.wait_s);
  return result;
}

// ----------------------------------------------------------------------------- adapters
// A model adapter on one rank against its plain LibTorch loop (same model sizes,
// the adapter's own data code), interleaved: the median of the per-repeat ratios
// of throughput (`unit` per second, as both summaries report it).
int cmd_adapter(const Common& c, const std::string& adapter, const std::string& plain_command, const std::string& unit) {
  const auto base = base_overrides(c);
  const std::string rate = unit + "_per_s";
  json result = interleaved_header(adapter, c, base);
  Job plain{"plain-libtorch", true, 1, c.config, base};
  plain.plain_command = plain_command;
  Job one{"smp-1rank", false, 1, c.config, base};
  one.plugin = adapter;
  auto measured = bench::run_repeated({plain, one}, c.repeat, c.quiet_cores, c.job_wait_s);
  json runs = json::array();
  for (const Measured& m : measured) {
    json r = {{"label", m.job.label}, {"ok", m.ok}, {"step_seconds_per_repeat", m.step_seconds_all}};
    if (m.ok) {
      r[rate] = m.best.summary[rate];
      r["final_loss"] = m.best.summary.contains("final_loss") ? m.best.summary["final_loss"] : m.best.summary["losses"].back();
    } else {
      r["error_output"] = m.best.output;
    }
    runs.push_back(r);
  }
  result["runs"] = runs;
  std::vector<double> ratios;  // smp / plain throughput = plain / smp step time, per repeat
  for (size_t k = 0; k < std::min(measured[0].step_seconds_all.size(), measured[1].step_seconds_all.size()); ++k)
    ratios.push_back(measured[0].step_seconds_all[k] / measured[1].step_seconds_all[k]);
  const double med = bench::median_from(ratios, 0);
  result["smp_1rank_over_plain_paired"] = {
      {"per_repeat", ratios}, {"median", med},
      {"note", unit + "/s ratio smp-1rank / plain within each repeat (the two ran back to back)"}};
  std::cout << "\nsmp-bench " << adapter << ": batch " << c.batch << ", " << c.steps
            << " steps (first excluded), 1 thread\n";
  for (const Measured& m : measured)
    std::cout << "  " << m.job.label << ": "
              << (m.ok ? fmt(m.best.summary[rate].get<double>() / 1e3, 1) + "k " + unit + "/s"
                       : std::string("FAILED\n") + m.best.output)
              << "\n";
  std::cout << "smp 1 rank / plain, median of " << ratios.size() << " back-to-back pairs: " << fmt(med, 3) << "\n";
  if (!measured[0].ok || !measured[1].ok) return 1;
  finish(result, c);
  return 0;
}

// ----------------------------------------------------------------------------- eager
// The PyTorch-eager peer: Debian's python3-torch must be importable, and it
// runs at the bench shape and at a small one where per-op overhead dominates.
void require_python_torch(const std::string& command) {
  if (std::system("/usr/bin/python3 -c 'import torch' > /dev/null 2>&1") != 0)
    throw std::runtime_error("smp-bench " + command +
                             ": /usr/bin/python3 cannot import torch (apt-get install python3-torch)");
}
struct EagerShape {
  std::string name;
  std::vector<std::string> overrides;
  double goal;  // issue 14: smp 1 rank / eager tokens/s at this shape
};
const std::vector<EagerShape>& eager_shapes() {
  static const std::vector<EagerShape> shapes = {
      {"bench (hidden 256, seq 128)", {}, 1.05}, {"small (hidden 64, seq 64)", {"model.hidden=64", "model.seq_len=64"}, 1.3}};
  return shapes;
}
// A goal counts as met only on the median of at least this many interleaved pairs.
constexpr size_t kGoalPairs = 10;  // a goal counts only on the median of this many pairs or more

// smp on one rank and the plain LibTorch loop against two PyTorch-eager loops in
// Python (bench/eager_gpt.py under Debian's python3-torch: the same LibTorch
// version): the one with separate q, k and v projections and the leanest one a
// user would write (--fused-qkv, as nanoGPT: one qkv GEMM). All four time the
// same step: zeroing, sampling the batch, forward, backward, clipping, AdamW,
// reading the loss. Interleaved, on the bench config and on a small shape where
// per-op overhead dominates (hidden 64, sequence 64): medians of the per-repeat
// ratios to each eager loop.
int cmd_eager(const Common& c) {
  require_python_torch("eager");
  const auto base = base_overrides(c);
  json result = interleaved_header("eager", c, base);
  result["timed_step"] = "every job: zero the gradients, sample the batch, forward, backward, global-norm clipping, "
                         "AdamW, read the loss; mean over steps 2..N";
  const auto& shapes = eager_shapes();
  json per_shape = json::array();
  std::cout << "\nsmp-bench eager: batch " << c.batch << ", " << c.steps << " steps (first excluded), 1 thread\n";
  for (const EagerShape& shape : shapes) {
    const auto o = with_extra(base, shape.overrides);
    Job eager{"pytorch-eager", true, 1, c.config, o};
    eager.python_script = bench::paths().source_dir + "/bench/eager_gpt.py";
    Job fused = eager;
    fused.label = "pytorch-eager-fused";
    fused.python_args = {"--fused-qkv"};
    Job plain{"plain-libtorch", true, 1, c.config, o};
    Job one{"smp-1rank", false, 1, c.config, o};
    auto measured = bench::run_repeated({eager, fused, plain, one}, c.repeat, c.quiet_cores, c.job_wait_s);
    json runs = json::array();
    for (const Measured& m : measured) {
      json r = {{"label", m.job.label}, {"ok", m.ok}, {"step_seconds_per_repeat", m.step_seconds_all}};
      if (m.ok) r["tokens_per_s"] = m.best.summary["tokens_per_s"], r["final_loss"] = m.best.summary["losses"].back();
      else r["error_output"] = m.best.output;
      runs.push_back(r);
    }
    json entry = {{"shape", shape.name}, {"overrides", o}, {"runs", runs}, {"targets", json::object()}};
    std::cout << "  " << shape.name << ":\n";
    // Job j's tokens/s over job b's within each repeat (b's step time / j's), under
    // "<j>_over_<name>_paired"; for smp-1rank also the goal.
    auto paired = [&](size_t j, size_t b, const std::string& name) {
      std::vector<double> ratios;
      for (size_t k = 0; k < std::min(measured[b].step_seconds_all.size(), measured[j].step_seconds_all.size()); ++k)
        ratios.push_back(measured[b].step_seconds_all[k] / measured[j].step_seconds_all[k]);
      const double med = bench::median_from(ratios, 0);
      const std::string key = measured[j].job.label + "_over_" + name;
      entry[key + "_paired"] = {{"per_repeat", ratios}, {"median", med}};
      std::string verdict;
      if (measured[j].job.label == "smp-1rank") {
        const bool met = ratios.size() >= kGoalPairs && med >= shape.goal;
        entry["targets"][key] = {{"target", shape.goal}, {"measured_paired_median", med}, {"pairs", ratios.size()},
                                 {"min_pairs", kGoalPairs}, {"met", met}};
        verdict = " (goal >= " + fmt(shape.goal, 2) + " over >= " + std::to_string(kGoalPairs) + " pairs: " +
                  (met ? "met" : "NOT met") + ")";
      }
      std::cout << "    " << measured[j].job.label << " / " << measured[b].job.label << " tokens/s, median of "
                << ratios.size() << " back-to-back repeats: " << fmt(med, 3) << verdict << "\n";
    };
    for (size_t j : {1, 2, 3}) paired(j, 0, "eager");
    for (size_t j : {2, 3}) paired(j, 1, "eager-fused");
    for (const Measured& m : measured)
      if (!m.ok) {
        std::cout << m.job.label << " FAILED\n" << m.best.output << "\n";
        return 1;
      }
    per_shape.push_back(entry);
  }
  result["shapes"] = per_shape;
  finish(result, c);
  return 0;
}

// ------------------------------------------------------------------ op-profile
// One smp rank (run.profile_ops) and the PyTorch-eager step (eager_gpt.py
// --fused-qkv --profile-ops) of the same GPT, op by op over steps 3..N, at the bench shape
// and at hidden 64 / sequence 64: per op name the calls and self CPU time per
// step on each side. The two sides' profilers differ (smp: a RecordFunction
// observer; eager: torch.autograd.profiler), so calls compare exactly and
// times only roughly (each profiler adds its own cost per op).
int cmd_op_profile(const Common& c) {
  require_python_torch("op-profile");
  const auto base = base_overrides(c);
  json result = interleaved_header("op-profile", c, base);
  const auto& shapes = eager_shapes();
  json per_shape = json::array();
  for (const auto& [shape, extra, goal] : shapes) {
    auto o = base;
    o.insert(o.end(), extra.begin(), extra.end());
    Job eager{"pytorch-eager-fused", true, 1, c.config, o};
    eager.python_script = bench::paths().source_dir + "/bench/eager_gpt.py";
    eager.python_args = {"--fused-qkv"};  // the peer smp's one-rank goal names
    eager.profile_ops = true;
    Job one{"smp-1rank", false, 1, c.config, o};
    one.profile_ops = true;
    const bench::JobResult e = bench::run_job(eager), s = bench::run_job(one);
    if (e.op_profile.is_null() || s.op_profile.is_null())
      throw std::runtime_error("op-profile: a profile is missing\n" + e.output + "\n" + s.output);
    std::map<std::string, std::pair<json, json>> by_name;  // name -> (smp, eager)
    for (const auto& op : s.op_profile["ops"]) by_name[op["name"]].first = op;
    for (const auto& op : e.op_profile["ops"]) by_name[op["name"]].second = op;
    auto num = [](const json& op, const char* k) { return op.is_null() ? 0.0 : op[k].get<double>(); };
    std::vector<std::pair<double, std::string>> order;
    double smp_calls = 0, eager_calls = 0, smp_self = 0, eager_self = 0;
    for (const auto& [name, both] : by_name) {
      order.push_back({std::max(num(both.first, "self_us"), num(both.second, "self_us")), name});
      smp_calls += num(both.first, "calls"), eager_calls += num(both.second, "calls");
      smp_self += num(both.first, "self_us"), eager_self += num(both.second, "self_us");
    }
    std::sort(order.rbegin(), order.rend());
    json ops = json::array();
    std::vector<std::vector<std::string>> rows;
    for (const auto& [_, name] : order) {
      const auto& [sm, eg] = by_name[name];
      ops.push_back({{"name", name}, {"smp_calls", num(sm, "calls")}, {"eager_calls", num(eg, "calls")},
                     {"smp_self_us", num(sm, "self_us")}, {"eager_self_us", num(eg, "self_us")}});
      if (rows.size() < 30)
        rows.push_back({name.substr(0, 60), fmt(num(sm, "calls"), 0), fmt(num(eg, "calls"), 0),
                        fmt(num(sm, "self_us") / 1e3, 2), fmt(num(eg, "self_us") / 1e3, 2)});
    }
    per_shape.push_back({{"shape", shape},
                         {"overrides", o},
                         {"ops_calls_per_step", {{"smp", smp_calls}, {"eager", eager_calls}}},
                         {"self_ms_per_step", {{"smp", smp_self / 1e3}, {"eager", eager_self / 1e3}}},
                         {"step_seconds_profiled", {{"smp", s.summary["step_seconds"]}, {"eager", e.summary["step_seconds"]}}},
                         {"ops", ops}});
    std::cout << "\n" << shape << ": op calls per step smp " << fmt(smp_calls, 0) << ", eager " << fmt(eager_calls, 0)
              << "; profiled self time per step smp " << fmt(smp_self / 1e3, 1) << " ms, eager "
              << fmt(eager_self / 1e3, 1) << " ms\n";
    bench::print_table({"op", "smp calls", "eager calls", "smp ms", "eager ms"}, rows);
  }
  result["shapes"] = per_shape;
  result["note"] = "per step, steps 3..N; smp: RecordFunction observer on the training thread (run.profile_ops); "
                   "eager: torch.autograd.profiler (legacy) over the same steps; times include each profiler's cost";
  finish(result, c);
  return 0;
}

// ----------------------------------------------------------------------------- gpt
int cmd_gpt(const Common& c) {
  const auto base = base_overrides(c);
  const bench::Shape shape = shape_of(c.config, base);
  double peak = 0;
  json result = start("gpt", c, shape, &peak);

  std::vector<Job> jobs{
      {"plain-libtorch", true, 1, c.config, base},
      {"smp-1rank", false, 1, c.config, base},
      {"smp-dp2", false, 2, c.config, with_extra(base, {"parallel.dp=2"})},
      {"smp-pp2-1f1b-m4", false, 2, c.config,
       with_extra(base, {"parallel.pp=2", "parallel.microbatches=4", "parallel.schedule=1f1b"})},
      {"smp-tp2", false, 2, c.config, with_extra(base, {"parallel.tp=2"})},
      // dp = 2 with the all-reduce through Gloo over loopback instead of shared memory.
      {"smp-dp2-gloo", false, 2, c.config, with_extra(base, {"parallel.dp=2", "comm.shm_mb=0"})},
      // Weak scaling (as Megatron and DeepSpeed report data
      // parallelism): each rank keeps the one-rank batch, the global batch doubles.
      {"smp-dp2-weak", false, 2, c.config, with_extra(base, {"parallel.dp=2", "train.batch_size=" + std::to_string(2 * c.batch)})},
  };
  auto measured = bench::run_repeated(jobs, c.repeat, c.quiet_cores, c.job_wait_s);

  const Measured& plain = measured[0];
  const Measured& one = measured[1];
  const double plain_tps = plain.ok ? plain.best.summary["tokens_per_s"].get<double>() : NAN;
  const double one_tps = one.ok ? one.best.summary["tokens_per_s"].get<double>() : NAN;

  json runs = json::array();
  std::vector<std::vector<std::string>> rows;
  for (size_t i = 0; i < measured.size(); ++i) {
    const Measured& m = measured[i];
    json r = run_record(m, peak, m.job.nproc);
    if (m.ok) {
      const double tps = m.best.summary["tokens_per_s"].get<double>();
      r["ratio_to_plain"] = tps / plain_tps;
      r["speedup_vs_smp_1rank"] = tps / one_tps;
      // (The weak-scaling job trains on other batches: no loss comparison.)
      r["max_abs_loss_diff_vs_plain"] = plain.ok && m.job.label != "smp-dp2-weak"
                                            ? max_abs_diff(m.best.summary["losses"], plain.best.summary["losses"])
                                            : NAN;
      json comm = per_step_comm(m.best.summary, c.steps), analytic;
      const std::string l = m.job.label;
      std::string axis;
      if (l.rfind("smp-dp2", 0) == 0) axis = "dp", analytic = bench::dp_bytes_per_step(shape, 2);
      if (l.rfind("smp-pp2", 0) == 0) axis = "pp", analytic = bench::pp_bytes_per_step_rank0(shape, c.batch / 4, 4, 2, 1);
      if (l == "smp-tp2") axis = "tp", analytic = bench::tp_bytes_per_step(shape, c.batch, 2, false);
      if (!m.job.plain) r["comm_bytes_per_step_rank0_measured"] = comm;
      if (!axis.empty()) {
        r["comm_bytes_per_step_rank0_analytic"] = analytic;
        const double meas = axis_total(comm, axis), ana = analytic["total_" + axis].get<double>();
        r["comm_check"] = {{"axis", axis}, {"measured", meas}, {"analytic", ana}, {"measured_over_analytic", meas / ana}};
      }
      rows.push_back({l, std::to_string(m.job.nproc), fmt(1000 * m.best.summary["step_seconds"].get<double>(), 1),
                      fmt(1000 * r["median_step_seconds_best_run"].get<double>(), 0), fmt(tps, 0), fmt(tps / plain_tps, 3), fmt(tps / one_tps, 3), fmt(100 * r["mfu"].get<double>(), 1),
                      axis.empty() ? "-" : bench::human_bytes(r["comm_check"]["measured"].get<double>()),
                      axis.empty() ? "-" : bench::human_bytes(r["comm_check"]["analytic"].get<double>()),
                      sci(r["max_abs_loss_diff_vs_plain"].get<double>()), fmt(m.best.competing_cores, 2)});
    } else {
      rows.push_back({m.job.label, std::to_string(m.job.nproc), "FAILED"});
    }
    runs.push_back(r);
  }
  result["runs"] = runs;
  // Paired comparisons: within repeat k every job ran back to back, so a[k] / b[k] is robust to the
  // machine's slow drift. Step-time ratios: slower / faster = tokens/s faster / slower.
  auto paired = [](const std::vector<double>& a, const std::vector<double>& b) {
    std::vector<double> r;
    for (size_t k = 0; k < std::min(a.size(), b.size()); ++k) r.push_back(a[k] / b[k]);
    return r;
  };
  const std::vector<double> paired_mean = paired(plain.step_seconds_all, one.step_seconds_all);
  const std::vector<double> paired_median = paired(plain.median_step_all, one.median_step_all);
  const double pm = bench::median_from(paired_mean, 0), pmed = bench::median_from(paired_median, 0);
  const std::vector<double> dp_paired = paired(one.step_seconds_all, measured[2].step_seconds_all);
  const double dp_pm = bench::median_from(dp_paired, 0);
  result["dp2_over_smp_1rank_paired"] = {
      {"per_repeat_ratio_of_means", dp_paired},
      {"median_of_ratio_of_means", dp_pm},
      {"note", "tokens/s ratio smp-dp2 / smp-1rank within each repeat (same global batch)"}};
  // Weak scaling: tokens/s of dp = 2 at twice the global batch over one rank.
  std::vector<double> weak_paired = paired(one.step_seconds_all, measured[6].step_seconds_all);
  for (double& x : weak_paired) x *= 2;
  const double weak_pm = bench::median_from(weak_paired, 0);
  const double weak = measured[6].ok ? measured[6].best.summary["tokens_per_s"].get<double>() / one_tps : NAN;
  result["dp2_weak_over_smp_1rank_paired"] = {
      {"per_repeat_ratio_of_means", weak_paired},
      {"median_of_ratio_of_means", weak_pm},
      {"note", "tokens/s ratio smp-dp2-weak (global batch 2B, B per rank) / smp-1rank (batch B) within each repeat"}};
  result["smp_1rank_over_plain_paired"] = {
      {"per_repeat_ratio_of_means", paired_mean},
      {"per_repeat_ratio_of_medians", paired_median},
      {"median_of_ratio_of_means", pm},
      {"median_of_ratio_of_medians", pmed},
      {"note", "tokens/s ratio smp-1rank / plain for each repeat (the two ran back to back); robust to the "
               "machine's slow drift"}};
  const double r1 = one_tps / plain_tps;
  const double dp = measured[2].ok ? measured[2].best.summary["tokens_per_s"].get<double>() / one_tps : NAN;
  const bool enough = static_cast<size_t>(c.repeat) >= kGoalPairs;
  result["targets"] = {
      {"smp_1rank_over_plain",
       {{"target", 0.97}, {"measured_best_of_repeats", r1}, {"measured_paired_median", pm},
        {"measured_paired_median_of_step_medians", pmed}, {"min_pairs", kGoalPairs},
        {"met", enough && r1 >= 0.97 && pm >= 0.97}}},
      {"dp2_over_smp_1rank",
       {{"target", 1.85}, {"measured_best_of_repeats", dp}, {"measured_paired_median", dp_pm},
        {"min_pairs", kGoalPairs}, {"met", enough && dp >= 1.85 && dp_pm >= 1.85}}},
      {"dp2_weak_over_smp_1rank",
       {{"target", 1.9}, {"measured_best_of_repeats", weak}, {"measured_paired_median", weak_pm},
        {"min_pairs", kGoalPairs}, {"met", enough && weak >= 1.9 && weak_pm >= 1.9}}},
  };
  std::cout << "\nsmp-bench gpt: " << shape.layers << " layers, hidden " << shape.hidden << ", " << shape.heads
            << " heads, seq " << shape.seq << ", vocab " << shape.vocab << ", batch " << c.batch << ", " << c.steps
            << " steps (first excluded), 1 thread per rank; others = cores used by other processes during the run\n";
  bench::print_table({"run", "ranks", "ms/step", "median", "tok/s", "vs plain", "vs smp-1", "MFU%", "bytes/step", "analytic",
                      "max|dloss|", "others"},
                     rows);
  std::cout << "targets: smp 1 rank / plain = " << fmt(r1, 3) << " best-of-repeats, " << fmt(pm, 3)
            << " median of back-to-back pairs, " << fmt(pmed, 3) << " same on per-step medians (>= 0.97: "
            << (r1 >= 0.97 && pm >= 0.97 ? "met" : "NOT met")
            << "), dp=2 / smp 1 rank = " << fmt(dp, 3) << " best-of-repeats, " << fmt(dp_pm, 3)
            << " median of back-to-back pairs (>= 1.85: " << (dp >= 1.85 && dp_pm >= 1.85 ? "met" : "NOT met")
            << "), dp=2 weak (batch per rank kept) / smp 1 rank = " << fmt(weak, 3) << " best-of-repeats, "
            << fmt(weak_pm, 3) << " median of pairs (>= 1.9: " << (weak >= 1.9 && weak_pm >= 1.9 ? "met" : "NOT met")
            << ")\n";
  finish(result, c);
  return 0;
}

// ------------------------------------------------------------------------ dp-scaling
// dp = 2 weak scaling against the machine's own bound. On a host whose cores share
// caches, memory bandwidth and (on VMs) differ in speed, two ranks cannot reach 2x one
// rank even with free communication. The bound is measured, not assumed: two
// independent one-rank jobs started together (no communication at all) process 2B
// samples in the slower one's step time. Per repeat, back to back:
//   bound   = 2 t(1 rank) / t(slower of two concurrent 1-rank jobs)
//   dp2     = 2 t(1 rank) / t(dp = 2, B per rank)
//   dp2 / bound = t(two concurrent) / t(dp = 2): what data parallelism itself costs.
int cmd_dp_scaling(const Common& c) {
  const auto base = base_overrides(c);
  const bench::Shape shape = shape_of(c.config, base);
  double peak = 0;
  json result = start("dp-scaling", c, shape, &peak);
  Job two{"two-1rank-jobs-at-once", false, 1, c.config, base};
  two.copies = 2;
  const std::vector<Job> jobs{
      {"smp-1rank", false, 1, c.config, base},
      two,
      {"smp-dp2-weak", false, 2, c.config, with_extra(base, {"parallel.dp=2", "train.batch_size=" + std::to_string(2 * c.batch)})},
  };
  auto measured = bench::run_repeated(jobs, c.repeat, c.quiet_cores, c.job_wait_s);
  for (const Measured& m : measured)
    if (!m.ok) {
      std::cerr << "smp-bench dp-scaling: " << m.job.label << " failed\n" << m.best.output << "\n";
      return 1;
    }
  const auto& one = measured[0].step_seconds_all;
  const auto& pair = measured[1].step_seconds_all;
  const auto& dp = measured[2].step_seconds_all;
  std::vector<double> bound, lockstep, weak, over_bound;
  for (size_t k = 0; k < std::min({one.size(), pair.size(), dp.size()}); ++k) {
    bound.push_back(2 * one[k] / pair[k]);
    lockstep.push_back(2 * one[k] / measured[1].summary_all[k].value("lockstep_step_seconds", NAN));
    weak.push_back(2 * one[k] / dp[k]);
    over_bound.push_back(pair[k] / dp[k]);
  }
  json runs = json::array();
  for (const Measured& m : measured)
    runs.push_back({{"label", m.job.label},
                    {"ranks_or_copies", m.job.copies > 1 ? m.job.copies : m.job.nproc},
                    {"step_seconds_per_repeat", m.step_seconds_all},
                    {"competing_cores_per_repeat", m.competing_cores_all},
                    {"best_step_seconds", m.best.summary["step_seconds"]}});
  // Each copy's step time in the fastest pair: how far apart the two cores are.
  runs[1]["copies_step_seconds_best_repeat"] = measured[1].best.summary["copies_step_seconds"];
  result["runs"] = runs;
  const double bound_med = bench::median_from(bound, 0), weak_med = bench::median_from(weak, 0),
               over_med = bench::median_from(over_bound, 0), lock_med = bench::median_from(lockstep, 0);
  result["paired"] = {
      {"bound_over_1rank", {{"per_repeat", bound}, {"median", bound_med}}},
      {"lockstep_bound_over_1rank",
       {{"per_repeat", lockstep},
        {"median", lock_med},
        {"note", "the pair's steps as if in lockstep: 2 t(1 rank) / mean over steps of the slower copy's step "
                 "(a synchronous job waits for its slowest rank every step)"}}},
      {"dp2_weak_over_1rank", {{"per_repeat", weak}, {"median", weak_med}}},
      {"dp2_weak_over_bound", {{"per_repeat", over_bound}, {"median", over_med}}},
      {"note", "throughput ratios within each repeat (the three jobs ran back to back); bound = two independent "
               "one-rank jobs at once, the slower one's step time"}};
  result["targets"] = {{"dp2_weak_over_smp_1rank",
                        {{"target", 1.9}, {"measured_paired_median", weak_med}, {"min_pairs", kGoalPairs},
                         {"met", weak.size() >= kGoalPairs && weak_med >= 1.9},
                         {"machine_bound_paired_median", bound_med},
                         {"lockstep_bound_paired_median", lock_med},
                         {"bound_allows_target", bound_med >= 1.9}}}};
  std::cout << "\nsmp-bench dp-scaling: batch " << c.batch << " per rank, " << c.steps << " steps, " << c.repeat
            << " interleaved repeats, medians of per-repeat ratios\n"
            << "  two 1-rank jobs at once / 1 rank (the bound): " << fmt(bound_med, 3) << "\n"
            << "  the same in lockstep (slower copy per step):  " << fmt(lock_med, 3) << "\n"
            << "  dp = 2 weak / 1 rank:                         " << fmt(weak_med, 3) << " (goal >= 1.9: "
            << (weak_med >= 1.9 ? "met" : "NOT met") << ")\n"
            << "  dp = 2 weak / bound:                          " << fmt(over_med, 3) << "\n";
  finish(result, c);
  return 0;
}

// ------------------------------------------------------------------------ pipeline
double formula_bubble(const std::string& sched, int p, int m, int v) {
  if (sched == "interleaved-1f1b") return double(p - 1) / (v * m);
  if (sched == "zb-h1") return double(p - 1) / (3.0 * m);
  return double(p - 1) / m;
}

int cmd_pipeline(const Common& c) {
  const auto base = base_overrides(c);
  const bench::Shape shape = shape_of(c.config, base);
  double peak = 0;
  json result = start("pipeline", c, shape, &peak);
  const std::vector<int> ms{2, 4, 8};
  const std::vector<std::string> scheds{"gpipe", "1f1b", "zb-h1", "interleaved-1f1b"};
  const int p = 2, v = 2;

  std::vector<Job> jobs;
  jobs.push_back({"serial-m1", false, 1, c.config, base});
  for (int m : ms) jobs.push_back({"serial-m" + std::to_string(m), false, 1, c.config,
                                   with_extra(base, {"parallel.microbatches=" + std::to_string(m)})});
  for (const auto& s : scheds)
    for (int m : ms) {
      auto o = with_extra(base, {"parallel.pp=2", "parallel.microbatches=" + std::to_string(m), "parallel.schedule=" + s});
      if (s == "interleaved-1f1b") o.push_back("parallel.virtual_stages=" + std::to_string(v));
      jobs.push_back({"pp2-" + s + "-m" + std::to_string(m), false, 2, c.config, o});
    }
  auto measured = bench::run_repeated(jobs, c.repeat, c.quiet_cores, c.job_wait_s);
  std::map<int, double> serial;  // microbatches -> step seconds
  json serial_runs = json::array();
  for (size_t i = 0; i < 1 + ms.size(); ++i) {
    const int m = i == 0 ? 1 : ms[i - 1];
    json r = run_record(measured[i], peak, 1);
    r["microbatches"] = m;
    if (measured[i].ok) serial[m] = measured[i].best.summary["step_seconds"].get<double>();
    serial_runs.push_back(r);
  }
  result["serial"] = serial_runs;

  json runs = json::array();
  std::vector<std::vector<std::string>> rows;
  size_t k = 1 + ms.size();
  for (const auto& s : scheds)
    for (int m : ms) {
      const Measured& mm = measured[k++];
      const int vv = s == "interleaved-1f1b" ? v : 1;
      json r = run_record(mm, peak, 2);
      r["schedule"] = s;
      r["microbatches"] = m;
      if (mm.ok && mm.best.summary.contains("stages")) r["stages"] = mm.best.summary["stages"];
      r["virtual_stages"] = vv;
      const double bubble = formula_bubble(s, p, m, vv);
      smp::SimResult sim = smp::simulate(smp::make_schedule(s, p, m, vv), smp::zero_bubble_costs(p, 1, 1, 1));
      r["bubble_formula"] = bubble;
      r["bubble_simulated_F1_B2"] = sim.bubble_ratio;
      if (!mm.ok) {
        rows.push_back({s, std::to_string(m), "FAILED"});
        runs.push_back(r);
        continue;
      }
      const double step = mm.best.summary["step_seconds"].get<double>();
      const double ser_m = serial.count(m) ? serial[m] : NAN, ser_1 = serial.count(1) ? serial[1] : NAN;
      const double theory = ser_m / p * (1 + bubble);
      r["serial_step_seconds_same_microbatches"] = ser_m;
      r["serial_step_seconds_m1"] = ser_1;
      r["speedup_vs_serial_m1"] = ser_1 / step;
      r["speedup_vs_serial_same_m"] = ser_m / step;
      r["theoretical_step_seconds"] = theory;
      r["measured_over_theoretical"] = step / theory;
      r["implied_bubble"] = step / (ser_m / p) - 1;
      json comm = per_step_comm(mm.best.summary, c.steps);
      json analytic = bench::pp_bytes_per_step_rank0(shape, c.batch / m, m, p, vv);
      r["comm_bytes_per_step_rank0_measured"] = comm;
      r["comm_bytes_per_step_rank0_analytic"] = analytic;
      const double meas = axis_total(comm, "pp"), ana = analytic["total_pp"].get<double>();
      r["comm_check"] = {{"axis", "pp"}, {"measured", meas}, {"analytic", ana}, {"measured_over_analytic", meas / ana}};
      auto act = mm.best.summary["peak_activation_bytes"];
      rows.push_back({s, std::to_string(m), fmt(1000 * step, 1), fmt(1000 * ser_m, 1), fmt(1000 * theory, 1),
                      fmt(step / theory, 3), fmt(ser_1 / step, 3), fmt(bubble, 3), fmt(r["implied_bubble"].get<double>(), 3),
                      bench::human_bytes(act[0].get<double>()) + " / " + bench::human_bytes(act[1].get<double>()),
                      fmt(meas / ana, 4), fmt(mm.best.competing_cores, 2)});
      runs.push_back(r);
    }
  result["pipeline"] = runs;
  std::cout << "\nsmp-bench pipeline: pp=2, batch " << c.batch << ", " << c.steps
            << " steps; theory = serial(same m)/2 * (1 + bubble); others = cores used by other processes\n";
  std::vector<std::vector<std::string>> srows;
  for (size_t i = 0; i < 1 + ms.size(); ++i)
    if (measured[i].ok)
      srows.push_back({std::to_string(i == 0 ? 1 : ms[i - 1]), fmt(1000 * serial[i == 0 ? 1 : ms[i - 1]], 1),
                       fmt(measured[i].best.competing_cores, 2)});
  bench::print_table({"serial m", "ms/step", "others"}, srows);
  std::cout << "\n";
  bench::print_table({"schedule", "m", "ms/step", "serial(m)", "theory", "meas/theory", "x serial(m1)", "bubble",
                      "implied", "peak act st0 / st1", "pp bytes/an.", "others"},
                     rows);
  finish(result, c);
  return 0;
}

// ------------------------------------------------------------------------------ tp
// ------------------------------------------------------------------ pipeline-sim
// pp = 2 at m microbatches, every job traced over steps 3..N (run.trace): the
// measured step against the simulator's, fed the costs the same run measured
// (per rank the mean F, B, BI, BW; the mean message delivery) plus the step's
// measured time outside the pipeline phase (gradient sync, clip, optimizer).
// The schedules run interleaved, `repeat` times; ZB-H1 against 1F1B is the
// median of the per-repeat ratios of their summary step times.
int cmd_pipeline_sim(const Common& c, int m) {
  const auto base = base_overrides(c);
  json result = interleaved_header("pipeline-sim", c, base);
  result["microbatches"] = m;
  result["method"] =
      "predicted_step = simulate(schedule, per-rank mean F/B/BI/BW and mean delivery measured in the same run's "
      "trace).makespan + (traced step - traced pipeline phase); measured_step = mean over the traced steps of the "
      "slower rank's step; both over steps 3..N";
  const std::vector<std::string> scheds{"gpipe", "1f1b", "zb-h1"};
  std::map<std::string, json> rows;
  std::map<std::string, std::vector<double>> step_s;  // summary step_seconds per repeat
  auto ms = [](std::vector<double> us) {  // the trace's microseconds as milliseconds
    for (double& x : us) x /= 1e3;
    return us;
  };
  for (const auto& s : scheds) rows[s] = json::array();
  for (int rep = 0; rep < c.repeat; ++rep)
    for (const auto& s : scheds) {
      auto o = base;
      for (const std::string& x : std::vector<std::string>{"parallel.pp=2", "parallel.microbatches=" + std::to_string(m),
                                   "parallel.schedule=" + s, std::string("run.trace=true"),
                                   "run.trace_steps=[3, " + std::to_string(c.steps) + "]"})
        o.push_back(x);
      if (c.quiet_cores > 0) bench::wait_for_quiet(1.0 + c.quiet_cores, c.job_wait_s);
      const bench::JobResult r = bench::run_job({"pp2-" + s + "-m" + std::to_string(m), false, 2, c.config, o});
      json row = {{"repeat", rep}, {"ok", false}};
      if (r.exit_code != 0 || r.summary.is_null() || r.traces.size() != 2) {
        row["error_output"] = r.output;
        rows[s].push_back(row);
        std::cout << s << " repeat " << rep << ": FAILED\n" << r.output << "\n";
        continue;
      }
      const smp::TracedPipeline t = smp::read_traced_pipeline(r.traces);
      const smp::SimResult sim = smp::simulate(smp::make_schedule(s, 2, m), t.costs);
      if (!sim.ok) throw std::runtime_error("pipeline-sim: " + sim.error);
      const double outside = t.step_us - t.pipeline_us, predicted = sim.makespan + outside;
      std::vector<double> sim_idle;
      for (int k = 0; k < 2; ++k) sim_idle.push_back((sim.makespan - sim.busy[k]) / sim.makespan);
      row = {{"repeat", rep},
             {"ok", true},
             {"summary_step_seconds", r.summary["step_seconds"]},
             {"measured_step_seconds", t.step_us / 1e6},
             {"predicted_step_seconds", predicted / 1e6},
             {"measured_over_predicted", t.step_us / predicted},
             {"measured_pipeline_seconds", t.pipeline_us / 1e6},
             {"simulated_pipeline_seconds", sim.makespan / 1e6},
             {"outside_pipeline_seconds", outside / 1e6},
             {"idle_fraction_measured", t.idle_fraction},
             {"idle_fraction_simulated", sim_idle},
             {"forward_ms_by_rank", ms(t.costs.forward_by_rank)},
             {"backward_ms_by_rank", ms(t.costs.backward_by_rank)},
             {"backward_input_ms_by_rank", ms(t.costs.backward_input_by_rank)},
             {"backward_weight_ms_by_rank", ms(t.costs.backward_weight_by_rank)},
             {"delivery_ms", t.costs.comm / 1e3},
             {"deliveries", t.deliveries},
             {"competing_cores", r.competing_cores}};
      step_s[s].push_back(r.summary["step_seconds"].get<double>());
      std::cout << s << " repeat " << rep << ": step " << fmt(t.step_us / 1e3, 1) << " ms, predicted "
                << fmt(predicted / 1e3, 1) << " ms (" << fmt(t.step_us / predicted, 3) << ")\n";
      rows[s].push_back(row);
    }
  json summary = json::object();
  std::vector<std::vector<std::string>> table;
  bool within = true;
  for (const auto& s : scheds) {
    std::vector<double> ratio, meas, pred;
    for (const auto& r : rows[s])
      if (r["ok"].get<bool>()) {
        ratio.push_back(r["measured_over_predicted"].get<double>());
        meas.push_back(r["measured_step_seconds"].get<double>());
        pred.push_back(r["predicted_step_seconds"].get<double>());
      }
    const double med = bench::median_from(ratio, 0);
    summary[s] = {{"median_measured_over_predicted", med}, {"median_measured_step_seconds", bench::median_from(meas, 0)},
                  {"median_predicted_step_seconds", bench::median_from(pred, 0)}, {"per_repeat", ratio}};
    if (s != "gpipe") within = within && std::abs(med - 1) <= 0.10;
    table.push_back({s, fmt(1000 * bench::median_from(meas, 0), 1), fmt(1000 * bench::median_from(pred, 0), 1),
                     fmt(med, 3)});
  }
  result["runs"] = rows;
  result["summary"] = summary;
  std::vector<double> zb_over;
  for (size_t k = 0; k < std::min(step_s["zb-h1"].size(), step_s["1f1b"].size()); ++k)
    zb_over.push_back(step_s["zb-h1"][k] / step_s["1f1b"][k]);
  const double zb_med = bench::median_from(zb_over, 0);
  result["zb_h1_over_1f1b_step_paired"] = {{"per_repeat", zb_over}, {"median", zb_med}};
  result["targets"] = {{"1f1b_and_zb_h1_within_10pct_of_simulated", within}, {"zb_h1_faster_than_1f1b", zb_med < 1}};
  std::cout << "\nsmp-bench pipeline-sim: pp 2, m " << m << ", batch " << c.batch << ", traced steps 3.." << c.steps
            << ", medians of " << c.repeat << " interleaved repeats\n";
  bench::print_table({"schedule", "measured ms", "simulated ms", "measured/simulated"}, table);
  std::cout << "ZB-H1 / 1F1B step time, median of pairs: " << fmt(zb_med, 3) << "\n";
  finish(result, c);
  return 0;
}

int cmd_tp(const Common& c) {
  const auto base = base_overrides(c);
  const bench::Shape shape = shape_of(c.config, base);
  double peak = 0;
  json result = start("tp", c, shape, &peak);
  std::vector<Job> jobs{{"serial", false, 1, c.config, base},
                        {"tp2", false, 2, c.config, with_extra(base, {"parallel.tp=2"})},
                        {"tp2-sp", false, 2, c.config, with_extra(base, {"parallel.tp=2", "tp.sequence_parallel=true"})}};
  auto measured = bench::run_repeated(jobs, c.repeat, c.quiet_cores, c.job_wait_s);
  const double ser = measured[0].ok ? measured[0].best.summary["step_seconds"].get<double>() : NAN;
  json runs = json::array();
  std::vector<std::vector<std::string>> rows;
  for (size_t i = 0; i < measured.size(); ++i) {
    const Measured& m = measured[i];
    json r = run_record(m, peak, m.job.nproc);
    if (!m.ok) {
      rows.push_back({m.job.label, "FAILED"});
      runs.push_back(r);
      continue;
    }
    const double step = m.best.summary["step_seconds"].get<double>();
    r["speedup_vs_serial"] = ser / step;
    r["max_abs_loss_diff_vs_serial"] = max_abs_diff(m.best.summary["losses"], measured[0].best.summary["losses"]);
    std::string bytes = "-", ana_s = "-", ratio = "-";
    if (i > 0) {
      const bool sp = m.job.label == "tp2-sp";
      json comm = per_step_comm(m.best.summary, c.steps);
      json analytic = bench::tp_bytes_per_step(shape, c.batch, 2, sp);
      r["sequence_parallel"] = sp;
      r["comm_bytes_per_step_rank0_measured"] = comm;
      r["comm_bytes_per_step_rank0_analytic"] = analytic;
      const double meas = axis_total(comm, "tp"), ana = analytic["total_tp"].get<double>();
      r["comm_check"] = {{"axis", "tp"}, {"measured", meas}, {"analytic", ana}, {"measured_over_analytic", meas / ana}};
      bytes = bench::human_bytes(meas), ana_s = bench::human_bytes(ana), ratio = fmt(meas / ana, 4);
    }
    auto act = m.best.summary["peak_activation_bytes"];
    rows.push_back({m.job.label, fmt(1000 * step, 1), fmt(ser / step, 3), fmt(100 * r["mfu"].get<double>(), 1), bytes,
                    ana_s, ratio, bench::human_bytes(act[0].get<double>()),
                    sci(r["max_abs_loss_diff_vs_serial"].get<double>()), fmt(m.best.competing_cores, 2)});
    runs.push_back(r);
  }
  result["runs"] = runs;
  std::cout << "\nsmp-bench tp: tp=2, batch " << c.batch << ", " << c.steps
            << " steps (others = cores used by other processes during the run)\n";
  bench::print_table({"run", "ms/step", "x serial", "MFU%", "tp bytes/step", "analytic", "meas/an.", "peak act r0",
                      "max|dloss|", "others"},
                     rows);
  finish(result, c);
  return 0;
}

}  // namespace

// ----------------------------------------------------------------------------- generate
int cmd_generate(const Common& c, int64_t new_tokens) {
  bench::GenerateBenchOptions o;
  o.config = c.config.empty() ? bench::paths().source_dir + "/bench/configs/generate-bench.toml" : c.config;
  o.repeat = c.repeat;
  o.new_tokens = new_tokens;
  o.quiet_cores = c.quiet_cores;
  o.job_wait_s = c.job_wait_s;
  json result = interleaved_header("generate", c, {});
  result.erase("steps");
  result.erase("batch_size");
  result.erase("timing_rule");
  result.update(bench::run_generate_bench(o));
  for (const char* b : {"batch_1", "batch_8"}) {
    const json& g = result["generation"][b];
    std::cout << "smp-bench generate " << b << ": smp " << fmt(g["median_smp_tokens_per_s"].get<double>())
              << " tokens/s, plain " << fmt(g["median_plain_tokens_per_s"].get<double>()) << " tokens/s, median ratio "
              << fmt(g["median_smp_over_plain"].get<double>()) << ", same tokens: " << g["same_greedy_tokens"] << "\n";
  }
  const json& x = result["exchange"];
  std::cout << "export " << fmt(x["median_export_seconds"].get<double>()) << " s, import "
            << fmt(x["median_import_seconds"].get<double>()) << " s for " << bench::human_bytes(x["hf_bytes"].get<double>())
            << "; disk " << bench::human_bytes(x["median_disk_write_bytes_per_s"].get<double>()) << "/s\n";
  finish(result, c);
  return 0;
}

// ----------------------------------------------------------------------------- plan
// The planner against Megatron-LM's published runs (bench/configs/plan-published.json)
// on the DGX A100 preset, and the search's speed: a wide search (GPT-3 175B on
// 3072 accelerators, microbatch sizes up to 64, up to 16 virtual stages) timed
// `repeat` times.
int cmd_plan(const Common& c) {
  namespace plan = smp::plan;
  json result;
  result["benchmark"] = "plan";
  result["machine_before"] = bench::machine_json();
  const plan::Cluster cluster = plan::load_cluster("dgx-a100-80gb");
  std::ifstream in(bench::paths().source_dir + "/bench/configs/plan-published.json");
  result["published"] = plan::validate_published(cluster, json::parse(in));
  plan::Shape s;
  s.layers = 96, s.hidden = 12288, s.heads = 96, s.seq = 2048, s.vocab = 51200, s.batch = 1536;
  plan::SearchOptions o;
  o.world = 3072;
  o.max_virtual_stages = 16;
  std::vector<double> seconds;
  int64_t candidates = 0;
  for (int r = 0; r < std::max(1, c.repeat); ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    const plan::SearchResult found = plan::search(cluster, s, o);
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    candidates = found.candidates;
  }
  std::vector<double> sorted = seconds;
  std::sort(sorted.begin(), sorted.end());
  result["search_speed"] = {{"what", "one search of GPT-3 175B (96 layers, hidden 12288, batch 1536) on 3072 "
                                     "accelerators: tp within a node, pp, dp, schedules (1F1B, GPipe, ZB-H1, "
                                     "interleaved with 2-16 virtual stages), every microbatch size up to 64 that "
                                     "divides the batch per dp rank, ZeRO 0-3, "
                                     "recomputation or not"},
                            {"candidates", candidates},
                            {"seconds", seconds},
                            {"median_seconds", sorted[sorted.size() / 2]},
                            {"candidates_per_second", candidates / sorted[sorted.size() / 2]},
                            {"goal", ">= 10,000 candidates in <= 10 s"},
                            {"goal_met", candidates >= 10000 && sorted[sorted.size() / 2] <= 10}};
  result["machine_after"] = bench::machine_json();
  std::cout << "smp-bench plan: largest error against the published runs "
            << fmt(100 * result["published"]["largest_abs_error"].get<double>(), 1) << "%; search of " << candidates
            << " candidates in " << fmt(sorted[sorted.size() / 2], 3) << " s\n";
  std::ofstream(c.out) << result.dump(2) << "\n";
  std::cout << "wrote " << c.out << "\n";
  return 0;
}

// ----------------------------------------------------------------------------- checkpoint
// The planner against this machine (bench/plan_local.h).
int cmd_plan_local(const Common& c, const std::string& cluster, const std::string& measured) {
  const std::vector<std::string> base = step_overrides(c);
  json result = interleaved_header("plan-local", c, base);
  result["method"] =
      "smp-plan --calibrate writes this machine's cluster file (cluster_file); every layout of the GPT bench model "
      "on 2 ranks (dp 2 with ZeRO 0-3, pp 2 with 1F1B, GPipe, ZB-H1 and interleaved 1F1B, tp 2; every microbatch "
      "size; no recomputation) and of the moe bench model at dp 2 (ep 1 and 2, every microbatch size, ZeRO 0 and "
      "1) is predicted with it and measured: each job run `repeat` times, interleaved (every layout once per "
      "round), its step time the median over steps 2..N of a run, and the layout's the median over its runs. "
      "Compared per model: Spearman's rank correlation of predicted and measured, the median of |predicted - "
      "measured| / measured, and the measured time of the layout predicted fastest over the fastest measured.";
  bench::PlanLocalOptions o;
  o.overrides = base;
  for (const auto& s : c.sets) o.overrides.push_back(s);
  o.repeat = c.repeat;
  o.quiet_cores = c.quiet_cores;
  o.job_wait_s = c.job_wait_s;
  o.cluster = cluster;
  o.measured = measured;
  result.update(bench::run_plan_local(o));
  finish(result, c);
  return 0;
}

// Context parallelism on this machine (bench/context_parallel.h).
int cmd_context_parallel(const Common& c, int64_t budget_mib) {
  const std::vector<std::string> base = step_overrides(c);
  json result = interleaved_header("context-parallel", c, base);
  result["method"] =
      "The GPT bench model narrowed to hidden 128, 4 heads, 2 layers (fp32, one microbatch, LibTorch's math "
      "attention at cp 1, ring attention at cp > 1). memory: one job per cp in {1, 2, 4} at one sequence length, "
      "global batch 2; the peak bytes LibTorch's CPU allocator handed out during a step on each rank "
      "(peak_activation_bytes), the largest rank against cp 1's; goal <= 1/cp + 10%. speed: cp 2 and dp 2 on 2 "
      "ranks at the same global batch, run `repeat` times interleaved, each run's median step over steps 2..N, "
      "the median of the paired ratios cp2 / dp2. longest: at cp 1 and cp 4, sequences doubling from 256 (global "
      "batch 1, 2 steps) until the largest rank's peak exceeds the budget; the last one within it.";
  bench::ContextParallelOptions o;
  o.config = c.config;
  o.overrides = base;
  for (const auto& s : c.sets) o.overrides.push_back(s);
  o.repeat = c.repeat;
  o.quiet_cores = c.quiet_cores;
  o.job_wait_s = c.job_wait_s;
  o.budget_mib = static_cast<double>(budget_mib);
  result.update(bench::run_context_parallel(o));
  finish(result, c);
  const json& m = result["memory"]["rows"];
  std::cout << "smp-bench context-parallel: activations at cp 2 " << fmt(m[1]["over_cp1"].get<double>(), 3)
            << " of cp 1's, at cp 4 " << fmt(m[2]["over_cp1"].get<double>(), 3) << "; cp2 / dp2 step "
            << fmt(result["speed"]["cp2_over_dp2_median_ratio"].get<double>(), 3) << "; longest sequence in "
            << budget_mib << " MiB: cp 1 " << result["longest"]["cp1"]["longest_seq_len"] << ", cp 4 "
            << result["longest"]["cp4"]["longest_seq_len"] << "\n";
  return 0;
}

int cmd_checkpoint(const Common& c, int save_every) {
  const auto base = base_overrides(c);
  json result = interleaved_header("checkpoint", c, base);
  bench::CheckpointBenchOptions o;
  o.config = c.config;
  // A wider model than the bench's (hidden 512), so that the files, not fixed
  // costs, take the time; --set overrides it.
  o.overrides = with_extra(with_extra({"model.hidden=512", "model.heads=8"}, base), {"parallel.dp=2", "parallel.zero=1"});
  result["overrides"] = o.overrides;
  o.repeat = c.repeat;
  o.save_every = save_every;
  o.quiet_cores = c.quiet_cores;
  o.job_wait_s = c.job_wait_s;
  result["layout"] = "dp 2, zero 1 (saved); loaded on dp 2 zero 1 and on tp 2";
  result["method"] =
      "Rounds, each running in turn: the job without saving, saving synchronously every save_every steps, saving "
      "in the background (run.checkpoint_async: host copies while the next step's forward and backward run, its "
      "update waiting for them; the writing at SCHED_IDLE), loading the last synchronous save on the same layout and on tp 2; "
      "then the disk's sequential write throughput for files of the shards' sizes written at once (write + fsync, "
      "one thread per file), in the same round. write_over_disk = checkpoint bytes / the median synchronous save "
      "time / the disk's throughput. async stall per save = (steps 2..N and host copies of the async run - steps "
      "2..N of the run without saves) / saves; against the median synchronous save. Load seconds: run.resume's "
      "time in the worker (rank 0). Goals count on the median of >= 10 rounds.";
  result["save_every"] = save_every;
  result.update(bench::run_checkpoint_bench(o));
  const auto& m = result["medians"];
  std::cout << "\nsmp-bench checkpoint: " << c.repeat << " rounds, medians: sync save "
            << fmt(m["sync_save_seconds"].get<double>(), 3) << " s, write at "
            << fmt(100 * m["write_over_disk"].get<double>(), 1) << "% of the disk, async stall "
            << fmt(100 * m["async_stall_over_sync_save"].get<double>(), 1) << "% of a sync save, resharded load x"
            << fmt(m["load_resharded_over_same"].get<double>(), 2) << "\n";
  finish(result, c);
  return 0;
}

// ----------------------------------------------------------------------------- moe
int cmd_moe(const Common& c, bool quality) {
  const auto base = base_overrides(c);
  json result = interleaved_header("moe", c, base);
  bench::MoeBenchOptions o;
  o.config = c.config;
  o.overrides = base;
  o.repeat = c.repeat;
  o.quality = quality;
  o.quiet_cores = c.quiet_cores;
  o.job_wait_s = c.job_wait_s;
  result["method"] =
      "Interleaved pairs (each job once per round, back to back). ep: the moe bench model on 2 ranks at dp 2 with "
      "ep 1 (experts replicated, no all-to-all) and ep 2; ratio = ep2 / ep1 step time. eager: one smp rank against "
      "bench/eager_moe.py (the same model as one writes it in PyTorch, Mixtral's loop over experts) under Debian's "
      "python3-torch, one thread each; ratio = smp / eager tokens/s; goal >= 1.1 on the median of >= 10 pairs. "
      "grouped_gemm and quality: see their own method fields.";
  result.update(bench::run_moe_bench(o));
  finish(result, c);
  return 0;
}

int main(int argc, char** argv) {
  namespace fs = boost::filesystem;
  bench::Paths& P = bench::paths();
  P.self = fs::canonical("/proc/self/exe").string();
  P.bin_dir = fs::path(P.self).parent_path().string();
  P.source_dir = SMP_SOURCE_DIR;

  CLI::App app{"smp-bench: smp vs plain LibTorch, pipeline schedules, tensor parallelism (see bench/README.md)"};
  app.require_subcommand(1);
  app.add_option("--work-dir", P.work_dir, "where job run folders go (default $TMPDIR/smp-bench)");
  app.add_flag("--keep-runs", P.keep_runs, "keep the job run folders (logs, summary.json)");
  bool default_malloc = false;
  app.add_flag("--default-malloc", default_malloc,
               std::string("don't export the allocator settings (") + bench::kTunedMalloc + ") to the jobs");

  Common gpt, pipe, tp, ncf, bert, roberta, eager, psim, oprof, dps;
  auto* g = app.add_subcommand("gpt", "plain LibTorch vs smp 1 rank vs dp=2, pp=2 (1f1b, m=4), tp=2");
  add_common(g, gpt, 12, 8, P.source_dir + "/bench/results/gpt.json");
  auto* dpsc = app.add_subcommand("dp-scaling", "dp=2 weak scaling vs one rank and vs two independent one-rank jobs at once (the machine's bound)");
  add_common(dpsc, dps, 12, 8, P.source_dir + "/bench/results/dp-scaling.json");
  auto* pl = app.add_subcommand("pipeline", "pp=2: gpipe/1f1b/zb-h1/interleaved x m in {2,4,8} vs serial");
  add_common(pl, pipe, 8, 16, P.source_dir + "/bench/results/pipeline.json");
  auto* ps = app.add_subcommand("pipeline-sim", "pp=2 gpipe/1f1b/zb-h1, traced: measured step vs the simulator's for the measured costs");
  add_common(ps, psim, 10, 16, P.source_dir + "/bench/results/pipeline-sim.json");
  int psim_m = 4;
  ps->add_option("--microbatches", psim_m)->capture_default_str();
  auto* t = app.add_subcommand("tp", "tp=2 with/without sequence parallelism vs serial");
  add_common(t, tp, 12, 8, P.source_dir + "/bench/results/tp.json");
  auto* nc = app.add_subcommand("ncf", "the ncf adapter on 1 rank vs a plain LibTorch NeuMF loop");
  add_common(nc, ncf, 300, 256, P.source_dir + "/bench/results/ncf.json");
  auto* eg = app.add_subcommand("eager", "smp 1 rank and plain LibTorch vs two PyTorch-eager loops (python3-torch; separate and fused qkv), two shapes");
  eager.repeat = 10;  // its goals count only on the median of >= 10 interleaved pairs
  add_common(eg, eager, 12, 8, P.source_dir + "/bench/results/eager.json");
  auto* op = app.add_subcommand("op-profile", "smp 1 rank vs PyTorch eager op by op (calls, self time), two shapes");
  add_common(op, oprof, 8, 8, P.source_dir + "/bench/results/op-profile.json");
  auto* bt = app.add_subcommand("bert", "the bert adapter on 1 rank vs a plain LibTorch BERT loop");
  add_common(bt, bert, 20, 16, P.source_dir + "/bench/results/bert.json");
  Common ckpt;
  int ckpt_every = 2;
  ckpt.repeat = 10;  // its goals count only on the median of >= 10 rounds
  auto* ck = app.add_subcommand("checkpoint", "save (sync, async) and load (same layout, resharded) times against the disk's write throughput");
  add_common(ck, ckpt, 8, 8, P.source_dir + "/bench/results/checkpoint.json");
  ck->add_option("--save-every", ckpt_every, "steps between saves")->capture_default_str();
  Common moe;
  bool moe_quality = true;
  moe.repeat = 10;  // its goal counts only on the median of >= 10 interleaved pairs
  auto* mo = app.add_subcommand("moe", "MoE: ep 2 vs ep 1 on 2 ranks with the all-to-all share, 1 rank vs PyTorch eager, grouped GEMM vs a loop, preset vs its dense twin");
  add_common(mo, moe, 12, 16, P.source_dir + "/bench/results/moe.json");
  mo->add_option("--quality", moe_quality, "also train configs/moe-small.toml and its dense twin (minutes)")->capture_default_str();
  Common gen;
  int64_t gen_tokens = 32;
  gen.repeat = 10;  // its goal counts only on the median of >= 10 interleaved rounds
  auto* ge = app.add_subcommand("generate", "smp-generate vs a plain LibTorch KV-cache loop at batch 1 and 8; HF export/import vs the disk");
  add_common(ge, gen, 0, 1, P.source_dir + "/bench/results/generate.json");
  ge->add_option("--new-tokens", gen_tokens, "tokens generated per prompt")->capture_default_str();
  Common plan_opts;
  plan_opts.repeat = 10;
  auto* planner = app.add_subcommand("plan", "the planner against Megatron-LM's published runs, and the search's speed");
  add_common(planner, plan_opts, 0, 1, P.source_dir + "/bench/results/plan.json");
  Common local_opts;
  local_opts.repeat = 5;
  std::string local_cluster, local_measured;
  auto* local = app.add_subcommand("plan-local", "the planner's predictions against every 2-rank layout of the gpt "
                                                 "and moe bench models, measured on this machine");
  add_common(local, local_opts, 8, 0, P.source_dir + "/bench/results/plan-local.json");
  local->add_option("--cluster", local_cluster, "a cluster file instead of calibrating this machine first");
  local->add_option("--measured", local_measured, "predict an earlier result's measurements again (runs no jobs)");
  Common cp_opts;
  cp_opts.repeat = 10;
  int64_t cp_budget_mib = 128;
  auto* cpb = app.add_subcommand("context-parallel", "parallel.cp: activation memory at cp 1, 2, 4, cp 2 against dp "
                                                      "2, the longest sequence within a budget at cp 1 and 4");
  add_common(cpb, cp_opts, 6, 0, P.source_dir + "/bench/results/context-parallel.json");
  cpb->add_option("--budget-mib", cp_budget_mib, "the longest sequence's activation budget per rank")
      ->capture_default_str();
  auto* rb = app.add_subcommand("roberta", "the roberta adapter on 1 rank vs a plain LibTorch RoBERTa loop");
  add_common(rb, roberta, 20, 16, P.source_dir + "/bench/results/roberta.json");

  bench::PlainOptions po;
  std::string plain_out;
  auto* pr = app.add_subcommand("plain-run", "(internal) the plain LibTorch GPT loop in this process, 1 thread");
  pr->add_option("--config", po.config, "job TOML")->required();
  pr->add_option("--set", po.overrides, "override")->take_all();
  pr->add_option("--out", plain_out, "summary JSON to write (default: print)");
  pr->add_option("--mimic", po.mimic, "ablations: norm, ce, mask (do it the way smp does)")->take_all();
  auto* pn = app.add_subcommand("plain-ncf", "(internal) the plain LibTorch NeuMF loop in this process, 1 thread");
  auto* pb = app.add_subcommand("plain-bert", "(internal) the plain LibTorch BERT loop in this process, 1 thread");
  auto* prb = app.add_subcommand("plain-roberta", "(internal) the plain LibTorch RoBERTa loop in this process, 1 thread");
  for (auto* sub : {pn, pb, prb}) {
    sub->add_option("--config", po.config, "job TOML")->required();
    sub->add_option("--set", po.overrides, "override")->take_all();
    sub->add_option("--out", plain_out, "summary JSON to write (default: print)");
  }

  std::string st_schedule = "1f1b", st_out;
  int st_pp = 2, st_m = 4, st_v = 1;
  double st_f = 1.0, st_b = 2.0;
  auto* stc = app.add_subcommand("schedule-trace",
                                 "the schedule simulator's timeline as a Chrome trace / Perfetto JSON (run.trace's format)");
  stc->add_option("--schedule", st_schedule)->capture_default_str();
  stc->add_option("--pp", st_pp)->capture_default_str();
  stc->add_option("--microbatches", st_m)->capture_default_str();
  stc->add_option("--virtual-stages", st_v)->capture_default_str();
  stc->add_option("--forward-ms", st_f, "cost of a forward")->capture_default_str();
  stc->add_option("--backward-ms", st_b, "cost of a backward (zero-bubble: half input, half weight; the first stage's is all weight)")->capture_default_str();
  stc->add_option("--out", st_out, "file to write (default: print)");

  int64_t zb_mb = 4, zb_layers = 2;
  int zb_reps = 5;
  auto* zb = app.add_subcommand("zb-probe", "(diagnostic) cost of the executor's BI + BW split vs one backward");
  zb->add_option("--micro-batch", zb_mb)->capture_default_str();
  zb->add_option("--layers", zb_layers)->capture_default_str();
  zb->add_option("--reps", zb_reps)->capture_default_str();

  int64_t ar_bytes = 13031424;
  int ar_reps = 5;
  auto* ar = app.add_subcommand("allreduce-probe", "(diagnostic) all-reduce cost and overlap, Gloo vs shared memory, 2 processes");
  ar->add_option("--bytes", ar_bytes, "bytes to all-reduce (default: the benchmark GPT's gradients)")
      ->capture_default_str();
  ar->add_option("--reps", ar_reps)->capture_default_str();

  CLI11_PARSE(app, argc, argv);
  if (default_malloc) P.malloc_env.clear();
  try {
    for (Common* c : {&gpt, &pipe, &tp, &eager, &psim, &oprof, &dps, &ckpt, &cp_opts})
      if (c->config.empty()) c->config = bench::default_config();
    if (ncf.config.empty()) ncf.config = P.source_dir + "/configs/ncf.toml";
    if (bert.config.empty()) bert.config = P.source_dir + "/bench/configs/encoder-bench.toml";
    if (roberta.config.empty()) roberta.config = P.source_dir + "/bench/configs/encoder-bench.toml";
    if (moe.config.empty()) moe.config = P.source_dir + "/bench/configs/moe-bench.toml";
    if (*g) return cmd_gpt(gpt);
    if (*dpsc) return cmd_dp_scaling(dps);
    if (*pl) return cmd_pipeline(pipe);
    if (*t) return cmd_tp(tp);
    if (*ck) return cmd_checkpoint(ckpt, ckpt_every);
    if (*ge) return cmd_generate(gen, gen_tokens);
    if (*planner) return cmd_plan(plan_opts);
    if (*local) return cmd_plan_local(local_opts, local_cluster, local_measured);
    if (*cpb) return cmd_context_parallel(cp_opts, cp_budget_mib);
    if (*mo) {
      require_python_torch("moe");
      return cmd_moe(moe, moe_quality);
    }
    if (*ps) return cmd_pipeline_sim(psim, psim_m);
    if (*nc) return cmd_adapter(ncf, "ncf", "plain-ncf", "interactions");
    if (*eg) return cmd_eager(eager);
    if (*op) return cmd_op_profile(oprof);
    if (*bt) return cmd_adapter(bert, "bert", "plain-bert", "tokens");
    if (*rb) return cmd_adapter(roberta, "roberta", "plain-roberta", "tokens");
    if (*stc) {
      const smp::Schedule sched = smp::make_schedule(st_schedule, st_pp, st_m, st_v);
      smp::SimCosts costs = smp::zero_bubble_costs(st_pp, st_f, st_b / 2, st_b / 2);  // the split as the executor runs it
      const smp::SimResult sim = smp::simulate(sched, costs);
      if (!sim.ok) throw std::runtime_error("schedule-trace: " + sim.error);
      const std::string text = smp::chrome_trace(sched, sim, 1000.0);
      if (st_out.empty()) std::cout << text << "\n";
      else std::ofstream(st_out) << text;
      std::cerr << "simulated " << st_schedule << " pp " << st_pp << " m " << st_m << ": makespan " << sim.makespan
                << " ms, bubble fraction " << sim.bubble_fraction << "\n";
      return 0;
    }
    if (*ar || *zb) {  // the probe's figures, and which machine and code measured them
      // Under the validity rule, as every benchmark (0.5 cores, 60 s wait).
      json j = bench::measure_valid(*ar ? "allreduce-probe" : "zb-probe", 1, 0.5, 60, [&] {
        return *ar ? bench::run_allreduce_probe(ar_bytes, ar_reps) : bench::run_zb_probe(zb_mb, zb_layers, zb_reps);
      });
      if (j.is_object()) {
        j["machine"] = bench::machine_json();
        j["validity"] = bench::validity_json(0.5);
      }
      std::cout << j.dump(2) << "\n";
      return 0;
    }
    if (*pr || *pn || *pb || *prb) {
      json j = *pr ? bench::run_plain_gpt(po)
               : *pn ? bench::run_plain_ncf(po)
                     : bench::run_plain_encoder(po, *pb ? "bert" : "roberta");
      if (plain_out.empty()) std::cout << j.dump(2) << "\n";
      else bench::write_json(plain_out, j);
      return 0;
    }
  } catch (const std::exception& e) {
    std::cerr << "smp-bench: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
