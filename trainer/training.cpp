#include <smp/training.h>

#include <smp/error.h>
#include <smp/mesh.h>
#include <smp/runtime.h>

#include <smp/tracing.h>
#include "elastic_record.h"
#include "heartbeat.h"
#include "metrics_log.h"
#include "run_report.h"

#include <ATen/ATen.h>
#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>

#include <boost/filesystem.hpp>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <numeric>
#include <optional>
#include <sstream>

namespace smp {

namespace {

// One validation: {"step", "loss", and each graph metric by name}.
nlohmann::json validation_entry(const Runtime& rt, int64_t step, double loss) {
  nlohmann::json e = {{"step", step}, {"loss", loss}};
  for (const auto& [name, value] : rt.validation_metrics()) e[name] = value;
  return e;
}
// "2026-12-02T16:30:00Z"
std::string iso_time_now() {
  const std::time_t t = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&t, &utc);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return buf;
}

// ", hr@10 0.4120, ndcg@10 0.2310" for the log line ("" without metrics).
std::string metrics_text(const Runtime& rt) {
  std::string out;
  for (const auto& [name, value] : rt.validation_metrics()) out += fmt::format(", {} {:.4f}", name, value);
  return out;
}

}  // namespace

int64_t peak_resident_bytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmHWM:", 0) == 0) {
      std::istringstream ss(line.substr(6));
      int64_t kb = 0;
      ss >> kb;
      return kb * 1024;
    }
  return 0;
}

