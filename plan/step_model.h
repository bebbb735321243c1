// The planner's step-time and memory model of a decoder (GPT-2 and Llama
// shapes: grouped-query attention, SwiGLU; mixtures of experts) trained on a
// cluster under one layout, every term kept apart:
//   compute      each GEMM's FLOPs over the peak times the efficiency its
//                smallest dimension gets on the cluster (a MoE layer: the
//                router, and each of the rank's E/ep experts on the rows
//                routed to it); the elementwise work (norms, activations,
//                residuals, dropout, the softmax over [heads, s, s], the
//                routed rows) as bytes over the elementwise rate; each
//                operator's host time; forward, backward (twice the forward)
//                and, under full recomputation, the forward again;
//   tp           Megatron's all-reduces of [b, s, h] per layer (2 forward, 2
//                backward, 2 more when recomputing) as α-β rings on the link
//                tp uses, not overlapped;
//   pp           the activations (and their gradients) between stages per
//                microbatch and virtual stage, on the link pp uses, not
//                overlapped; the bubble of 1F1B, (p - 1) / (v m) of the steady
//                part (interleaved: v virtual stages per rank; zb-h1: the
//                weight gradients fill a third of it);
//   cp           each rank computes seq / cp tokens of every sample (the
//                attention as cp blocks of [seq/cp, seq/cp]); per layer and
//                pass the ring's K/V hops (backward: with dK/dV, and one hop
//                home) where the block computation does not hide them; the
//                gradients summed over cp after the dp reduction;
//   ep           per MoE layer and microbatch, the rows' dispatch and combine
//                each way and the counts' exchange, on the all-to-all link;
//                a forward's dispatch overlaps the shared experts' GEMMs;
//   dp           the gradient all-reduce (a reduce-scatter under ZeRO; the
//                experts' over dp / ep ranks) on the link dp uses, the part
//                that the last microbatch's backward does not hide
//                (overlap_dp); under ZeRO 1-2 the parameters' all-gather after
//                the optimizer, and under ZeRO-3 the parameters gathered for
//                each pass, not hidden;
//   optimizer    AdamW over this rank's parameters, as bytes over the
//                elementwise rate, and its operators per parameter tensor.
// FLOPs counted as the paper counts them (Narayanan et al. 2021, equation 3:
// 96 B s l h^2 (1 + s/6h + V/16lh) with recomputation, 72 B s l h^2 (1 + s/6h
// + V/12lh) without) give the TFLOP/s per accelerator.
#pragma once

#include "plan/cluster.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace smp::plan {

struct Shape {
  int64_t layers = 0, hidden = 0, heads = 0, seq = 0, vocab = 0, ffn = 0;  // ffn 0: 4 x hidden
  int64_t kv_heads = 0;          // grouped-query attention's K/V heads (0: heads)
  bool gated_mlp = false;        // SwiGLU: three ffn-wide GEMMs instead of two
  // The last moe_layers layers' MLP is a mixture of experts: each token goes to
  // top_k of `experts` MLPs of expert_ffn (SwiGLU), and to shared_experts more.
  int64_t moe_layers = 0, experts = 0, top_k = 0, expert_ffn = 0, shared_experts = 0;
  int64_t batch = 0;             // global batch, samples
  std::string dtype = "fp16";    // compute dtype
  // The graph's node kinds that full recomputation checkpoints (memory.checkpoint):
  // the gpt adapter's whole layers, or the moe adapter's attention and moe nodes.
  std::vector<std::string> recompute_kinds = {"transformer_layer"};
  int64_t ffn_size() const { return ffn > 0 ? ffn : 4 * hidden; }
  int64_t kv_heads_or_heads() const { return kv_heads > 0 ? kv_heads : heads; }
};

struct Layout {
  int tp = 1, pp = 1, dp = 1;
  int cp = 1;                    // context parallelism: each sample's sequence over cp ranks (ring attention)
  int ep = 1;                    // experts split over ep ranks of dp (smp's parallel.ep)
  int virtual_stages = 1;        // interleaved 1F1B when > 1
  // With one virtual stage: "1f1b", "gpipe" (the same bubble, every
  // microbatch's activations kept) or "zb-h1" (the backward split into its
  // input and weight parts, the weight parts filling a third of 1F1B's bubble
  // as smp runs it; Qi et al. 2023's ideal fills two thirds).
  std::string schedule = "1f1b";
  int64_t microbatch = 1;        // samples per microbatch
  int zero = 0;                  // 0-3
  bool recompute = true;         // full activation recomputation
  // The gradient reduction overlaps the last microbatch's backward (smp's
  // buckets, train.bucket_mb); false: it follows the backward (Megatron-LM
  // in 2021, whose published runs are checked with false).
  bool overlap_dp = true;
  int64_t microbatches(const Shape& s) const { return s.batch / (dp * microbatch); }
  std::string describe() const;  // "tp 8 pp 2 dp 32 v 2 mb 1 zero 1 recompute" ("cp 2" after dp when > 1)
  // The --set lines that run it with smp.
  std::vector<std::string> sets(const Shape& s) const;
};

struct Prediction {
  bool fits = false;
  double memory_bytes = 0;       // the most any rank holds
  double step_seconds = 0;
  // The terms, in seconds (their sum is the step): compute, tp, pp, ep (the
  // experts' all-to-alls), cp (the ring's exposed hops and the gradients'
  // sum over cp), bubble, dp, optimizer.
  double compute = 0, tp_comm = 0, pp_comm = 0, ep_comm = 0, cp_comm = 0, bubble = 0, dp_comm = 0, optimizer = 0;
  double flops = 0;              // per step, the paper's count for this layout's recomputation
  double model_flops = 0;        // per step without recomputation (what MFU counts)
  double tflops_per_device = 0, mfu = 0, tokens_per_s = 0;
  nlohmann::json to_json() const;
};

// Why a layout cannot run this shape on this world, or "" when it can.
std::string invalid(const Shape& s, const Layout& l, int world);
Prediction predict(const Cluster& c, const Shape& s, const Layout& l);

}  // namespace smp::plan
