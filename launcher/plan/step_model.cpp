#include "plan/step_model.h"

#include <algorithm>
#include <cmath>

namespace smp::plan {

namespace {

// Elementwise passes over a layer's activations per forward (each pass reads
// or writes the tensor once), the implementation's constants for every
// cluster and shape: layer norms, residual adds and dropouts over [b, s, h]
// on every tp rank; the split q, k, v over [b, s, 3h/t]; the activation over
// [b, s, ffn/t]; the fused scale-mask-softmax and the dropout over the
// attention probabilities [b, heads/t, s, s]. A backward makes twice the passes.
constexpr double kReplicatedPasses = 16, kQkvPasses = 4, kActivationPasses = 2, kSoftmaxPasses = 5;
// Bytes per parameter: AdamW's fp32 master, two moments; and what a step of
// AdamW reads and writes per parameter (master, moments, gradient, weight).
constexpr double kOptimizerStateBytes = 12, kOptimizerStepBytes = 16;

double ring_allreduce(const Link& link, double bytes, int n) {
  if (n <= 1) return 0;
  return 2.0 * (n - 1) / n * bytes / link.bandwidth + 2.0 * (n - 1) * link.latency;
}

// Whether each axis' group stays inside a node: axes fill a node in the
// cluster's order (then tp, pp, dp), each spanning the product of those before.
struct Links {
  const Link *tp, *pp, *dp;
};
Links links_of(const Cluster& c, const Layout& l) {
  std::vector<std::string> order = c.inside_node;
  for (const char* a : {"tp", "pp", "dp"})
    if (std::find(order.begin(), order.end(), a) == order.end()) order.push_back(a);
  Links out{&c.inter, &c.inter, &c.inter};
  int64_t span = 1;
  for (const std::string& a : order) {
    const int size = a == "tp" ? l.tp : a == "pp" ? l.pp : a == "dp" ? l.dp : 1;
    span *= size;
    const Link* link = span <= c.node_size ? &c.intra : &c.inter;
    if (a == "tp") out.tp = link;
    if (a == "pp") out.pp = link;
    if (a == "dp") out.dp = link;
  }
  return out;
}

}  // namespace

std::string Layout::describe() const {
  return "tp " + std::to_string(tp) + " pp " + std::to_string(pp) + " dp " + std::to_string(dp) + " " +
         (virtual_stages > 1 ? "interleaved v " + std::to_string(virtual_stages) : schedule) + " mb " +
         std::to_string(microbatch) + " zero " + std::to_string(zero) + (recompute ? " recompute" : "");
}

std::vector<std::string> Layout::sets(const Shape& s) const {
  return {"parallel.tp=" + std::to_string(tp),
          "parallel.pp=" + std::to_string(pp),
          "parallel.dp=" + std::to_string(dp),
          "parallel.microbatches=" + std::to_string(microbatches(s)),
          "parallel.virtual_stages=" + std::to_string(virtual_stages),
          "parallel.schedule=\"" + (virtual_stages > 1 ? std::string("interleaved-1f1b") : schedule) + "\"",
          "parallel.zero=" + std::to_string(zero),
          // Full recomputation: every transformer layer keeps only its input.
          std::string("memory.checkpoint=") + (recompute ? "[\"transformer_layer\"]" : "[]")};
}

nlohmann::json Prediction::to_json() const {
  return {{"fits", fits},
          {"memory_bytes", memory_bytes},
          {"step_seconds", step_seconds},
          {"terms_seconds",
           {{"compute", compute}, {"tp", tp_comm}, {"pp", pp_comm}, {"bubble", bubble}, {"dp", dp_comm},
            {"optimizer", optimizer}}},
          {"flops_per_step", flops},
          {"model_flops_per_step", model_flops},
          {"tflops_per_device", tflops_per_device},
          {"mfu", mfu},
          {"tokens_per_s", tokens_per_s}};
}

std::string invalid(const Shape& s, const Layout& l, int world) {
  if (l.tp * l.pp * l.dp != world) return "tp x pp x dp is not the world size";
  if (s.heads % l.tp || s.ffn_size() % l.tp) return "heads or ffn do not divide by tp";
  if (s.layers % (l.pp * l.virtual_stages)) return "layers do not divide into pp x virtual stages";
  if (s.batch % (l.dp * l.microbatch)) return "the batch does not divide into dp x microbatch";
  if (l.virtual_stages > 1 && (l.pp == 1 || l.microbatches(s) % l.pp)) return "interleaving needs pp > 1 and microbatches divisible by pp";
  if (l.virtual_stages > 1 && l.schedule != "1f1b") return "interleaving is a 1F1B schedule";
  if (l.schedule != "1f1b" && l.schedule != "gpipe" && l.schedule != "zb-h1") return "unknown schedule " + l.schedule;
  if (l.pp == 1 && l.schedule != "1f1b") return "one stage has no schedule to choose";
  return "";
}

Prediction predict(const Cluster& c, const Shape& s, const Layout& l) {
  Prediction p;
  const double t = l.tp, b = static_cast<double>(l.microbatch), seq = static_cast<double>(s.seq);
  const double h = static_cast<double>(s.hidden), f = static_cast<double>(s.ffn_size()),
               a = static_cast<double>(s.heads), V = static_cast<double>(s.vocab);
  const double peak = c.peak(s.dtype), bytes = s.dtype == "fp32" ? 4 : 2;
  const double bs = b * seq;
  const Links link = links_of(c, l);
  // One layer's forward on one rank, one microbatch.
  auto gemm = [&](double m, double k, double n, double batch = 1) {
    return 2 * m * k * n * batch / (peak * c.efficiency(std::min({m, k, n})));
  };
  const double layer_gemm = gemm(bs, h, 3 * h / t) + gemm(bs, h / t, h) + gemm(bs, h, f / t) + gemm(bs, f / t, h) +
                            2 * gemm(seq, h / a, seq, b * a / t);
  const double layer_bytes = bytes * (kReplicatedPasses * bs * h + kQkvPasses * bs * 3 * h / t +
                                      kActivationPasses * bs * f / t + kSoftmaxPasses * b * (a / t) * seq * seq);
  const double layer_forward = layer_gemm + layer_bytes / c.memory_bandwidth;
  const double passes = 3 + (l.recompute ? 1 : 0);  // forward, backward (2x), recomputed forward
  const double tp_allreduce = ring_allreduce(*link.tp, bytes * bs * h, l.tp);
  const double layer_step = passes * layer_forward + (2 * passes - 2) * tp_allreduce;
  // The head on the last stage: logits GEMM forward and backward, the loss's passes in fp32.
  const double head = 3 * gemm(bs, h, V / t) + 3 * 4 * 4 * bs * V / t / c.memory_bandwidth;
  const double layers_per_stage = static_cast<double>(s.layers) / l.pp;
  const double stage = layers_per_stage * layer_step + head;  // the last stage, the slowest
  // Between stages: activations forward and gradients back per microbatch and
  // chunk, each tp rank sending its 1/t (Megatron's scatter-gather).
  const double m = static_cast<double>(l.microbatches(s)), v = l.virtual_stages;
  const double hop = l.pp > 1 ? 2 * v * (bytes * bs * h / t / link.pp->bandwidth + link.pp->latency) : 0;
  const double per_microbatch = stage + hop;
  p.compute = m * stage;
  p.pp_comm = m * hop;
  p.tp_comm = m * layers_per_stage * (2 * passes - 2) * tp_allreduce;
  p.compute -= p.tp_comm;  // kept apart: stage above holds both
  // Zero bubble H1: the bubble is (p - 1)(F + B - 2W) instead of (p - 1)(F + B),
  // with the weight gradient W half of the backward B (2F): a third of it goes.
  p.bubble = (l.pp - 1) / v * per_microbatch * (l.schedule == "zb-h1" ? 2.0 / 3.0 : 1.0);
  // Parameters per rank (the first stage, with the embedding; the tied head's copy on the last).
  const double layer_params = 4 * h * h + 2 * h * f + 9 * h + f;
  const double stage_params = layers_per_stage * layer_params / t + V * h / t + (l.pp == 1 ? seq * h : 0);
  const double dp = l.dp;
  const double grad_bytes = bytes * stage_params;
  // Reduce-scatter + all-gather under ZeRO move the same bytes as the all-reduce.
  const double reduce = ring_allreduce(*link.dp, grad_bytes, l.dp);
  const double hidden_by_backward = l.overlap_dp ? layers_per_stage * 2 * layer_forward : 0;
  p.dp_comm = std::max(0.0, reduce - hidden_by_backward);
  if (l.zero == 3)  // parameters gathered again for every forward and backward
    p.dp_comm += m * (passes - 1) * ring_allreduce(*link.dp, bytes * stage_params, l.dp) / 2;
  p.optimizer = kOptimizerStepBytes * stage_params / (l.zero >= 1 ? dp : 1) / c.memory_bandwidth;
  p.step_seconds = p.compute + p.tp_comm + p.pp_comm + p.bubble + p.dp_comm + p.optimizer;
  // Memory: weights, gradients, optimizer state (each sharded by its ZeRO stage) and activations.
  const double weights = bytes * stage_params / (l.zero >= 3 ? dp : 1);
  const double grads = bytes * stage_params / (l.zero >= 2 ? dp : 1);
  const double state = kOptimizerStateBytes * stage_params / (l.zero >= 1 ? dp : 1);
  const double full_layer = bs * h * (10 + 24 / t + 5 * a * seq / (h * t));  // Korthikanti et al., fp16, no SP
  const double kept_layer = l.recompute ? bytes * bs * h : full_layer;
  const double in_flight =
      l.schedule == "gpipe" ? m : std::min<double>(m, l.pp * (1 + (l.pp - 1) / (l.pp * v)));
  const double activations = in_flight * layers_per_stage * kept_layer + (l.recompute ? full_layer : 0) +
                             2 * 4 * bs * V / t;  // the logits and their gradient in fp32, one microbatch
  p.memory_bytes = weights + grads + state + activations;
  p.fits = p.memory_bytes <= c.memory_bytes;
  // FLOPs as the paper counts them (f = 4h gives its equation 3).
  const double B = static_cast<double>(s.batch), L = static_cast<double>(s.layers);
  const double layer_fwd = B * seq * (8 * h * h + 4 * h * f + 4 * seq * h), head_fwd = 2 * B * seq * h * V;
  p.model_flops = L * 3 * layer_fwd + 3 * head_fwd;
  p.flops = p.model_flops + (l.recompute ? L * layer_fwd : 0);
  const double world = l.tp * l.pp * l.dp;
  p.tflops_per_device = p.flops / p.step_seconds / world / 1e12;
  p.mfu = p.model_flops / p.step_seconds / world / peak;
  p.tokens_per_s = B * seq / p.step_seconds;
  return p;
}

}  // namespace smp::plan
