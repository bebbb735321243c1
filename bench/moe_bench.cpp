#include "moe_bench.h"

#include "jobs.h"

#include <smp_nn/moe.hpp>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
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

}  // namespace

json run_moe_bench(const MoeBenchOptions& o) {
  json result;
  std::cout << "\nsmp-bench moe: " << o.repeat << " interleaved pairs per comparison\n";
  // 1. ep 2 against ep 1 on two ranks (dp 2 either way).
  {
    Job ep1{"dp2-ep1", false, 2, o.config, o.overrides};
    ep1.overrides.push_back("parallel.dp=2");
    ep1.plugin = "moe";
    Job ep2 = ep1;
    ep2.label = "dp2-ep2";
    ep2.overrides.push_back("parallel.ep=2");
    auto measured = run_repeated({ep1, ep2}, o.repeat, o.quiet_cores, o.job_wait_s);
    const auto ratios = paired_ratios(measured[1].step_seconds_all, measured[0].step_seconds_all);
    json part = {{"runs", runs_json(measured)},
                 {"ep2_over_ep1_step_time_paired", {{"per_repeat", ratios}, {"median", median_from(ratios, 0)}}}};
    // The all-to-all's share: one traced run (traces cost time, so it is not a timed one).
    Job traced = ep2;
    traced.label = "dp2-ep2-traced";
    traced.overrides.push_back("run.trace=true");
    const JobResult t = run_job(traced);
    json shares = json::array();
    for (const auto& tr : t.traces) shares.push_back(a2a_wait_share(tr));
    part["a2a_wait_share_per_rank"] = shares;
    part["a2a_method"] = "one traced dp2-ep2 run (not timed): per rank, the time its compute waited for all-to-alls on "
                         "ep (trace events 'wait alltoall ep', forward and backward) over its traced steps' time";
    if (t.exit_code == 0 && t.summary.contains("train_metrics")) {
      const auto& mb = t.summary["train_metrics"]["moe_a2a_bytes"];
      part["a2a_forward_bytes_per_rank_step"] = mb.empty() ? 0.0 : mb.back().get<double>();
    }
    std::cout << "  ep 2 / ep 1 step time, median of " << ratios.size() << " pairs: " << fmt(median_from(ratios, 0), 3)
              << "; all-to-all wait share (rank 0): " << (shares.empty() ? std::string("?") : fmt(shares[0].get<double>(), 3))
              << "\n";
    result["ep"] = part;
  }
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
