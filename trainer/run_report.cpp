#include "run_report.h"

#include <smp/error.h>

#include "base/atomic_file.h"

#include <spdlog/fmt/fmt.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <sys/stat.h>
#include <unistd.h>
#include <vector>

namespace smp {

namespace {

using nlohmann::json;

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string human(double v) {
  const char* units[] = {"", "k", "M", "G", "T"};
  int u = 0;
  while (std::abs(v) >= 1000 && u < 4) v /= 1000, ++u;
  return fmt::format("{:.3g}{}", v, units[u]);
}

constexpr int kW = 560, kH = 220, kLeft = 60, kRight = 16, kTop = 28, kBottom = 34;
const char* kColors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"};

struct Series {
  std::string name;
  std::vector<std::pair<double, double>> points;  // (x, y)
  bool dots = false;                              // markers only (validation)
};

// A labelled vertical line at x (an elastic job's re-formation at the step it resumed from).
struct Marker {
  double x;
  std::string label;
};

// A line chart with axes, ticks at the ends and a legend; markers from one
// step before the data to its last step are drawn, others left out.
std::string line_chart(const std::string& title, const std::string& x_label, const std::vector<Series>& series,
                       const std::vector<Marker>& markers = {}) {
  double x0 = 1e300, x1 = -1e300, y0 = 1e300, y1 = -1e300;
  for (const auto& s : series)
    for (const auto& [x, y] : s.points)
      if (std::isfinite(y)) x0 = std::min(x0, x), x1 = std::max(x1, x), y0 = std::min(y0, y), y1 = std::max(y1, y);
  std::vector<Marker> shown;
  for (const auto& m : markers)
    if (x0 <= x1 && std::isfinite(m.x) && m.x >= x0 - 1 && m.x <= x1) shown.push_back(m);
  for (const auto& m : shown) x0 = std::min(x0, m.x);
  std::ostringstream o;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << kW << "\" height=\"" << kH << "\" viewBox=\"0 0 " << kW
    << " " << kH << "\">";
  o << "<text x=\"" << kLeft << "\" y=\"16\" font-size=\"13\" font-weight=\"bold\">" << escape(title) << "</text>";
  if (x0 > x1) return o.str() + "<text x=\"60\" y=\"100\" font-size=\"12\">no data</text></svg>";
  if (x1 == x0) x1 = x0 + 1;
  if (y1 == y0) y1 = y0 + 1, y0 -= 1;
  const double pw = kW - kLeft - kRight, ph = kH - kTop - kBottom;
  auto px = [&](double x) { return kLeft + (x - x0) / (x1 - x0) * pw; };
  auto py = [&](double y) { return kTop + (1 - (y - y0) / (y1 - y0)) * ph; };
  o << "<rect x=\"" << kLeft << "\" y=\"" << kTop << "\" width=\"" << pw << "\" height=\"" << ph
    << "\" fill=\"none\" stroke=\"#999\"/>";
  o << "<text x=\"" << kLeft - 4 << "\" y=\"" << kTop + 10 << "\" font-size=\"10\" text-anchor=\"end\">" << human(y1)
    << "</text><text x=\"" << kLeft - 4 << "\" y=\"" << kTop + ph << "\" font-size=\"10\" text-anchor=\"end\">"
    << human(y0) << "</text>";
  o << "<text x=\"" << kLeft << "\" y=\"" << kH - 18 << "\" font-size=\"10\">" << human(x0) << "</text><text x=\""
    << kLeft + pw << "\" y=\"" << kH - 18 << "\" font-size=\"10\" text-anchor=\"end\">" << human(x1) << "</text>";
  o << "<text x=\"" << kLeft + pw / 2 << "\" y=\"" << kH - 6 << "\" font-size=\"10\" text-anchor=\"middle\">"
    << escape(x_label) << "</text>";
  for (size_t i = 0; i < series.size(); ++i) {
    const auto& s = series[i];
    const char* color = kColors[i % 8];
    if (s.dots) {
      for (const auto& [x, y] : s.points)
        if (std::isfinite(y))
          o << "<circle cx=\"" << px(x) << "\" cy=\"" << py(y) << "\" r=\"3\" fill=\"" << color << "\"/>";
    } else {
      o << "<polyline fill=\"none\" stroke=\"" << color << "\" stroke-width=\"1.5\" points=\"";
      for (const auto& [x, y] : s.points)
        if (std::isfinite(y)) o << px(x) << "," << py(y) << " ";
      o << "\"/>";
    }
    o << "<text x=\"" << kLeft + pw - 4 << "\" y=\"" << kTop + 14 + 13 * i << "\" font-size=\"11\" fill=\"" << color
      << "\" text-anchor=\"end\">" << escape(s.name) << "</text>";
  }
  for (const auto& m : shown) {
    const double x = px(m.x);
    o << "<line x1=\"" << x << "\" y1=\"" << kTop << "\" x2=\"" << x << "\" y2=\"" << kTop + ph
      << "\" stroke=\"#d62728\" stroke-dasharray=\"4,3\"><title>" << escape(m.label) << "</title></line>";
    o << "<text x=\"" << x + 3 << "\" y=\"" << kTop + 10 << "\" font-size=\"10\" fill=\"#d62728\">" << escape(m.label)
      << "</text>";
  }
  return o.str() + "</svg>";
}

// Stacked bars: one bar per group (rank, axis), one segment per category.
std::string bar_chart(const std::string& title, const std::vector<std::string>& groups,
                      const std::vector<std::pair<std::string, std::vector<double>>>& categories,
                      const std::string& unit) {
  std::vector<double> totals(groups.size(), 0);
  for (const auto& [_, values] : categories)
    for (size_t g = 0; g < groups.size() && g < values.size(); ++g) totals[g] += std::max(0.0, values[g]);
  // No groups (a summary without that table): an empty chart, not a read past the end.
  const double most = totals.empty() ? 0.0 : *std::max_element(totals.begin(), totals.end());
  const double top = std::max(1e-300, most) * 1.12;  // room for labels
  const int h = kH + 13 * static_cast<int>(categories.size() / 3);
  std::ostringstream o;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << kW << "\" height=\"" << h << "\" viewBox=\"0 0 " << kW
    << " " << h << "\">";
  o << "<text x=\"" << kLeft << "\" y=\"16\" font-size=\"13\" font-weight=\"bold\">" << escape(title) << "</text>";
  const double pw = kW - kLeft - kRight, ph = kH - kTop - kBottom;
  const double slot = groups.empty() ? pw : pw / static_cast<double>(groups.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    double y = kTop + ph;
    const double x = kLeft + slot * static_cast<double>(g) + slot * 0.15;
    for (size_t c = 0; c < categories.size(); ++c) {
      const double v = g < categories[c].second.size() ? std::max(0.0, categories[c].second[g]) : 0;
      const double bh = v / top * ph;
      y -= bh;
      o << "<rect x=\"" << x << "\" y=\"" << y << "\" width=\"" << slot * 0.7 << "\" height=\"" << bh << "\" fill=\""
        << kColors[c % 8] << "\"><title>" << escape(groups[g] + " " + categories[c].first + ": " + human(v) + unit)
        << "</title></rect>";
    }
    o << "<text x=\"" << x + slot * 0.35 << "\" y=\"" << kTop + ph + 12 << "\" font-size=\"10\" text-anchor=\"middle\">"
      << escape(groups[g]) << "</text>";
    o << "<text x=\"" << x + slot * 0.35 << "\" y=\"" << y - 3 << "\" font-size=\"10\" text-anchor=\"middle\">"
      << human(totals[g]) << escape(unit) << "</text>";
  }
  for (size_t c = 0; c < categories.size(); ++c)
    o << "<text x=\"" << kLeft + 150 * static_cast<double>(c % 3) << "\" y=\"" << kTop + ph + 26 + 13 * (c / 3)
      << "\" font-size=\"11\" fill=\"" << kColors[c % 8] << "\">" << escape(categories[c].first) << "</text>";
  return o.str() + "</svg>";
}

std::vector<double> numbers(const json& j) {
  std::vector<double> out;
  if (j.is_array())
    for (const auto& v : j) out.push_back(v.is_number() ? v.get<double>() : std::nan(""));
  return out;
}

// summary.json's elastic.reformations: "world 4→2" at the step each resumed from.
std::vector<Marker> reformation_markers(const json& s) {
  std::vector<Marker> out;
  const auto e = s.find("elastic");
  if (e == s.end() || !e->is_object() || !e->contains("reformations") || !(*e)["reformations"].is_array()) return out;
  for (const auto& r : (*e)["reformations"]) {
    if (!r.is_object() || !r.contains("resumed_step") || !r["resumed_step"].is_number()) continue;
    auto world = [&](const char* k) { return r.contains(k) && r[k].is_number() ? r[k].dump() : std::string("?"); };
    out.push_back({r["resumed_step"].get<double>(), "world " + world("previous_world") + "\u2192" + world("world")});
  }
  return out;
}

}  // namespace

void add_mfu_fields(json& summary, const PeakFlops& peaks, double flops_per_s, int world) {
  const double n = static_cast<double>(std::max(1, world));
  summary["device_name"] = peaks.device_name;
  summary["peak_flops_per_rank"] = peaks.measured;
  summary["peak_flops_datasheet_per_rank"] = peaks.has_datasheet() ? json(peaks.datasheet) : json(nullptr);
  summary["peak_flops_dtype"] = peaks.dtype;
  summary["peak_basis"] = peaks.basis();
  summary["mfu"] = peaks.mfu_peak() > 0 ? flops_per_s / (peaks.mfu_peak() * n) : 0.0;
  summary["mfu_measured_peak"] = peaks.measured > 0 ? flops_per_s / (peaks.measured * n) : 0.0;
}

double mfu_peak_per_rank(const json& s) {
  const auto datasheet = s.find("peak_flops_datasheet_per_rank");
  if (datasheet != s.end() && datasheet->is_number() && datasheet->get<double>() > 0) return datasheet->get<double>();
  const auto measured = s.find("peak_flops_per_rank");
  return measured != s.end() && measured->is_number() ? measured->get<double>() : 0.0;
}

std::string render_report(const json& s) {
  const std::vector<double> losses = numbers(s.value("losses", json::array()));
  const std::vector<double> seconds = numbers(s.value("step_seconds_each", json::array()));
  const std::string unit = s.value("throughput_unit", "items");
  const double per_step = s.value("items_per_step", 0.0), flops_per_step = s.value("model_flops_per_step", 0.0);
  const json layout = s.value("layout", json::object());
  const int world = layout.value("world", 1);
  const double peak = mfu_peak_per_rank(s) * world;  // the datasheet's where known, as the summary's mfu

  std::ostringstream body;
  // A resumed run's steps start after the ones its checkpoint had done (as its validations' do).
  const double first = s.contains("first_step") && s["first_step"].is_number() ? s["first_step"].get<double>() : 0.0;
  Series train{"train loss", {}, false}, val{"validation loss", {}, true};
  for (size_t i = 0; i < losses.size(); ++i) train.points.emplace_back(first + static_cast<double>(i + 1), losses[i]);
  for (const auto& v : s.value("val_losses", json::array()))
    val.points.emplace_back(v.value("step", 0.0), v.value("loss", std::nan("")));
  body << line_chart("Loss per step", "step", {train, val}, reformation_markers(s));
  Series rate{unit + "/s", {}, false}, mfu{"MFU %", {}, false};
  for (size_t i = 0; i < seconds.size(); ++i)
    if (seconds[i] > 0) {
      const double x = first + static_cast<double>(i + 1);
      rate.points.emplace_back(x, per_step / seconds[i]);
      if (peak > 0) mfu.points.emplace_back(x, 100 * flops_per_step / seconds[i] / peak);
    }
  body << line_chart("Throughput per step (" + unit + "/s)", "step", {rate});
  const std::string basis = s.value("peak_basis", std::string("measured GEMM"));
  body << line_chart("MFU per step (%, against the " + basis + " peak)", "step", {mfu});

  std::vector<std::string> ranks;
  for (int r = 0; r < world; ++r) ranks.push_back("rank " + std::to_string(r));
  const json mem = s.value("memory_bytes", json::object());
  std::vector<std::pair<std::string, std::vector<double>>> mem_cats;
  for (const char* k : {"parameters", "gradients", "optimizer_state", "step_peak"})
    if (mem.contains(k)) mem_cats.emplace_back(k, numbers(mem[k]));
  body << bar_chart("Memory per rank", ranks, mem_cats, "B");
  const json phases = s.value("phase_seconds", json::object());
  std::vector<std::pair<std::string, std::vector<double>>> phase_cats;
  for (const char* k : {"compute", "grad_sync", "clip", "optimizer"})
    if (phases.contains(k)) {
      std::vector<double> ms = numbers(phases[k]);
      for (double& v : ms) v *= 1000;
      phase_cats.emplace_back(k, ms);
    }
  body << bar_chart("Time per phase per rank (ms per step)", ranks, phase_cats, "ms");
  std::vector<std::string> axes;
  std::vector<std::pair<std::string, std::vector<double>>> op_cats;
  // comm_bytes_rank0 is {group: {transport: {op: bytes}}}: one bar per "transport op".
  json comm = json::object();
  const json sent = s.value("comm_bytes_rank0", json::object());
  for (const auto& [axis, by_transport] : sent.items()) {
    comm[axis] = json::object();
    for (const auto& [transport, by_op] : by_transport.items())
      for (const auto& [op, bytes] : by_op.items()) comm[axis][transport + " " + op] = bytes;
  }
  std::vector<std::string> ops;
  for (const auto& [axis, by_op] : comm.items()) {
    axes.push_back(axis);
    for (const auto& [op, _] : by_op.items())
      if (std::find(ops.begin(), ops.end(), op) == ops.end()) ops.push_back(op);
  }
  for (const auto& op : ops) {
    std::vector<double> v;
    for (const auto& [axis, by_op] : comm.items()) v.push_back(by_op.value(op, 0.0));
    op_cats.emplace_back(op, v);
  }
  body << bar_chart("Bytes per communicator group (sent, by transport; rank 0, whole run)", axes, op_cats, "B");

  std::ostringstream o;
  o << "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>smp run report</title>"
    << "<style>body{font-family:sans-serif;margin:24px;max-width:1180px}svg{margin:8px;border:1px solid #eee}"
    << "td,th{padding:2px 10px;text-align:left}</style></head><body>\n<h1>smp run report</h1>\n<table>";
  auto row = [&](const std::string& k, const std::string& v) {
    o << "<tr><th>" << escape(k) << "</th><td>" << escape(v) << "</td></tr>";
  };
  row("layout", fmt::format("pp {} x dp {} x tp {} (world {})", layout.value("pp", 1), layout.value("dp", 1),
                            layout.value("tp", 1), world));
  row("device, precision", s.value("device", "?") + ", " + s.value("precision", "?"));
  row("steps", std::to_string(losses.size()));
  row("final loss, validation loss",
      fmt::format("{:.4f}, {:.4f}", s.value("final_loss", std::nan("")),
                  s.contains("val_loss") && s["val_loss"].is_number() ? s["val_loss"].get<double>() : std::nan("")));
  row(unit + "/s, MFU", fmt::format("{}, {:.1f}%", human(s.value(unit + "_per_s", 0.0)), 100 * s.value("mfu", 0.0)));
  row("MFU against", basis + (s.contains("device_name") ? " (device " + s.value("device_name", std::string()) + ")" : ""));
  if (s.contains("mfu_measured_peak") && mfu_peak_per_rank(s) != s.value("peak_flops_per_rank", 0.0))
    row("MFU against the measured GEMM peak",
        fmt::format("{:.1f}% of {}FLOP/s per rank", 100 * s.value("mfu_measured_peak", 0.0),
                    human(s.value("peak_flops_per_rank", 0.0))));
  for (const auto& r : s.contains("elastic") && s["elastic"].is_object()
                           ? s["elastic"].value("reformations", json::array())
                           : json::array()) {
    if (!r.is_object()) continue;
    auto num = [&](const char* k) { return r.contains(k) && r[k].is_number() ? r[k].dump() : std::string("?"); };
    std::string what = "world " + num("previous_world") + " \u2192 " + num("world") + ", resumed at step " +
                       num("resumed_step");
    if (r.contains("first_step_seconds") && r["first_step_seconds"].is_number())
      what += fmt::format(", first step {:.1f} s after the change was noticed", r["first_step_seconds"].get<double>());
    if (r.contains("reason") && r["reason"].is_string()) what += " (" + r["reason"].get<std::string>() + ")";
    row("re-formation, round " + num("round"), what);
  }
  o << "</table>\n" << body.str() << "\n</body></html>\n";
  return o.str();
}

std::string write_report(const std::string& run_dir, const json& summary) {
  const std::string path = run_dir + "/report.html";
  write_file_atomically(path, render_report(summary), "run report");
  return path;
}

void write_summary_file(const std::string& run_dir, const json& summary) {
  const std::string path = run_dir + "/summary.json", prev = run_dir + "/summary.json.prev";
  const std::string text = summary.dump(2) + "\n";
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    // The previous summary kept by a second name (no bytes written, so a full
    // disk cannot cut it short); a file system without links gets a copy.
    ::unlink(prev.c_str());
    if (::link(path.c_str(), prev.c_str()) != 0) {
      std::ifstream in(path, std::ios::binary);
      std::ostringstream old;
      old << in.rdbuf();
      write_file_atomically(prev, old.str(), "run summary");
    }
  }
  write_file_atomically(path, text, "run summary");
}

}  // namespace smp
