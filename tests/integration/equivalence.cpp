#include "equivalence.h"

#include <boost/filesystem.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <sstream>

namespace smp::testing {

namespace {

// A graph metric's value matches the serial run's: counts exactly (one user
// ranked, one token dropped differently moves it far more), sums of floats to
// their rounding. The all-to-all's bytes and times depend on the layout, and
// so does moe_load (the busiest expert of each rank's microbatch).
bool layout_dependent_metric(const std::string& name) {
  return name.find("a2a") != std::string::npos || name == "moe_load";
}
double metric_tol(double v) { return 1e-6 + 1e-5 * std::abs(v); }

bool ends_with(const std::string& s, const std::string& suffix) {
  return !suffix.empty() && s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
bool vocabulary_parameter(const std::string& name) { return name.rfind("wte.", 0) == 0 || name.rfind("lm_head.", 0) == 0; }

std::string num(double v) {
  std::ostringstream s;
  s.precision(4);
  s << v;
  return s.str();
}

// A layout's tensor of a serial parameter: the rows the serial run has where
// a larger tp padded the vocabulary further (and only there).
at::Tensor as_serial(const std::string& name, at::Tensor p, const at::Tensor& ref) {
  if (vocabulary_parameter(name) && p.dim() == ref.dim() && p.dim() > 0 && p.size(0) > ref.size(0) &&
      p.sizes().slice(1) == ref.sizes().slice(1))
    return p.narrow(0, 0, ref.size(0));
  return p;
}

}  // namespace

std::string grad_norm_problems(const JobResult& serial, const JobResult& r, double norm_rtol) {
  const auto ref = serial.summary["grad_norms"].get<std::vector<double>>();
  const auto got = r.summary["grad_norms"].get<std::vector<double>>();
  if (got.size() != ref.size())
    return "grad_norms: " + std::to_string(got.size()) + " steps, serial " + std::to_string(ref.size()) + "\n";
  std::string out;
  for (size_t i = 0; i < got.size(); ++i)
    if (!(std::abs(got[i] - ref[i]) <= norm_rtol * std::abs(ref[i])))
      out += "step " + std::to_string(i + 1) + ": gradient norm " + num(got[i]) + ", serial " + num(ref[i]) +
             " (ratio " + num(got[i] / ref[i]) + ")\n";
  return out;
}

Comparison compare_with_serial(const JobResult& serial, const JobResult& r, const Bounds& b, const JobResult* noise) {
  Comparison c;
  std::string& out = c.problems;
  auto note = [&](const std::string& s) { out += s + "\n"; };
  if (serial.summary.is_null() || r.summary.is_null()) {
    note("no summary.json (serial " + std::to_string(serial.exit_code) + ", layout exit " +
         std::to_string(r.exit_code) + ")");
    return c;
  }
  // Losses, step by step, and the validation loss.
  const auto ref_losses = serial.summary["losses"].get<std::vector<double>>();
  const auto losses = r.summary["losses"].get<std::vector<double>>();
  if (ref_losses.empty()) note("the serial run has no losses");
  if (losses.size() != ref_losses.size())
    note(std::to_string(losses.size()) + " steps, serial " + std::to_string(ref_losses.size()));
  for (size_t i = 0; i < std::min(losses.size(), ref_losses.size()); ++i)
    if (!(std::abs(losses[i] - ref_losses[i]) <= b.loss_rtol * std::abs(ref_losses[i])))
      note("step " + std::to_string(i + 1) + ": loss " + num(losses[i]) + ", serial " + num(ref_losses[i]));
  out += grad_norm_problems(serial, r, b.norm_rtol);
  const double vref = serial.summary.value("val_loss", 0.0), v = r.summary.value("val_loss", 0.0);
  if (!(std::abs(v - vref) <= b.loss_rtol * std::abs(vref)))
    note("validation loss " + num(v) + ", serial " + num(vref));
  // The graph's metrics: validation (NCF's HR@k / NDCG@k) and every training step's (MoE).
  for (const auto& [name, value] : serial.summary["val_metrics"].items())
    if (!layout_dependent_metric(name) &&
        !(std::abs(r.summary["val_metrics"].value(name, -1.0) - value.get<double>()) <= metric_tol(value.get<double>())))
      note("validation metric " + name + ": " + num(r.summary["val_metrics"].value(name, -1.0)) + ", serial " +
           num(value.get<double>()));
  for (const auto& [name, values] : serial.summary["train_metrics"].items()) {
    if (layout_dependent_metric(name)) continue;
    const auto got = r.summary["train_metrics"].value(name, nlohmann::json::array());
    if (got.size() != values.size()) {
      note("metric " + name + ": " + std::to_string(got.size()) + " steps, serial " + std::to_string(values.size()));
      continue;
    }
    for (size_t i = 0; i < values.size(); ++i)
      if (!(std::abs(got[i].get<double>() - values[i].get<double>()) <= metric_tol(values[i].get<double>())))
        note("metric " + name + " at step " + std::to_string(i + 1) + ": " + num(got[i].get<double>()) + ", serial " +
             num(values[i].get<double>()));
  }

  // Parameters: what each run's training changed.
  namespace fs = boost::filesystem;
  for (const JobResult* j : {&serial, &r})
    for (const char* folder : {"parameters", "parameters-initial"})
      if (!fs::is_directory(fs::path(j->run_dir) / folder)) {
        note(j->run_dir + "/" + folder + " is missing (run.dump_parameters = true?)");
        return c;
      }
  std::string problem;
  const auto ref_end = assemble_parameters(serial.run_dir, 0, &problem);
  const auto ref_start = assemble_parameters(serial.run_dir, 0, &problem, "parameters-initial");
  const auto end = assemble_parameters(r.run_dir, 1e-6, &problem);
  const auto start = assemble_parameters(r.run_dir, 1e-6, &problem, "parameters-initial");
  if (!problem.empty()) note(problem);  // e.g. data-parallel replicas that differ
  std::map<std::string, at::Tensor> noise_end, noise_start;
  if (noise) {
    std::string noise_problem;
    noise_end = assemble_parameters(noise->run_dir, 0, &noise_problem);
    noise_start = assemble_parameters(noise->run_dir, 0, &noise_problem, "parameters-initial");
    if (noise_end.empty() || !noise_problem.empty())
      note("the noise run (" + noise->run_dir + ", exit " + std::to_string(noise->exit_code) + ") gave no parameters " +
           noise_problem);
  }
  // SMP_EQUIVALENCE_LOG=<file>: one line per parameter (run, name, max|u - u_ref|,
  // max|u_ref|, noise), what the bounds above were set from.
  std::FILE* log = nullptr;
  if (const char* path = std::getenv("SMP_EQUIVALENCE_LOG")) log = std::fopen(path, "a");
  if (ref_end.empty()) note("the serial run wrote no parameters");
  if (end.size() != ref_end.size())
    note(std::to_string(end.size()) + " parameters, serial " + std::to_string(ref_end.size()));
  double moved = 0, gap_sq = 0, ref_sq = 0;
  for (const auto& [name, p_ref] : ref_end)
    if (ref_start.count(name) && ref_start.at(name).sizes() == p_ref.sizes())
      moved = std::max(moved, (p_ref - ref_start.at(name)).abs().max().item<double>());
  // Differences below fp32 rounding of the model's largest update are not told apart.
  const double rounding = b.rounding_ulps * std::ldexp(moved, -23);
  // A parameter's noise: how far the noise run's update is from the serial run's.
  auto noise_of = [&](const std::string& name, const at::Tensor& u_ref) {
    if (!noise_end.count(name) || !noise_start.count(name) || noise_end.at(name).sizes() != u_ref.sizes())
      return 0.0;
    return ((noise_end.at(name) - noise_start.at(name)) - u_ref).abs().max().item<double>();
  };
  for (const auto& [name, p_ref] : ref_end) {
    if (!ref_start.count(name) || !end.count(name) || !start.count(name)) {
      note("parameter " + name + " is missing from a run");
      continue;
    }
    const at::Tensor u_ref = p_ref - ref_start.at(name);
    const at::Tensor p = as_serial(name, end.at(name), p_ref), p0 = as_serial(name, start.at(name), p_ref);
    if (p.sizes() != p_ref.sizes() || p0.sizes() != p_ref.sizes()) {
      note("parameter " + name + ": shape " + c10::str(end.at(name).sizes()) + ", serial " + c10::str(p_ref.sizes()));
      continue;
    }
    if (ends_with(name, b.exempt)) continue;
    ++c.parameters;
    const at::Tensor u = p - p0;
    c.worst_abs = std::max(c.worst_abs, (p - p_ref).abs().max().item<double>());
    const at::Tensor p0_ref = ref_start.at(name);
    const double start_scale = p0_ref.numel() > 0 ? p0_ref.abs().max().item<double>() : 0.0;
    const double start_gap =
        p0.numel() > 0 ? (p0 - p0_ref).abs().max().item<double>() / (start_scale > 0 ? start_scale : 1.0) : 0.0;
    c.start_gap = std::max(c.start_gap, start_gap);
    if (!(start_gap <= b.start_rtol))
      note("parameter " + name + ": starts off by " + num(start_gap) + " of its largest element (bound " +
           num(b.start_rtol) + ")");
    gap_sq += (u - u_ref).pow(2).sum().item<double>();
    ref_sq += u_ref.pow(2).sum().item<double>();
    const double own = u_ref.abs().max().item<double>(), off = (u - u_ref).abs().max().item<double>();
    const double noise_p = noise_of(name, u_ref);
    const double gap = off / (own > 0 ? own : 1.0);
    if (gap > c.worst_param_gap) c.worst_param_gap = gap, c.worst_param = name;
    const double beyond = off - b.param_update_rtol * own - rounding;  // what the noise term must cover
    if (noise_p > 0) c.worst_noise_multiple = std::max(c.worst_noise_multiple, beyond / noise_p);
    if (log) std::fprintf(log, "%s %s %.6g %.6g %.6g\n", r.run_dir.c_str(), name.c_str(), off, own, noise_p);
    if (!(beyond <= b.noise_factor * noise_p))
      note("parameter " + name + ": update off by " + num(off) + ", " + num(gap) + " of its largest element (bound " +
           num(b.param_update_rtol) + " of it + " + num(b.noise_factor) + " x its noise " + num(noise_p) + " + " +
           num(rounding) + ")");
  }
  if (log) std::fclose(log);
  if (!(c.worst_abs <= b.param_abs_tol))
    note("parameters end up to " + num(c.worst_abs) + " from the serial run's (bound " + num(b.param_abs_tol) + ")");
  if (!ref_end.empty() && moved == 0) note("the serial run's parameters did not move: nothing was compared");
  c.update_gap = ref_sq > 0 ? std::sqrt(gap_sq / ref_sq) : 0;
  if (!(c.update_gap <= b.update_rtol))
    note("all parameters: update off by " + num(c.update_gap) + " (bound " + num(b.update_rtol) + ")");
  return c;
}

Reference run_reference(const std::string& plugin, const std::string& config, const std::vector<std::string>& sets) {
  Reference r;
  r.serial = run_job(1, plugin, config, sets);
  // Another microbatch count than the serial run's: the same gradients summed in another order.
  bool one = false;
  for (const auto& s : sets) one = one || s == "parallel.microbatches=1";
  std::vector<std::string> noise_sets = sets;
  noise_sets.push_back(one ? "parallel.microbatches=2" : "parallel.microbatches=1");
  r.noise = run_job(1, plugin, config, noise_sets);
  return r;
}

}  // namespace smp::testing