namespace {

std::string human(double v) {
  char buf[32];
  if (v >= 1e9) std::snprintf(buf, sizeof buf, "%.2fG", v / 1e9);
  else if (v >= 1e6) std::snprintf(buf, sizeof buf, "%.2fM", v / 1e6);
  else if (v >= 1e3) std::snprintf(buf, sizeof buf, "%.1fk", v / 1e3);
  else std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

// Filesystem errors name the key the path came from.
template <class F>
void in_run_dir(const std::string& dir, const char* what, F&& f) {
  try {
    f();
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw Error("run.dir: cannot " + std::string(what) + " in '" + dir + "': " + e.what());
  }
}

// Before training: a run.dir that cannot be written fails now, not after the run.
void check_run_dir(const std::string& dir) {
  namespace fs = boost::filesystem;
  in_run_dir(dir, "write", [&] {
    fs::create_directories(dir);
    fs::path probe = fs::path(dir) / (".smp-write-test-" + std::to_string(::getpid()));
    {
      std::ofstream out(probe.string());
      if (!out) throw std::runtime_error("opening " + probe.string() + " for writing failed");
    }
    fs::remove(probe);
  });
}

// " cp=2" for each of the job's own mesh dimensions.
std::string job_axes(const DeviceMesh& mesh) {
  std::string out;
  std::vector<Axis> axes = mesh.model_axes();
  for (const Axis& a : mesh.sequence_axes()) axes.push_back(a);
  for (const Axis& a : axes)
    if (a != Axis::TP) out += " " + std::string(a.name()) + "=" + std::to_string(mesh.size(a));
  return out;
}

void write_summary(const std::string& dir, const nlohmann::json& summary) {
  namespace fs = boost::filesystem;
  in_run_dir(dir, "write summary.json", [&] {
    fs::create_directories(dir);
    write_summary_file(dir, summary);  // atomic: a reader never sees half a summary, a full disk leaves none
  });
}

// <run.dir>/<folder>/rank-<r>.json: the parameters this rank holds now.
void dump_parameters(Runtime& rt, const std::string& folder = "parameters") {
  namespace fs = boost::filesystem;
  const DeviceMesh& mesh = rt.mesh();
  nlohmann::json j;
  j["rank"] = mesh.rank();
  j["pp"] = mesh.coord(Axis::PP);
  j["dp"] = mesh.coord(Axis::DP);
  j["tp"] = mesh.coord(Axis::TP);
  j["tp_size"] = mesh.tp();
  j["ep"] = mesh.coord(Axis::EP);
  j["ep_size"] = mesh.ep();
  nlohmann::json params = nlohmann::json::array();
  for (const auto& p : rt.gather_parameters()) {
    // On the host: a CUDA rank's parameters are read element by element below.
    at::Tensor t = p.tensor.detach().to(at::kCPU, at::kDouble).contiguous();
    std::vector<double> data(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
    params.push_back({{"name", p.name}, {"shard_dim", p.shard_dim}, {"ep_shard_dim", p.ep_shard_dim},
                      {"shape", t.sizes().vec()}, {"data", data}});
  }
  j["parameters"] = params;
  const std::string run_dir = rt.job().run.dir;
  const std::string what = "write " + folder + "/";
  in_run_dir(run_dir, what.c_str(), [&] {
    fs::path dir = fs::path(run_dir) / folder;
    fs::create_directories(dir);
    std::ofstream out((dir / ("rank-" + std::to_string(mesh.rank()) + ".json")).string());
    out << j.dump();
    if (!out) throw std::runtime_error("writing " + dir.string() + " failed");
  });
}

}  // namespace

namespace {

// What the loop keeps of its steps for the summary.
struct RunRecord {
  nlohmann::json losses = nlohmann::json::array(), val_losses = nlohmann::json::array();
  nlohmann::json loss_scales = nlohmann::json::array();
  nlohmann::json grad_norms = nlohmann::json::array();  // before clipping, every step
  nlohmann::json metrics = nlohmann::json::object();    // the graph's metrics, every step
  int64_t skipped = 0, timed_steps = 0, peak_act = 0;
  double train_seconds = 0, last_loss = 0, val_loss = std::nan("");
  std::vector<double> step_seconds_each;  // rank 0's, for the report
  MemoryAccount peak_account;             // per category, the largest over the steps
  StepPhases phase_sum;
  PhaseSeconds device_sum;   // on a GPU, over the device_steps that have device times
  int64_t device_steps = 0;

  void add(const StepResult& r, int64_t steps) {
    losses.push_back(r.loss);
    loss_scales.push_back(r.loss_scale);
    grad_norms.push_back(r.grad_norm);
    for (const auto& [name, value] : r.metrics) metrics[name].push_back(value);
    step_seconds_each.push_back(r.seconds);
    skipped += r.skipped ? 1 : 0;
    last_loss = r.loss;
    peak_act = std::max(peak_act, r.peak_activation_bytes);
    peak_account.keep_largest(r.memory);
    if (r.step > 0 || steps == 1) {  // the first step pays one-time costs
      train_seconds += r.seconds;
      ++timed_steps;
      phase_sum.compute += r.phases.compute;
      phase_sum.grad_sync += r.phases.grad_sync;
      phase_sum.clip += r.phases.clip;
      phase_sum.optimizer += r.phases.optimizer;
      phase_sum.snapshot += r.phases.snapshot;
      if (r.phases.device) {  // a GPU's: the same phases on its clock
        const PhaseSeconds& d = *r.phases.device;
        device_sum.compute += d.compute, device_sum.grad_sync += d.grad_sync, device_sum.clip += d.clip;
        device_sum.optimizer += d.optimizer, device_sum.snapshot += d.snapshot;
        ++device_steps;
      }
    }
  }
  double step_seconds() const { return timed_steps ? train_seconds / static_cast<double>(timed_steps) : 0; }
};

// The memory manager's account per rank, by category (bytes; the largest over the steps).
nlohmann::json memory_account_json(Runtime& rt, const MemoryAccount& a) {
  nlohmann::json account;
  auto all = [&](int64_t v) { return rt.gather_world(static_cast<double>(v)); };
  account["parameters"] = all(a.parameters);
  account["gradients"] = all(a.gradients);
  account["optimizer_state"] = all(a.optimizer_state);
  account["step_peak"] = all(a.step_peak);
  account["total"] = all(a.total());
  account["offloaded_host"] = all(a.offloaded);
  account["activations"] = all(a.activations);
  account["largest_slot_activations"] = all(a.largest_slot);
  account["send_buffers"] = all(a.send_buffers);
  account["parameter_init_peak"] = all(rt.parameter_init_peak());
  return account;
}

nlohmann::json make_summary(Runtime& rt, const RunRecord& rec, const PeakFlops& peaks, const std::string& gemm,
                            double parameters) {
  const int world = rt.mesh().world_size();
  const double step_s = rec.step_seconds();
  const double items_per_s = step_s > 0 ? rt.items_per_step() / step_s : 0;
  const double flops_per_s = step_s > 0 ? rt.flops_per_step() / step_s : 0;
  // Mean seconds per timed step, per rank: where each rank's step went.
  const double n = static_cast<double>(std::max<int64_t>(1, rec.timed_steps));
  nlohmann::json phases;
  phases["compute"] = rt.gather_world(rec.phase_sum.compute / n);
  phases["grad_sync"] = rt.gather_world(rec.phase_sum.grad_sync / n);
  phases["clip"] = rt.gather_world(rec.phase_sum.clip / n);
  phases["optimizer"] = rt.gather_world(rec.phase_sum.optimizer / n);
  phases["snapshot"] = rt.gather_world(rec.phase_sum.snapshot / n);
  nlohmann::json summary;
  summary["config"] = rt.config().to_json();
  summary["layout"] = {{"pp", rt.mesh().pp()}, {"tp", rt.mesh().tp()}, {"dp", rt.mesh().dp()},
                       {"ep", rt.mesh().ep()}, {"world", world}, {"placement", rt.mesh().order()}};
  for (const Axis& a : rt.mesh().model_axes())
    if (a != Axis::TP) summary["layout"]["axes"][a.name()] = rt.mesh().size(a);
  for (const Axis& a : rt.mesh().sequence_axes()) summary["layout"][a.name()] = rt.mesh().size(a);
  summary["device"] = rt.device();
  summary["precision"] = rt.precision();
  summary["losses"] = rec.losses;
  summary["loss_scales"] = rec.loss_scales;
  summary["grad_norms"] = rec.grad_norms;
  summary["train_metrics"] = rec.metrics;
  summary["skipped_steps"] = rec.skipped;
  summary["final_loss"] = rec.last_loss;
  summary["val_loss"] = rec.val_loss;
  summary["val_losses"] = rec.val_losses;
  nlohmann::json val_metrics = nlohmann::json::object();  // the graph's metrics at the last validation
  if (!rec.val_losses.empty())
    for (const auto& [name, value] : rt.validation_metrics()) val_metrics[name] = value;
  summary["val_metrics"] = val_metrics;
  summary["step_seconds"] = step_s;
  summary["step_seconds_each"] = rec.step_seconds_each;
  summary["items_per_step"] = rt.items_per_step();
  // Throughput in the adapter's unit: "tokens_per_s" for a language model.
  summary["throughput_unit"] = rt.throughput_unit();
  summary[rt.throughput_unit() + "_per_s"] = items_per_s;
  summary["model_flops_per_step"] = rt.flops_per_step();
  summary["model_flops_per_s"] = flops_per_s;
  add_mfu_fields(summary, peaks, flops_per_s, world);  // mfu against the datasheet peak where known
  summary["peak_flops_gemm"] = gemm;                   // the measured GEMM's dtype
  // Trainable parameters, each value once: a tied head is the embedding's.
  summary["parameter_count"] = static_cast<int64_t>(parameters);
  summary["peak_memory_bytes"] = rt.gather_world(static_cast<double>(peak_resident_bytes()));
  summary["peak_activation_bytes"] = rt.gather_world(static_cast<double>(rec.peak_act));
  summary["memory_bytes"] = memory_account_json(rt, rec.peak_account);
  summary["phase_seconds"] = phases;
  if (rec.device_steps > 0) {  // a GPU's clock (CUDA events); absent on the CPU, which has none
    const double d = static_cast<double>(rec.device_steps);
    nlohmann::json device;
    device["compute"] = rt.gather_world(rec.device_sum.compute / d);
    device["grad_sync"] = rt.gather_world(rec.device_sum.grad_sync / d);
    device["clip"] = rt.gather_world(rec.device_sum.clip / d);
    device["optimizer"] = rt.gather_world(rec.device_sum.optimizer / d);
    // No "snapshot": that phase is the host waiting for copies on a side
    // stream, which the compute stream's events around it do not see.
    summary["phase_device_seconds"] = device;
  }
  const nlohmann::json comm = rt.comm_bytes();
  summary["comm_bytes_rank0"] = comm["sent"];
  summary["comm_bytes_analytic_rank0"] = comm["analytic"];
  {  // every rank's analytic bytes per axis and op (those any rank sent); the
     // mesh's axes, which every rank has (its groups differ)
    std::vector<std::pair<std::string, std::string>> keys;
    std::vector<double> mine;
    for (const Axis& a : rt.mesh().axes())
      for (const char* op : {"allreduce", "allgather", "reduce_scatter", "alltoall", "broadcast", "send"}) {
        keys.emplace_back(a.name(), op);
        const auto ops = comm["analytic"].value(a.name(), nlohmann::json::object());
        mine.push_back(ops.value(op, 0.0));
      }
    const auto all = rt.gather_world(mine);
    nlohmann::json per_rank = nlohmann::json::object();
    for (size_t i = 0; i < keys.size(); ++i) {
      std::vector<double> v;
      bool any = false;
      for (const auto& r : all) v.push_back(r[i]), any = any || r[i] != 0;
      if (any) per_rank[keys[i].first][keys[i].second] = v;
    }
    summary["comm_bytes_analytic_per_rank"] = per_rank;
  }
  if (!comm["uncounted_calls"].empty()) summary["comm_uncounted_calls_rank0"] = comm["uncounted_calls"];
  summary["stages"] = rt.plan().to_json(rt.graph());
  return summary;
}

// Parameters, traces, op profiles, the summary and the report, into run.dir.
void write_outputs(Runtime& rt, const nlohmann::json& summary) {
  const JobConfig& job = rt.job();
  const bool rank0 = rt.mesh().rank() == 0;
  if (job.run.dump_parameters) dump_parameters(rt);
  if (job.run.trace) {
    trace::write_rank_file(job.run.dir);
    rt.gather_world(0.0);  // every rank's file is written
    if (rank0) {
      spdlog::info("trace of steps {}-{}: {}/trace/rank-<r>.json", job.run.trace_first(), job.run.trace_last(),
                   job.run.dir);
      if (job.run.trace_merge)
        spdlog::info("merged trace: {}", trace::merge_rank_files(job.run.dir, rt.mesh().world_size()));
    }
  }
  if (job.run.profile_ops) {
    in_run_dir(job.run.dir, "write the op profile", [&] { op_profile::write_rank_file(job.run.dir, rt.mesh().rank()); });
    if (rank0)
      spdlog::info("op profile of steps {}-{}: {}/ops/rank-<r>.json", job.run.trace_first(), job.run.trace_last(),
                   job.run.dir);
  }
  if (rank0) {
    write_summary(job.run.dir, summary);
    in_run_dir(job.run.dir, "write report.html", [&] { write_report(job.run.dir, summary); });
    const std::string unit = rt.throughput_unit();
    const bool datasheet = summary["peak_flops_datasheet_per_rank"].is_number();
    spdlog::info("final loss {:.4f}, {} {}/s, MFU {:.1f}% ({}){}; summary in {}/summary.json",
                 summary["final_loss"].get<double>(), human(summary[unit + "_per_s"].get<double>()), unit,
                 100 * summary["mfu"].get<double>(), summary["peak_basis"].get<std::string>(),
                 datasheet ? fmt::format(", {:.1f}% of the measured GEMM peak",
                                         100 * summary["mfu_measured_peak"].get<double>())
                           : "",
                 job.run.dir);
  }
}

// SMP_ELASTIC, read once per process (every rank; rank 0 warns): the first
// Trainer's first step completes the current round's entry, and every later
// summary of the process carries it so.
struct ProcessElastic {
  std::optional<ElasticRecord> record;
  bool completed = false;
};
ProcessElastic& process_elastic(bool rank0) {
  static ProcessElastic e = [&] {
    ProcessElastic p;
    std::string warning;
    p.record = parse_elastic_env(std::getenv("SMP_ELASTIC"), &warning);
    if (rank0 && !warning.empty()) spdlog::warn("{}", warning);
    return p;
  }();
  return e;
}

double unix_time_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// The run's first lines: the layout, the parameters, and what MFU is against.
void log_layout(const Runtime& rt, const PeakFlops& peaks, const std::string& gemm, double parameters) {
  const DeviceMesh& mesh = rt.mesh();
  spdlog::info("layout pp={} tp={} dp={}{} world={} on {}{} ({}); {} parameters; measured peak {:.1f} GFLOP/s per "
               "rank ({} GEMM)",
               mesh.pp(), mesh.tp(), mesh.dp(), job_axes(mesh), mesh.world_size(), rt.device(),
               rt.device() == "cpu" ? std::string() : " [" + peaks.device_name + "]", rt.precision(),
               static_cast<int64_t>(parameters), peaks.measured / 1e9, gemm);
  if (peaks.has_datasheet())
    spdlog::info("MFU is against the datasheet dense peak of the {} in {}: {:.0f} TFLOP/s per rank", peaks.datasheet_gpu,
                 peaks.dtype, peaks.datasheet / 1e12);
  else
    spdlog::info("MFU is against the measured GEMM peak: no datasheet figure for {}", peaks.device_name);
}

}  // namespace

struct Trainer::Impl {
  explicit Impl(Runtime& runtime);
  void after_step(StepResult& r);
  void validate(int64_t step, bool last);
  void record_reformation();

  Runtime& rt;
  const JobConfig& job;
  const bool rank0;
  const int64_t steps, val_every, log_every, exit_after;
  const int val_batches;
  PeakFlops peaks;
  double peak = 0, measured_peak = 0, parameters = 0;
  std::string gemm;
  RunRecord rec;
  MetricsLog metrics;
  Heartbeat* heartbeat = nullptr;  // the process's
  nlohmann::json checkpoints = nlohmann::json::array();
  std::chrono::steady_clock::time_point start;
  int64_t first_step = 0;
  bool stopped = false;       // run.exit_after_steps
  bool program_fed = false;   // a step took the program's batch: no adapter validation at the end
};

Trainer::Impl::Impl(Runtime& runtime)
    : rt(runtime), job(runtime.job()), rank0(runtime.mesh().rank() == 0), steps(job.train.steps),
      val_every(job.train.val_every), log_every(std::max<int64_t>(1, job.train.log_every)),
      exit_after(job.run.exit_after_steps), val_batches(static_cast<int>(job.train.val_batches)),
      metrics(rank0 ? (check_run_dir(job.run.dir), MetricsLog(job.run.dir)) : MetricsLog()) {
  const DeviceMesh& mesh = rt.mesh();
  trace::configure(job.run.trace, mesh.rank(),
                   fmt::format("rank {} (pp {}, dp {}, tp {})", mesh.rank(), mesh.coord(Axis::PP), mesh.coord(Axis::DP),
                               mesh.coord(Axis::TP)),
                   job.run.trace_first() - 1, job.run.trace_last() - 1);
  op_profile::configure(job.run.profile_ops, job.run.trace_first() - 1, job.run.trace_last() - 1);
  peaks = rt.measure_peaks();
  // MFU against the datasheet's dense peak where smp knows the device, else the measured GEMM peak.
  peak = peaks.mfu_peak() * mesh.world_size(), measured_peak = peaks.measured * mesh.world_size();
  gemm = rt.device() == "cpu" ? "fp32" : rt.precision();
  const std::vector<double> counts = rt.gather_world(static_cast<double>(rt.parameter_count()));
  parameters = std::accumulate(counts.begin(), counts.end(), 0.0);
  if (rank0) log_layout(rt, peaks, gemm, parameters);
  metrics.write({{"event", "start"}, {"time", iso_time_now()}, {"steps", steps}, {"world", mesh.world_size()},
                 {"layout", {{"pp", mesh.pp()}, {"tp", mesh.tp()}, {"dp", mesh.dp()}, {"ep", mesh.ep()}}},
                 {"unit", rt.throughput_unit()}});
  heartbeat = &process_heartbeat(job.run.hang_timeout_s);
  process_elastic(rank0);
  // Resumed here once hang detection is armed, when the runtime left it to
  // its caller (smp-worker: RuntimeOptions::resume_at_create = false); else
  // what create() did.
  const ResumePoint resumed = rt.checkpoints().resume_if_asked();
  heartbeat->beat();
  if (resumed) {
    metrics.write({{"event", "resume"}, {"checkpoint", resumed.folder}, {"step", rt.steps_done()}});
    if (rank0 && rt.steps_done() >= steps)
      spdlog::info("the checkpoint is at step {}, train.steps = {}: nothing left to train", rt.steps_done(), steps);
  }
  // The parameters before this run's first step too: tests compare what each
  // layout's training changed (p - p0), not only where it ended. Before the
  // counters start: the gather is not the training's communication.
  if (job.run.dump_parameters && rt.steps_done() < steps) {
    dump_parameters(rt, "parameters-initial");
    rt.release_parameters();  // as the first step would find them without the dump
  }
  rt.reset_comm_stats();
  start = std::chrono::steady_clock::now();
  first_step = rt.steps_done();
}

void Trainer::Impl::validate(int64_t step, bool last) {
  const double v = rt.evaluate(val_batches);
  heartbeat->beat();
  rec.val_losses.push_back(validation_entry(rt, step, v));
  if (last) rec.val_loss = v;
  if (rank0) {
    if (last) spdlog::info("validation loss {:.4f}{}", v, metrics_text(rt));
    else spdlog::info("validation at step {}: loss {:.4f}{}", step, v, metrics_text(rt));
  }
  metrics.write({{"event", "validation"}, {"validation", rec.val_losses.back()}});
}

// After this process's first step: the current round's entry completed (when
// it resumed, how long after the change was noticed), one "reform" event and
// one line on rank 0.
void Trainer::Impl::record_reformation() {
  ProcessElastic& elastic = process_elastic(rank0);
  if (elastic.completed || !elastic.record) return;
  elastic.completed = true;
  ElasticReformation* now = elastic.record->current();
  if (!now) return;  // round 0: the job's first start
  now->resumed_step = first_step;
  now->first_step_seconds = unix_time_now() - now->noticed_unix;
  nlohmann::json event = now->to_json();
  event.erase("noticed_unix");
  event["event"] = "reform";
  metrics.write(event);
  if (rank0)
    spdlog::info("elastic: round {} (world {} -> {}: {}): first step {:.1f} s after the change was noticed, resumed "
                 "at step {}",
                 now->round, now->previous_world, now->world, now->reason.empty() ? "no reason given" : now->reason,
                 *now->first_step_seconds, first_step);
}

void Trainer::Impl::after_step(StepResult& r) {
  const int64_t done = r.step + 1;
  heartbeat->step(done);
  rec.add(r, steps);
  record_reformation();
  const bool exiting = exit_after > 0 && done - first_step >= exit_after && done < steps;
  if (r.skipped && rank0)
    spdlog::warn("step {}: fp16 gradients overflowed at loss scale {}: step skipped, scale halved", done, r.loss_scale);
  const double items_s = rt.items_per_step() / r.seconds;
  const double flops = rt.flops_per_step() / r.seconds;
  if (rank0 && (done % log_every == 0 || done == steps)) {
    double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    double eta = elapsed / static_cast<double>(std::max<int64_t>(1, done - first_step)) * static_cast<double>(steps - done);
    spdlog::info("step {}/{} | loss {:.4f} | lr {:.2e} | gnorm {:.3f} | {} {}/s | {:.4f} TFLOP/s | MFU {:.1f}% | "
                 "mem {}B (p {} g {} o {} step {}: act {} send {}) | {:.0f} ms | eta {:.0f}s",
                 done, steps, r.loss, r.lr, r.grad_norm, human(items_s), rt.throughput_unit(), flops / 1e12,
                 100 * flops / peak, human(r.memory.total()), human(r.memory.parameters), human(r.memory.gradients),
                 human(r.memory.optimizer_state), human(r.memory.step_peak), human(r.memory.activations),
                 human(r.memory.send_buffers), 1000 * r.seconds, std::max(0.0, eta));
    if (!r.metrics.empty()) {
      std::string line;
      for (const auto& [name, value] : r.metrics) line += fmt::format("{}{} {:.4g}", line.empty() ? "" : " | ", name, value);
      spdlog::info("step {}/{} metrics | {}", done, steps, line);
    }
    nlohmann::json entry{{"event", "step"}, {"step", done}, {"loss", r.loss}, {"lr", r.lr}, {"grad_norm", r.grad_norm},
                         {"items_per_s", items_s}, {"flops_per_s", flops}, {"mfu", flops / peak},
                         {"mfu_measured_peak", flops / measured_peak},
                         {"memory_bytes", r.memory.total()}, {"step_seconds", r.seconds}, {"skipped", r.skipped},
                         {"loss_scale", r.loss_scale}};
    for (const auto& [name, value] : r.metrics) entry[name] = value;
    metrics.write(entry);
  }
  // Saved after the step is logged: a save's commit may end this process
  // (smp-launch re-forms an elastic job there), and the step it saved must
  // be in metrics.jsonl.
  const int64_t checkpoint_every = job.run.checkpoint_every;
  if (checkpoint_every > 0 && (done % checkpoint_every == 0 || done == steps || exiting)) {
    Checkpointer& ckpt = rt.checkpoints();
    ckpt.save_step();
    heartbeat->beat();
    checkpoints.push_back({{"step", done}, {"blocking_seconds", ckpt.blocking_seconds()}});
    metrics.write({{"event", "checkpoint"}, {"step", done}, {"dir", ckpt.dir()},
                   {"blocking_seconds", ckpt.blocking_seconds()}});
  }
  const int64_t snapshot_every = job.run.snapshot_every;
  if (snapshot_every > 0 && done % snapshot_every == 0 && done < steps) {
    rt.checkpoints().save_snapshot();
    heartbeat->beat();
  }
  if (val_every > 0 && done % val_every == 0 && done < steps) {
    validate(done, false);
    r.validation_loss = rec.val_losses.back()["loss"].get<double>();
  }
  if (exiting) {
    if (rank0) spdlog::info("run.exit_after_steps = {}: stopping at step {} of {}", exit_after, done, steps);
    stopped = true;
  }
}

Trainer::Trainer(Runtime& runtime) : impl_(std::make_unique<Impl>(runtime)) {}
Trainer::~Trainer() = default;

StepResult Trainer::step() {
  StepResult r = impl_->rt.step_for_trainer(nullptr);
  impl_->after_step(r);
  return r;
}

StepResult Trainer::step(const Batch& batch) {
  StepResult r = impl_->rt.step_for_trainer(&batch);
  impl_->program_fed = true;
  impl_->after_step(r);
  return r;
}

bool Trainer::done() const { return impl_->stopped || impl_->rt.steps_done() >= impl_->steps; }

nlohmann::json Trainer::finish() {
  Impl& s = *impl_;
  Runtime& rt = s.rt;
  if (s.val_batches > 0 && !s.program_fed) s.validate(rt.steps_done(), true);
  Checkpointer& ckpt = rt.checkpoints();
  ckpt.wait();  // the last save is committed before the run reports
  if (rt.steps_done() >= s.steps) ckpt.remove_snapshots();  // the job is done: free the machine's memory
  nlohmann::json summary = make_summary(rt, s.rec, s.peaks, s.gemm, s.parameters);
  const ResumePoint resumed = ckpt.resumed();
  summary["checkpoints"] = {{"dir", ckpt.dir()},          {"saved", s.checkpoints},
                            {"resumed_from", resumed.folder}, {"load_seconds", resumed.seconds},
                            {"last_bytes", ckpt.bytes()}, {"last_total_seconds", ckpt.total_seconds()}};
  summary["first_step"] = s.first_step;  // the steps done when this run started: the charts' steps start after it
  const ProcessElastic& elastic = process_elastic(s.rank0);
  if (elastic.record) summary["elastic"] = elastic.record->to_json();
  write_outputs(rt, summary);
  return summary;
}

nlohmann::json Trainer::run() {
  while (!done()) step();
  return finish();
}

nlohmann::json run_training(Runtime& rt) { return Trainer(rt).run(); }

}  // namespace smp
