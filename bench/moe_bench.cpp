#include "moe_bench.h"

#include "comm_probe.h"
#include "jobs.h"

#include <smp_nn/moe.hpp>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <boost/filesystem.hpp>

#include <algorithm>
#include <cstdio>
#include <chrono>
#include <iostream>
#include <map>
#include <tuple>

namespace bench {

namespace {

// Goals count only on the median of at least this many interleaved pairs.
constexpr size_t kMinPairs = 10;

std::vector<double> paired_ratios(const std::vector<double>& num, const std::vector<double>& den) {
  std::vector<double> r;
  for (size_t k = 0; k < std::min(num.size(), den.size()); ++k) r.push_back(num[k] / den[k]);
  return r;
}

json runs_json(const std::vector<Measured>& measured) {
  json runs = json::array();
  for (const Measured& m : measured) {
    json r = {{"label", m.job.label}, {"ok", m.ok}, {"step_seconds_per_repeat", m.step_seconds_all}};
    if (m.ok) r["tokens_per_s"] = m.best.summary["tokens_per_s"];
    else r["error_output"] = m.best.output;
    runs.push_back(r);
  }
  return runs;
}

// Rank r's share of its traced steps spent waiting for the all-to-alls on ep.
double a2a_wait_share(const json& trace) {
  double steps = 0, waits = 0;
  for (const auto& e : trace.value("traceEvents", json::array())) {
    const std::string name = e.value("name", ""), cat = e.value("cat", "");
    if (e.value("ph", "") != "X") continue;
    if (cat == "step") steps += e.value("dur", 0.0);
    if (cat == "wait" && name == "wait alltoall ep") waits += e.value("dur", 0.0);
  }
  return steps > 0 ? waits / steps : 0.0;
}

// Rank r's ep all-to-all waits by pass, in ms per step: "forward" (inside a
// forward compute event, F<microbatch>) and "backward" (B<microbatch>). A
// forward wait has nothing of its microbatch left to compute beside it (the
// next layer needs the exchange's result); a backward one has the weight
// gradients.
json a2a_waits_by_pass(const json& trace) {
  struct Span { double begin, end; bool forward; };
  std::vector<Span> passes;
  double steps = 0, fwd = 0, bwd = 0;
  const json none = json::array();
  const json& events = trace.contains("traceEvents") ? trace["traceEvents"] : none;
  for (const auto& e : events) {
    if (e.value("ph", "") != "X") continue;
    const std::string cat = e.value("cat", ""), name = e.value("name", "");
    if (cat == "step") ++steps;
    if (cat == "compute" && !name.empty() && (name[0] == 'F' || name[0] == 'B'))
      passes.push_back({e.value("ts", 0.0), e.value("ts", 0.0) + e.value("dur", 0.0), name[0] == 'F'});
  }
  for (const auto& e : events) {
    if (e.value("ph", "") != "X" || e.value("name", "") != "wait alltoall ep") continue;
    const double ts = e.value("ts", 0.0), dur = e.value("dur", 0.0);
    for (const Span& p : passes)
      if (ts >= p.begin && ts < p.end) {
        (p.forward ? fwd : bwd) += dur;
        break;
      }
  }
  const double per = steps > 0 ? 1e3 * steps : 1.0;
  return {{"forward", fwd / per}, {"backward", bwd / per}};
}

// A trace's phase and wait events summed per name ("optimizer", "wait
// alltoall ep", ...), in ms per step.
json phase_ms_per_step(const json& trace) {
  std::map<std::string, double> us;
  double steps = 0;
  for (const auto& e : trace.value("traceEvents", json::array())) {
    if (e.value("ph", "") != "X") continue;
    const std::string cat = e.value("cat", "");
    if (cat == "step") ++steps;
    if (cat == "phase" || cat == "wait") us[e.value("name", "")] += e.value("dur", 0.0);
    if (cat == "step") us["step"] += e.value("dur", 0.0);
  }
  json out = json::object();
  for (const auto& [k, v] : us) out[k] = steps > 0 ? v / steps / 1e3 : 0.0;
  return out;
}

// The ep all-to-all waits of two ranks split in two. An exchange ends on
// both ranks at about the same time (trace times are the machine's steady
// clock, the same in every process), so a wait of one rank is matched with
// the other's that ended within kMatchUs of it. The part both waited (the
// shorter of the two) is the exchange itself and its hand-offs; the rest, and
// a wait the other rank did not have (waits under 1 us are not traced), is
// the time this rank waited while the other still computed: routing
// imbalance between the ranks' experts.
json a2a_wait_parts(const json& t0, const json& t1) {
  constexpr double kMatchUs = 200;
  struct Wait { double end, dur; };
  auto waits = [](const json& t, double& steps) {
    std::vector<Wait> w;
    for (const auto& e : t.value("traceEvents", json::array())) {
      if (e.value("ph", "") != "X") continue;
      if (e.value("cat", "") == "step") ++steps;
      if (e.value("cat", "") == "wait" && e.value("name", "") == "wait alltoall ep")
        w.push_back({e.value("ts", 0.0) + e.value("dur", 0.0), e.value("dur", 0.0)});
    }
    std::sort(w.begin(), w.end(), [](const Wait& a, const Wait& b) { return a.end < b.end; });
    return w;
  };
  double s0 = 0, s1 = 0;
  const std::vector<Wait> w[2] = {waits(t0, s0), waits(t1, s1)};
  if (s0 <= 0 || s1 != s0) return {{"error", "the ranks' traces hold different step counts"}};
  double both = 0, only[2] = {0, 0}, matched = 0;
  for (int r = 0; r < 2; ++r)
    for (const Wait& a : w[r]) {
      const auto& other = w[1 - r];
      auto it = std::lower_bound(other.begin(), other.end(), a.end - kMatchUs,
                                 [](const Wait& x, double v) { return x.end < v; });
      const double partner = it != other.end() && it->end <= a.end + kMatchUs ? it->dur : 0.0;
      const double m = std::min(a.dur, partner);
      only[r] += a.dur - m;
      if (r == 0) both += m, matched += partner > 0;
    }
  const double per = 1e3 * s0;
  return {{"waits_per_step", {static_cast<double>(w[0].size()) / s0, static_cast<double>(w[1].size()) / s0}},
          {"matched_per_step", matched / s0},
          {"match_window_us", kMatchUs},
          {"both_waited_ms_per_step", both / per},
          {"imbalance_ms_per_step", {only[0] / per, only[1] / per}}};
}

// The experts of one MoE layer forward and backward on routed rows: grouped
// GEMMs against the loop over experts a PyTorch user writes (each expert's
// rows found by a mask, gathered, computed, added back), SwiGLU, one thread.
json grouped_gemm_probe(int reps, int64_t E, int64_t k, int64_t f) {
  at::set_num_threads(1);
  const int64_t tokens = 2048, h = 128;
  auto gen = at::detail::createCPUGenerator(7);
  const at::Tensor x = at::randn({tokens, h}, gen);
  const at::Tensor expert = at::randint(E, {tokens * k}, gen);  // a uniform routing
  const at::Tensor gate = at::randn({E, f, h}, gen).mul(0.05), up = at::randn({E, f, h}, gen).mul(0.05),
                   down = at::randn({E, h, f}, gen).mul(0.05);
  const at::Tensor order = std::get<1>(expert.sort(true, 0, false));
  const at::Tensor tok = at::arange(tokens).repeat_interleave(k).index_select(0, order);
  const at::Tensor counts_t = at::bincount(expert, {}, E);
  const std::vector<int64_t> counts(counts_t.data_ptr<int64_t>(), counts_t.data_ptr<int64_t>() + E);
  using clock = std::chrono::steady_clock;
  auto grouped = [&] {
    at::Tensor xi = x.clone().requires_grad_(true);
    at::Tensor g = gate.clone().requires_grad_(true), u = up.clone().requires_grad_(true),
               d = down.clone().requires_grad_(true);
    const auto t0 = clock::now();
    smp_nn::MoeParams p;
    p.gate = g, p.up = u, p.down = d;
    smp_nn::MoeConfig c{};
    c.swiglu = true;
    at::Tensor y = smp_nn::experts_mlp(p, c, xi.index_select(0, tok), counts);
    at::zeros({tokens, h}).index_add(0, tok, y).sum().backward();
    return std::chrono::duration<double>(clock::now() - t0).count();
  };
  auto loop = [&] {
    at::Tensor xi = x.clone().requires_grad_(true);
    at::Tensor g = gate.clone().requires_grad_(true), u = up.clone().requires_grad_(true),
               d = down.clone().requires_grad_(true);
    const auto t0 = clock::now();
    const at::Tensor owner = at::arange(tokens).repeat_interleave(k);
    at::Tensor out = at::zeros({tokens, h});
    for (int64_t e = 0; e < E; ++e) {
      const at::Tensor rows = owner.index_select(0, expert.eq(e).nonzero().squeeze(1));
      const at::Tensor xe = xi.index_select(0, rows);
      const at::Tensor ye = at::matmul(at::silu(at::matmul(xe, g[e].t())) * at::matmul(xe, u[e].t()), d[e].t());
      out = out.index_add(0, rows, ye);
    }
    out.sum().backward();
    return std::chrono::duration<double>(clock::now() - t0).count();
  };
  grouped(), loop();  // warm-up
  std::vector<double> tg, tl, ratio;
  for (int r = 0; r < reps; ++r) {
    tg.push_back(grouped());
    tl.push_back(loop());
    ratio.push_back(tl.back() / tg.back());
  }
  return {{"shape", {{"tokens", tokens}, {"top_k", k}, {"experts", E}, {"hidden", h}, {"expert_ffn", f}}},
          {"method", "one SwiGLU MoE layer's experts, forward and backward, on 1 thread: smp_nn::experts_mlp "
                     "(grouped GEMMs over rows sorted by expert) vs a loop over experts (mask, gather, three "
                     "matmuls, index_add per expert); interleaved repetitions; ratio = loop / grouped time"},
          {"grouped_seconds", tg},
          {"loop_seconds", tl},
          {"loop_over_grouped_per_rep", ratio},
          {"median_loop_over_grouped", median_from(ratio, 0)}};
}

// Traced runs cost time, so they are not timed ones.
JobResult run_traced(Job job) {
  job.label += "-traced";
  job.overrides.push_back("run.trace=true");
  return run_job(job);
}

// What ep 2 can take off ep 1's step at most, from a traced ep 1 run (t1;
// its phases per rank into `phases`) and the ep 2 one (t2, for the gradient
// bytes); see "method".
json ep2_best_case(const JobResult& t1, const JobResult& t2, json& phases) {
  for (const auto& tr : t1.traces) phases.push_back(phase_ms_per_step(tr));
  // The most ep 2 can take off ep 1's step with the same computation: half
  // the optimizer and the clip's norm (the experts, nearly all parameters,
  // are halved per rank) and the expert gradients' dp all-reduce, which ep 2
  // does not do: its whole time, as the all-reduce probe measures it at the
  // bytes by which ep 1's gradients exceed ep 2's, twice (ep 2 holds half the
  // experts). ep 1's traced grad_sync is not counted: beyond the all-reduce
  // it is one rank waiting for the other, which ep 2 has as well.
  double bound = 0, step = 0;
  for (const auto& ph : phases) {
    auto ms = [&](const char* k) { return ph.value(k, 0.0); };
    bound = std::max(bound, 0.5 * ms("optimizer") + 0.5 * ms("clip"));
    step = std::max(step, ms("step"));
  }
  auto grad_bytes = [](const JobResult& r) {
    return r.exit_code == 0 && r.summary.contains("memory_bytes") ? r.summary["memory_bytes"]["gradients"][0].get<double>()
                                                                  : 0.0;
  };
  const auto expert_bytes = static_cast<int64_t>(2 * (grad_bytes(t1) - grad_bytes(t2)));
  double reduce_ms = 0;
  json probe;
  if (expert_bytes > 0) {
    probe = run_allreduce_probe(expert_bytes, 5);
    for (const auto& rk : probe.value("ranks", json::array())) {
      const json& shm = rk.value("shm", json::object());
      if (!shm.is_object() || !shm.contains("allreduce_wall_s")) continue;
      const double added = shm["gemm_loop_with_allreduce_in_flight_s"].get<double>() - shm["gemm_loop_alone_s"].get<double>();
      reduce_ms = std::max({reduce_ms, 1e3 * shm["allreduce_wall_s"].get<double>(), 1e3 * added});
    }
  }
  if (step > 0)
    return {{"ep1_step_ms", step},
            {"optimizer_clip_bound_ms", bound},
            {"expert_gradient_bytes", expert_bytes},
            {"expert_allreduce_ms", reduce_ms},
            {"savings_bound_ms", bound + reduce_ms},
            {"ep2_over_ep1_at_best", (step - bound - reduce_ms) / step},
            {"allreduce_probe", probe},
            {"method", "from the traced dp2-ep1 run, the larger rank's 0.5 optimizer + 0.5 clip, plus an "
                       "all-reduce of the expert gradients' bytes between two ranks (smp-bench allreduce-probe, "
                       "shared memory, the larger rank's of its wall time and of what it adds to a 1-thread GEMM "
                       "loop), against ep 1's step; ep 2 computes the same GEMMs"}};
  return json();
}

// ep 2 against ep 1 on two ranks: paired step times, one traced ep 2 run's
// all-to-all waits, and (best_case) one traced ep 1 run with ep 2's bound.
json ep_comparison(const Job& ep1, const Job& ep2, const MoeBenchOptions& o, bool best_case) {
  auto measured = run_repeated({ep1, ep2}, o.repeat, o.quiet_cores, o.job_wait_s);
  const auto ratios = paired_ratios(measured[1].step_seconds_all, measured[0].step_seconds_all);
  json part = {{"runs", runs_json(measured)},
               {"ep2_over_ep1_step_time_paired", {{"per_repeat", ratios}, {"median", median_from(ratios, 0)}}}};
  // The all-to-all's share: one traced ep 2 run.
  const JobResult t = run_traced(ep2);
  json shares = json::array();
  for (const auto& tr : t.traces) shares.push_back(a2a_wait_share(tr));
  part["a2a_wait_share_per_rank"] = shares;
  double worst = 0;
  for (const auto& sh : shares) worst = std::max(worst, sh.get<double>());
  const double med = median_from(ratios, 0);
  part["goals"] = {{"ep2_over_ep1_at_most_0.95",
                    {{"target", 0.95}, {"pairs", ratios.size()}, {"met", ratios.size() >= kMinPairs && med <= 0.95}}},
                   {"a2a_wait_share_below_0.05", {{"target", 0.05}, {"met", !shares.empty() && worst < 0.05}}}};
  part["a2a_method"] = "one traced dp2-ep2 run (not timed): per rank, the time its compute waited for all-to-alls on "
                       "ep (trace events 'wait alltoall ep', forward and backward) over its traced steps' time";
  if (t.traces.size() == 2) part["a2a_wait_parts"] = a2a_wait_parts(t.traces[0], t.traces[1]);
  json by_pass = json::array();
  for (const auto& tr : t.traces) by_pass.push_back(a2a_waits_by_pass(tr));
  part["a2a_wait_ms_per_step_by_pass"] = by_pass;
  if (best_case) {
    const JobResult t1 = run_traced(ep1);
    json phases = json::array();
    part["ep2_best_case"] = ep2_best_case(t1, t, phases);
    part["ep1_traced_ms_per_step"] = phases;
  }
  json phases2 = json::array();
  for (const auto& tr : t.traces) phases2.push_back(phase_ms_per_step(tr));
  part["ep2_traced_ms_per_step"] = phases2;
  part["traced_method"] = std::string(best_case ? "one traced run each of dp2-ep1 and dp2-ep2" : "one traced dp2-ep2 run") +
                          " (not timed): per rank, the trace's phase and wait events in ms per step; a2a_wait_parts "
                          "matches the ranks' ep all-to-all waits by their end times";
  if (t.exit_code == 0 && t.summary.contains("train_metrics")) {
    const auto& mb = t.summary["train_metrics"]["moe_a2a_bytes"];
    part["a2a_forward_bytes_per_rank_step"] = mb.empty() ? 0.0 : mb.back().get<double>();
  }
  std::cout << "  ep 2 / ep 1 step time, median of " << ratios.size() << " pairs: " << fmt(median_from(ratios, 0), 3)
            << "; all-to-all wait share (rank 0): " << (shares.empty() ? std::string("?") : fmt(shares[0].get<double>(), 3))
            << "\n";
  return part;
}

// ep_comparison from a trained router: the bench model trained kTrainSteps
// steps at dp 2 ep 1 (one run, checkpoint kept), then both layouts start
// from its parameters.
json ep_from_trained_router(const Job& ep1, const Job& ep2, const MoeBenchOptions& o) {
  constexpr int kTrainSteps = 300;
  namespace fs = boost::filesystem;
  const fs::path ckpt = fs::temp_directory_path() / fs::unique_path("smp-bench-moe-router-%%%%%%");
  Job train = ep1;
  train.label = "dp2-ep1-train-router";
  for (const std::string& kv : std::vector<std::string>{"train.steps=" + std::to_string(kTrainSteps),
                                                        "run.checkpoint_every=" + std::to_string(kTrainSteps),
                                                        "run.checkpoint_dir=" + ckpt.string(), "train.log_every=50"})
    train.overrides.push_back(kv);
  const JobResult t = run_job(train);
  json part;
  if (t.exit_code != 0) {
    part["error_output"] = t.output;
  } else {
    char step_dir[32];
    std::snprintf(step_dir, sizeof step_dir, "step-%08d", kTrainSteps);
    const std::string from = "run.init_from=" + (ckpt / step_dir).string();
    Job a = ep1, b = ep2;
    a.label += "-trained", b.label += "-trained";
    a.overrides.push_back(from), b.overrides.push_back(from);
    part = ep_comparison(a, b, o, false);
    const auto& load = t.summary["train_metrics"]["moe_load"];
    part["training"] = {{"steps", kTrainSteps},
                        {"layout", "dp 2, ep 1"},
                        {"moe_load_first_logged", load.empty() ? json() : load.front()},
                        {"moe_load_last", load.empty() ? json() : load.back()},
                        {"final_loss", t.summary.value("final_loss", json())}};
    part["method"] = "the bench model trained " + std::to_string(kTrainSteps) + " steps once (dp 2, ep 1, the bench "
                     "config's schedule over those steps), then every job of the comparison starts from its "
                     "parameters (run.init_from: fresh optimizer and schedule), as the fresh-model comparison";
  }
  boost::system::error_code ec;
  fs::remove_all(ckpt, ec);
  return part;
}

}  // namespace

json run_moe_bench(const MoeBenchOptions& o) {
  json result;
  std::cout << "\nsmp-bench moe: " << o.repeat << " interleaved pairs per comparison\n";
  // 1. ep 2 against ep 1 on two ranks (dp 2 either way), from a fresh model.
  Job ep1{"dp2-ep1", false, 2, o.config, o.overrides};
  ep1.overrides.push_back("parallel.dp=2");
  ep1.plugin = "moe";
  Job ep2 = ep1;
  ep2.label = "dp2-ep2";
  ep2.overrides.push_back("parallel.ep=2");
  result["ep"] = ep_comparison(ep1, ep2, o, true);
  // 1b. The same from a trained router. A fresh model's first steps route
  // unevenly (the busiest expert takes about 3x the mean by step 12, 1.4x
  // after 300 steps): the ranks' expert loads differ most there, which a
  // long run does not see. Trained once at dp 2 ep 1, then both layouts
  // start from its parameters (run.init_from).
  result["ep_trained_router"] = ep_from_trained_router(ep1, ep2, o);
  // 2. One rank against the PyTorch-eager MoE of the same shape.
  {
    Job eager{"pytorch-eager-moe", true, 1, o.config, o.overrides};
    eager.python_script = paths().source_dir + "/bench/eager_moe.py";
    Job one{"smp-1rank", false, 1, o.config, o.overrides};
    one.plugin = "moe";
    auto measured = run_repeated({eager, one}, o.repeat, o.quiet_cores, o.job_wait_s);
    const auto ratios = paired_ratios(measured[0].step_seconds_all, measured[1].step_seconds_all);
    const double med = median_from(ratios, 0);
    const bool met = ratios.size() >= kMinPairs && med >= 1.1;
    result["eager"] = {{"runs", runs_json(measured)},
                       {"smp_over_eager_tokens_per_s_paired", {{"per_repeat", ratios}, {"median", med}}},
                       {"goal", {{"target", 1.1}, {"pairs", ratios.size()}, {"min_pairs", kMinPairs}, {"met", met}}}};
    std::cout << "  smp 1 rank / PyTorch-eager MoE tokens/s, median of " << ratios.size() << " pairs: " << fmt(med, 3)
              << " (goal >= 1.1: " << (met ? "met" : "NOT met") << ")\n";
  }
  // 3. Grouped GEMM against a loop over experts.
  // At the bench model's experts (16 of ffn 128, top 4: 512 rows each) and at
  // DeepSeek-MoE's granularity (64 of ffn 64, top 6: 192 rows each).
  result["grouped_gemm"] = json::array();
  for (auto [E, k, f] : {std::tuple<int64_t, int64_t, int64_t>{16, 4, 128}, {64, 6, 64}}) {
    json probe = grouped_gemm_probe(std::max(o.repeat, 10) * 2, E, k, f);
    std::cout << "  loop over " << E << " experts / grouped GEMM time, median: "
              << fmt(probe["median_loop_over_grouped"].get<double>(), 3) << "\n";
    result["grouped_gemm"].push_back(probe);
  }
  // 4. Quality: the moe preset against its dense twin, same data, steps and active parameters.
  if (o.quality) {
    Job moe{"moe-small", false, 2, paths().source_dir + "/configs/moe-small.toml", {"parallel.dp=2", "parallel.ep=2"}};
    moe.plugin = "moe";
    Job dense{"moe-small-dense", false, 2, paths().source_dir + "/configs/moe-small-dense.toml", {"parallel.dp=2"}};
    const JobResult m = run_job(moe), d = run_job(dense);
    json q = {{"method", "configs/moe-small.toml (dp 2, ep 2) and configs/moe-small-dense.toml (dp 2), each trained "
                         "once; validation loss at the end (the model's loss alone, no aux or z term); moe_load at the "
                         "last step (busiest expert over the mean, per layer and rank microbatch)"}};
    if (m.exit_code == 0 && d.exit_code == 0) {
      const double mv = m.summary["val_loss"].get<double>(), dv = d.summary["val_loss"].get<double>();
      const double load = m.summary["train_metrics"]["moe_load"].back().get<double>();
      q["moe_val_loss"] = mv, q["dense_val_loss"] = dv;
      q["moe_val_losses"] = m.summary["val_losses"], q["dense_val_losses"] = d.summary["val_losses"];
      q["moe_load_last_step"] = load;
      q["moe_val_metrics"] = m.summary["val_metrics"];
      q["goals"] = {{"moe_val_below_dense", {{"met", mv < dv}}}, {"moe_load_at_most_1.3", {{"target", 1.3}, {"met", load <= 1.3}}}};
      std::cout << "  validation loss: moe " << fmt(mv, 4) << ", dense " << fmt(dv, 4) << "; moe_load at the end "
                << fmt(load, 3) << "\n";
    } else {
      q["error_output"] = m.exit_code != 0 ? m.output : d.output;
    }
    result["quality"] = q;
  }
  return result;
}

}  // namespace bench
