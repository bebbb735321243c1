#include "schedule/traced_pipeline.h"

#include <smp/error.h>

#include <nlohmann/json.hpp>

#include <algorithm>

namespace smp {

namespace {

using nlohmann::json;

double end_of(const json& e) { return e["ts"].get<double>() + e["dur"].get<double>(); }

double mean(const std::vector<double>& v) {
  double t = 0;
  for (double x : v) t += x;
  return v.empty() ? 0.0 : t / static_cast<double>(v.size());
}

std::vector<json> slices(const json& trace, const std::string& category, const std::string& name = "") {
  std::vector<json> out;
  for (const auto& e : trace.at("traceEvents"))
    if (e.value("cat", "") == category && e.value("ph", "") == "X" && (name.empty() || e.value("name", "") == name))
      out.push_back(e);
  std::stable_sort(out.begin(), out.end(), [](const json& a, const json& b) { return a["ts"] < b["ts"]; });
  return out;
}

}  // namespace

TracedPipeline read_traced_pipeline(const std::vector<json>& rank_traces) {
  const int pp = static_cast<int>(rank_traces.size());
  TracedPipeline t;
  t.actions.resize(pp);
  t.idle_fraction.assign(pp, 0.0);
  // [rank][step]: the actions (json slices) of each traced step's pipeline phase.
  std::vector<std::vector<std::vector<json>>> acts(pp);
  std::vector<std::vector<double>> step_dur(pp), phase_dur(pp);
  for (int r = 0; r < pp; ++r) {
    const json& trace = rank_traces[r];
    std::vector<double> f, b, bi, bw;
    for (const auto& step : slices(trace, "step")) step_dur[r].push_back(step["dur"].get<double>());
    for (const auto& phase : slices(trace, "phase", "pipeline")) {
      const double begin = phase["ts"].get<double>(), end = end_of(phase);
      std::vector<json> step_acts;
      for (const auto& e : trace["traceEvents"]) {
        const std::string cat = e.value("cat", "");
        if ((cat == "compute" || cat == "p2p") && e.value("ph", "") == "X" && e["ts"].get<double>() >= begin &&
            e["ts"].get<double>() <= end)
          step_acts.push_back(e);
      }
      std::stable_sort(step_acts.begin(), step_acts.end(),
                       [](const json& x, const json& y) { return x["ts"] < y["ts"]; });
      std::vector<std::string> names;
      double busy = 0;
      for (const auto& e : step_acts) {
        const std::string name = e["name"];
        names.push_back(name);
        if (e["cat"] != "compute") continue;
        const double d = e["dur"].get<double>();
        busy += d;
        // to_string(Action): F3, B3, BI3, BW3 (then the chunk, when there are several).
        if (name.rfind("BI", 0) == 0) bi.push_back(d);
        else if (name.rfind("BW", 0) == 0) bw.push_back(d);
        else if (name[0] == 'B') b.push_back(d);
        else f.push_back(d);
      }
      t.actions[r].push_back(names);
      t.idle_fraction[r] += (end - begin - busy) / (end - begin);
      phase_dur[r].push_back(end - begin);
      acts[r].push_back(std::move(step_acts));
    }
    if (acts[r].empty()) throw Error("trace of pp rank " + std::to_string(r) + " has no pipeline phase");
    t.idle_fraction[r] /= static_cast<double>(acts[r].size());
    t.costs.forward_by_rank.push_back(mean(f));
    t.costs.backward_by_rank.push_back(mean(b));
    t.costs.backward_input_by_rank.push_back(mean(bi));
    t.costs.backward_weight_by_rank.push_back(mean(bw));
  }
  const size_t steps = acts[0].size();
  for (int r = 1; r < pp; ++r)
    if (acts[r].size() != steps || step_dur[r].size() != step_dur[0].size())
      throw Error("the pp ranks' traces cover different numbers of steps (rank 0: " + std::to_string(steps) +
                  ", rank " + std::to_string(r) + ": " + std::to_string(acts[r].size()) + ")");
  // Deliveries: send_act3>1 on rank 0 is received as recv_act3<0 on rank 1;
  // only receives that began before the send count (the receiver was waiting).
  std::vector<double> delivery;
  for (size_t k = 0; k < steps; ++k)
    for (int src = 0; src < pp; ++src)
      for (const auto& send : acts[src][k]) {
        const std::string name = send["name"];
        if (name.rfind("send_", 0) != 0) continue;
        const size_t gt = name.find('>');
        const int dst = std::stoi(name.substr(gt + 1));
        if (dst < 0 || dst >= pp) continue;
        const std::string recv_name = "recv_" + name.substr(5, gt - 5) + "<" + std::to_string(src);
        for (const auto& recv : acts[dst][k])
          if (recv["name"] == recv_name && recv["ts"].get<double>() <= send["ts"].get<double>())
            delivery.push_back(end_of(recv) - send["ts"].get<double>());
      }
  t.costs.comm = mean(delivery);
  t.deliveries = static_cast<int>(delivery.size());
  for (size_t k = 0; k < steps; ++k) {
    double step = 0, phase = 0;
    for (int r = 0; r < pp; ++r) {
      if (k < step_dur[r].size()) step = std::max(step, step_dur[r][k]);
      phase = std::max(phase, phase_dur[r][k]);
    }
    t.step_us += step / static_cast<double>(steps);
    t.pipeline_us += phase / static_cast<double>(steps);
  }
  return t;
}

}  // namespace smp
