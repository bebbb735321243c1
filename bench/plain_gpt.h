// The plain LibTorch reference for `smp-bench gpt`: the same GPT-2 model, data,
// initialisation, AdamW and step as an smp job, written directly with at:: ops in
// one process (no smp runtime, no plugins, no C ABI). Run as `smp-bench plain-run`.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace bench {

struct PlainOptions {
  std::string config;                  // the same TOML as the smp jobs
  std::vector<std::string> overrides;  // the same --set overrides
  // Ablations, to attribute a gap between smp and plain (default: the natural way):
  //   "norm": global grad norm as smp computes it (each grad .to(double).pow(2).sum().item())
  //   "ce":   smp_nn's cross entropy (log_softmax, gather, ignore-index mask, mean)
  //   "mask": build the causal mask in every attention call (as smp_nn does)
  std::vector<std::string> mimic;
  bool phases = false;  // time forward / backward / clip / optimizer separately (adds syncs: none on CPU)
};

// Trains train.steps steps and returns a summary shaped like smp's summary.json
// (losses, step_seconds = mean step time excluding the first step, tokens_per_s,
// model_flops_per_step, per-step seconds, parameter count and bytes).
nlohmann::json run_plain_gpt(const PlainOptions& o);

// Times one pipeline stage of `layers_in_stage` GPT blocks (hidden 256) on a
// micro-batch: forward, full backward, and the zero-bubble split done the way the
// executor does it (BI = autograd::grad w.r.t. the stage input with retain_graph,
// BW = autograd::backward from the root again with inputs = the parameters).
nlohmann::json run_zb_probe(int64_t micro_batch, int64_t layers_in_stage, int reps);

}  // namespace bench
