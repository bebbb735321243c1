#include "plan/step_model.h"

#include <algorithm>
#include <cmath>

namespace smp::plan {

namespace {

// Elementwise passes over a layer's activations per forward (each pass reads
// or writes the tensor once), the implementation's constants for every
// cluster and shape: layer norms, residual adds and dropouts over [b, s, h]
// on every tp rank; the split q, k, v over [b, s, (h + 2 kv)/t]; the
// activation over [b, s, ffn/t] (SwiGLU: the gate's and the product's); the
// fused scale-mask-softmax and the dropout over the attention probabilities
// [b, heads/t, s, s]; a MoE layer's router over [b, s, experts] and the
// routed rows sorted, sent, received, gated and added back over [b s k, h].
// A backward makes twice the passes.
constexpr double kReplicatedPasses = 16, kQkvPasses = 4, kActivationPasses = 2, kGatedActivationPasses = 4,
                 kSoftmaxPasses = 5, kRouterPasses = 8, kRoutedPasses = 8;
// Operators per forward of one layer as smp's layers call them (each one
// costs the cluster's op_overhead; a backward, twice): attention with its
// norm and residual, a dense MLP, a MoE layer's routing and each local expert;
// the head and loss per microbatch; per parameter tensor at the step.
constexpr double kAttentionOps = 40, kMlpOps = 12, kRouterOps = 40, kExpertOps = 8, kHeadOps = 20,
                 kOpsPerParameterTensor = 12, kTensorsPerLayer = 12;
// Bytes per parameter: AdamW's fp32 master, two moments; and what a step of
// AdamW (with the gradient norm's read for clipping) reads and writes per
// parameter (master, moments, gradient, weight).
constexpr double kOptimizerStateBytes = 12, kOptimizerStepBytes = 20;

double ring_allreduce(const Link& link, double bytes, int n) {
  if (n <= 1) return 0;
  return 2.0 * (n - 1) / n * bytes / link.bandwidth + 2.0 * (n - 1) * link.latency;
}

// Each rank sends (n - 1)/n of `bytes`, one message to each peer.
double alltoall(const Link& link, double bytes, int n) {
  if (n <= 1) return 0;
  return static_cast<double>(n - 1) / n * bytes / link.bandwidth + (n - 1) * link.latency;
}

// Whether each axis' group stays inside a node: axes fill a node in the
// cluster's order (then tp, pp, dp), each spanning the product of those
// before; ep is dp's first ranks.
// cp sits just outside tp (smp's placement) unless the cluster names it.
struct Links {
  const Link *tp, *pp, *dp, *ep, *cp;
};
Links links_of(const Cluster& c, const Layout& l) {
  std::vector<std::string> order = c.inside_node;
  if (std::find(order.begin(), order.end(), "cp") == order.end()) {
    const auto tp = std::find(order.begin(), order.end(), "tp");
    order.insert(tp == order.end() ? order.begin() : tp + 1, "cp");
  }
  for (const char* a : {"tp", "pp", "dp"})
    if (std::find(order.begin(), order.end(), a) == order.end()) order.push_back(a);
  Links out{&c.inter, &c.inter, &c.inter, &c.inter, &c.inter};
  int64_t span = 1;
  for (const std::string& a : order) {
    if (a == "ep") continue;
    const int size = a == "tp" ? l.tp : a == "pp" ? l.pp : a == "dp" ? l.dp : a == "cp" ? l.cp : 1;
    if (a == "dp") out.ep = span * l.ep <= c.node_size ? &c.intra : &c.inter;
    span *= size;
    const Link* link = span <= c.node_size ? &c.intra : &c.inter;
    if (a == "tp") out.tp = link;
    if (a == "pp") out.pp = link;
    if (a == "dp") out.dp = link;
    if (a == "cp") out.cp = link;
  }
  if (c.has_alltoall) out.ep = &c.alltoall;
  return out;
}

// ["a", "b"] as a TOML array.
std::string kinds_list(const std::vector<std::string>& kinds) {
  std::string out = "[";
  for (size_t i = 0; i < kinds.size(); ++i) out += (i ? ", \"" : "\"") + kinds[i] + "\"";
  return out + "]";
}

}  // namespace

std::string Layout::describe() const {
  return "tp " + std::to_string(tp) + " pp " + std::to_string(pp) + " dp " + std::to_string(dp) + " " +
         (cp > 1 ? "cp " + std::to_string(cp) + " " : "") + (ep > 1 ? "ep " + std::to_string(ep) + " " : "") +
         (virtual_stages > 1 ? "interleaved v " + std::to_string(virtual_stages) : schedule) + " mb " +
         std::to_string(microbatch) + " zero " + std::to_string(zero) + (recompute ? " recompute" : "");
}

std::vector<std::string> Layout::sets(const Shape& s) const {
  std::vector<std::string> out = {"parallel.tp=" + std::to_string(tp),
          "parallel.pp=" + std::to_string(pp),
          "parallel.dp=" + std::to_string(dp),
          "parallel.cp=" + std::to_string(cp),
          "parallel.microbatches=" + std::to_string(microbatches(s)),
          "parallel.virtual_stages=" + std::to_string(virtual_stages),
          "parallel.schedule=\"" + (virtual_stages > 1 ? std::string("interleaved-1f1b") : schedule) + "\"",
          "parallel.zero=" + std::to_string(zero),
          // Full recomputation: every layer keeps only its inputs.
          "memory.checkpoint=" + (recompute ? kinds_list(s.recompute_kinds) : std::string("[]"))};
  if (s.experts > 0) out.push_back("parallel.ep=" + std::to_string(ep));
  return out;
}

nlohmann::json Prediction::to_json() const {
  return {{"fits", fits},
          {"memory_bytes", memory_bytes},
          {"step_seconds", step_seconds},
          {"terms_seconds",
           {{"compute", compute}, {"tp", tp_comm}, {"pp", pp_comm}, {"ep", ep_comm}, {"cp", cp_comm}, {"bubble", bubble},
            {"dp", dp_comm},
            {"optimizer", optimizer}}},
          {"flops_per_step", flops},
          {"model_flops_per_step", model_flops},
          {"tflops_per_device", tflops_per_device},
          {"mfu", mfu},
          {"tokens_per_s", tokens_per_s}};
}

std::string invalid(const Shape& s, const Layout& l, int world) {
  if (l.tp * l.pp * l.dp * l.cp != world) return "tp x pp x dp x cp is not the world size";
  if (l.cp > 1 && s.seq % (2 * l.cp)) return "the sequence does not cut into 2 cp chunks";
  if (l.cp > 1 && s.moe_layers > 0) return "context parallelism does not take expert layers yet";
  if (s.heads % l.tp || s.ffn_size() % l.tp) return "heads or ffn do not divide by tp";
  if (s.layers % (l.pp * l.virtual_stages)) return "layers do not divide into pp x virtual stages";
  if (s.batch % (l.dp * l.microbatch)) return "the batch does not divide into dp x microbatch";
  if (l.virtual_stages > 1 && (l.pp == 1 || l.microbatches(s) % l.pp)) return "interleaving needs pp > 1 and microbatches divisible by pp";
  if (l.virtual_stages > 1 && l.schedule != "1f1b") return "interleaving is a 1F1B schedule";
  if (l.schedule != "1f1b" && l.schedule != "gpipe" && l.schedule != "zb-h1") return "unknown schedule " + l.schedule;
  if (l.pp == 1 && l.schedule != "1f1b") return "one stage has no schedule to choose";
  if (l.ep < 1 || l.dp % l.ep) return "ep does not divide dp";
  if (l.ep > 1 && (s.moe_layers == 0 || s.experts % l.ep)) return "ep needs experts divisible by it";
  if (s.moe_layers > 0 && s.expert_ffn % l.tp) return "the experts' ffn does not divide by tp";
  if (s.heads % s.kv_heads_or_heads() || s.kv_heads_or_heads() % l.tp) return "kv heads do not divide by tp";
  return "";
}

Prediction predict(const Cluster& c, const Shape& s, const Layout& l) {
  Prediction p;
  const double t = l.tp, b = static_cast<double>(l.microbatch), seq = static_cast<double>(s.seq);
  const double h = static_cast<double>(s.hidden), f = static_cast<double>(s.ffn_size()),
               a = static_cast<double>(s.heads), V = static_cast<double>(s.vocab),
               kv = h * static_cast<double>(s.kv_heads_or_heads()) / a;
  const double E = static_cast<double>(s.experts), k = static_cast<double>(s.top_k),
               ef = static_cast<double>(s.expert_ffn), sf = static_cast<double>(s.shared_experts) * ef,
               ep = l.ep, local_experts = s.experts > 0 ? E / ep : 0;
  const double peak = c.peak(s.dtype), bytes = s.dtype == "fp32" ? 4 : 2;
  // Each rank's tokens of a microbatch: its share of every sequence under cp.
  const double cp = l.cp, bs = b * seq / cp;
  const Links link = links_of(c, l);
  // One layer's forward on one rank, one microbatch: GEMMs, elementwise
  // passes, operators.
  auto gemm = [&](double m, double kk, double n, double batch = 1) {
    return 2 * m * kk * n * batch / (peak * c.efficiency(std::min({m, kk, n})));
  };
  const double mlp_gemms = s.gated_mlp ? 3 : 2;
  const double attention_gemm =
      gemm(bs, h, (h + 2 * kv) / t) + gemm(bs, h / t, h) + 2 * cp * gemm(seq / cp, h / a, seq / cp, b * a / t);
  const double attention_bytes = bytes * (kReplicatedPasses * bs * h + kQkvPasses * bs * (h + 2 * kv) / t +
                                          kSoftmaxPasses * b * (a / t) * seq * seq / cp);
  const double dense_gemm = mlp_gemms * gemm(bs, h, f / t);
  const double dense_bytes =
      bytes * (s.gated_mlp ? kGatedActivationPasses : kActivationPasses) * bs * f / t;
  // A MoE layer: the router (replicated over tp), this rank's experts on the
  // rows routed to them (each of its E/ep experts gets ep b s k / E rows),
  // the shared experts on every token.
  const double rows_per_expert = s.experts > 0 ? ep * bs * k / E : 0;
  const double moe_gemm = gemm(bs, h, E) + local_experts * 3 * gemm(rows_per_expert, h, ef / t) +
                          (sf > 0 ? 3 * gemm(bs, h, sf / t) : 0);
  const double moe_bytes = bytes * (kRouterPasses * bs * E + kRoutedPasses * bs * k * h +
                                    kGatedActivationPasses * (bs * k + (sf > 0 ? bs : 0)) * ef / t);
  const double moe_ops = kRouterOps + kExpertOps * local_experts;
  const auto forward_of = [&](double gemms, double elementwise_bytes, double ops) {
    return gemms + elementwise_bytes / c.elementwise_bandwidth + ops * c.op_overhead;
  };
  const double dense_forward = forward_of(attention_gemm + dense_gemm, attention_bytes + dense_bytes,
                                          kAttentionOps + kMlpOps);
  const double moe_forward = forward_of(attention_gemm + moe_gemm, attention_bytes + moe_bytes,
                                        kAttentionOps + moe_ops);
  const double passes = 3 + (l.recompute ? 1 : 0);  // forward, backward (2x), recomputed forward
  const double tp_allreduce = ring_allreduce(*link.tp, bytes * bs * h, l.tp);
  // The rows' dispatch and combine, each way (forward 2, backward 2,
  // recomputation 2), and each forward's exchange of the rows per expert
  // first. A forward's dispatch travels while the shared experts compute
  // (smp_nn's dispatch_combine), so only what they do not cover counts.
  const double rows_exchange = alltoall(*link.ep, bytes * bs * k * h, l.ep);
  const double shared_forward = sf > 0 ? 3 * gemm(bs, h, sf / t) : 0;
  const double ep_per_moe_layer = 2 * (passes - 1) * rows_exchange + (passes - 2) * alltoall(*link.ep, 8 * E, l.ep) -
                                  (passes - 2) * std::min(rows_exchange, shared_forward);
  // The layers of the slowest stage: the last, which also holds the head; a
  // model's MoE layers are its last moe_layers (the moe adapter's dense_layers
  // come first), so the last stage holds as many of them as fit.
  const double layers_per_stage = static_cast<double>(s.layers) / l.pp;
  const double moe_per_stage = std::min<double>(layers_per_stage, static_cast<double>(s.moe_layers));
  const double dense_per_stage = layers_per_stage - moe_per_stage;
  const double layer_comm = (2 * passes - 2) * tp_allreduce;
  // The ring under cp: each forward, cp - 1 hops of a K and a V block, each
  // hidden by the block it travels beside; each backward, cp - 1 hops with
  // dK and dV too (twice the bytes, beside twice the compute) and one more
  // home. Per layer and microbatch.
  const double block = 2 * gemm(seq / cp, h / a, seq / cp, b * a / t);
  const double ring_hop = l.cp > 1 ? bytes * bs * 2 * kv / t / link.cp->bandwidth + link.cp->latency : 0;
  const double ring_layer = l.cp > 1 ? (passes - 2) * (cp - 1) * std::max(0.0, ring_hop - block) +
                                           (cp - 1) * std::max(0.0, 2 * ring_hop - 2 * block) + 2 * ring_hop
                                     : 0;
  // The head on the last stage: logits GEMM forward and backward, the loss's passes in fp32.
  const double head = 3 * gemm(bs, h, V / t) + 3 * 4 * 4 * bs * V / t / c.elementwise_bandwidth +
                      3 * kHeadOps * c.op_overhead;
  const double stage = passes * (dense_per_stage * dense_forward + moe_per_stage * moe_forward) +
                       layers_per_stage * (layer_comm + ring_layer) + moe_per_stage * ep_per_moe_layer + head;
  // Between stages: activations forward and gradients back per microbatch and
  // chunk, each tp rank sending its 1/t (Megatron's scatter-gather).
  const double m = static_cast<double>(l.microbatches(s)), v = l.virtual_stages;
  const double hop = l.pp > 1 ? 2 * v * (bytes * bs * h / t / link.pp->bandwidth + link.pp->latency) : 0;
  const double per_microbatch = stage + hop;
  p.tp_comm = m * layers_per_stage * layer_comm;
  p.ep_comm = m * moe_per_stage * ep_per_moe_layer;
  p.cp_comm = m * layers_per_stage * ring_layer;
  p.compute = m * stage - p.tp_comm - p.ep_comm - p.cp_comm;  // kept apart: stage above holds them all
  p.pp_comm = m * hop;
  // Zero bubble H1: the weight gradients fill a third of 1F1B's bubble as
  // smp's executor runs it (its pp 2 runs, bench/results/plan-local.json).
  // Qi et al.'s ideal, (p - 1)(F + B - 2W) with W half of B = 2F, would fill
  // two thirds.
  p.bubble = (l.pp - 1) / v * per_microbatch * (l.schedule == "zb-h1" ? 2.0 / 3.0 : 1.0);
  // Parameters per rank (the first stage, with the embedding; the tied head's
  // copy on the last): dense, and the experts (reduced over dp / ep only).
  const double attention_params = 2 * h * h + 2 * h * kv + 5 * h;
  const double dense_layer_params = attention_params + mlp_gemms * h * f + 4 * h + f;
  const double moe_layer_params_dense = attention_params + 4 * h + E * h + 3 * h * sf;
  const double expert_params = moe_per_stage * 3 * local_experts * h * ef / t;
  const double dense_params = (dense_per_stage * dense_layer_params + moe_per_stage * moe_layer_params_dense) / t +
                              V * h / t + (l.pp == 1 ? seq * h : 0);
  const double stage_params = dense_params + expert_params;
  const double dp = l.dp, edp = l.dp / l.ep;
  // The gradients: an all-reduce, or under ZeRO a reduce-scatter (half its
  // bytes), both during the backward; ZeRO 1 and 2 then all-gather the updated
  // parameters after the optimizer, where nothing hides them.
  const double all_reduce = ring_allreduce(*link.dp, bytes * dense_params, l.dp) +
                            ring_allreduce(*link.dp, bytes * expert_params, l.dp / l.ep);
  const double reduce = l.zero >= 1 ? all_reduce / 2 : all_reduce;
  const double hidden_by_backward =
      l.overlap_dp ? 2 * (dense_per_stage * dense_forward + moe_per_stage * moe_forward) : 0;
  p.dp_comm = std::max(0.0, reduce - hidden_by_backward) + (l.zero == 1 || l.zero == 2 ? all_reduce / 2 : 0);
  if (l.zero == 3)  // parameters gathered again for every forward and backward
    p.dp_comm += m * (passes - 1) *
                 (ring_allreduce(*link.dp, bytes * dense_params, l.dp) +
                  ring_allreduce(*link.dp, bytes * expert_params, l.dp / l.ep)) / 2;
  // Every replicated gradient summed over cp after the dp reduction (a ZeRO
  // rank's shard of it), not hidden.
  p.cp_comm += ring_allreduce(*link.cp, bytes * (l.zero >= 1 ? dense_params / dp + expert_params / edp : stage_params),
                              l.cp);
  const double tensors = layers_per_stage * kTensorsPerLayer + 2;
  p.optimizer = kOptimizerStepBytes * (dense_params / (l.zero >= 1 ? dp : 1) + expert_params / (l.zero >= 1 ? edp : 1)) /
                    c.elementwise_bandwidth +
                kOpsPerParameterTensor * tensors * c.op_overhead;
  p.step_seconds = p.compute + p.tp_comm + p.pp_comm + p.ep_comm + p.cp_comm + p.bubble + p.dp_comm + p.optimizer;
  // Memory: weights, gradients, optimizer state (each sharded by its ZeRO stage) and activations.
  const double sharded = dense_params / dp + expert_params / edp;
  const double weights = bytes * (l.zero >= 3 ? sharded : stage_params);
  const double grads = bytes * (l.zero >= 2 ? sharded : stage_params);
  const double state = kOptimizerStateBytes * (l.zero >= 1 ? sharded : stage_params);
  // Korthikanti et al. (fp16, no sequence parallelism): what a layer keeps for its backward.
  // Under cp a rank keeps its tokens' share, its attention blocks [seq/cp, seq/cp].
  const double full_layer = bs * h * (10 + 24 / t + 5 * a * seq / cp / (h * t)) +
                            (s.experts > 0 ? bytes * bs * (k * (5 * h + 4 * ef / t) + 2 * E) : 0);
  // Recomputed, a layer keeps the input of each node kind checkpointed.
  const double kept_layer =
      l.recompute ? bytes * bs * h * static_cast<double>(std::max<size_t>(1, s.recompute_kinds.size())) : full_layer;
  const double in_flight =
      l.schedule == "gpipe" ? m : std::min<double>(m, l.pp * (1 + (l.pp - 1) / (l.pp * v)));
  // The ring's buffers in one layer's backward: the K/V block held and the
  // one arriving, and the dK/dV accumulators travelling.
  const double ring_buffers = l.cp > 1 ? 4 * bytes * bs * 2 * kv / t : 0;
  const double activations = in_flight * layers_per_stage * kept_layer + (l.recompute ? full_layer : 0) +
                             2 * 4 * bs * V / t + ring_buffers;  // the logits and their gradient in fp32, one microbatch
  p.memory_bytes = weights + grads + state + activations;
  p.fits = p.memory_bytes <= c.memory_bytes;
  // FLOPs as the paper counts them (f = 4h, no GQA, no experts: its equation 3).
  const double B = static_cast<double>(s.batch), L = static_cast<double>(s.layers),
               Lm = static_cast<double>(s.moe_layers);
  const double attention_fwd = B * seq * (4 * h * (h + kv) + 4 * seq * h);
  const double dense_fwd = attention_fwd + 2 * B * seq * mlp_gemms * h * f;
  const double moe_fwd = attention_fwd + 2 * B * seq * (h * E + 3 * h * ef * k + 3 * h * sf);
  const double layers_fwd = (L - Lm) * dense_fwd + Lm * moe_fwd, head_fwd = 2 * B * seq * h * V;
  p.model_flops = 3 * layers_fwd + 3 * head_fwd;
  p.flops = p.model_flops + (l.recompute ? layers_fwd : 0);
  const double world = l.tp * l.pp * l.dp * l.cp;
  p.tflops_per_device = p.flops / p.step_seconds / world / 1e12;
  p.mfu = p.model_flops / p.step_seconds / world / peak;
  p.tokens_per_s = B * seq / p.step_seconds;
  return p;
}

}  // namespace smp::plan
