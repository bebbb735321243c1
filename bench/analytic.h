// Analytic counts the benchmarks compare against: parameters, Megatron's model
// FLOPs, and the bytes one rank sends per training step on each communicator axis,
// counted the way core/src/comm/communicator.cpp counts (bytes THIS rank sends; a ring
// all-reduce of B bytes over n ranks sends 2(n-1)/n * B; all-gather (n-1) * B_in;
// reduce-scatter B_in - B_out; send B). Derivations are in bench/README.md.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>

namespace bench {

struct Shape {
  int64_t layers = 4, hidden = 256, heads = 4, seq = 128, vocab = 256, ffn = 1024;
};

int64_t param_count(const Shape& m);
// 72 B s l h^2 (1 + s/(6h) + V/(12 l h)): forward + backward, no recomputation.
double megatron_flops(const Shape& m, int64_t batch);
double ring_allreduce(double bytes, int n);

// dp: every gradient all-reduced once per step (buckets change nothing in the total),
// plus the 8-byte loss all-reduce on the dp axis.
nlohmann::json dp_bytes_per_step(const Shape& m, int dp);

// pp, rank 0, with p ranks, v chunks per rank, m microbatches of b samples each:
// per microbatch and virtual stage of rank 0 that is not the last: a 2048-byte
// header (256 int64) + the activation b*s*h*4; per virtual stage of rank 0 that is
// not the first: the activation gradient b*s*h*4 (no header). Plus the tied
// embedding gradient (V*h*4, all-reduced between the first and last stage) and the
// 16-byte grad-norm/loss all-reduce on the mp axis.
nlohmann::json pp_bytes_per_step_rank0(const Shape& m, int64_t micro_batch, int microbatches, int p, int v);

// tp (any rank; dp = pp = 1), t ranks, batch b, A = b*s*h*4:
//   without SP: all-reduce of A: embedding output (fwd), per layer 2 fwd (attention
//   and MLP outputs) + 2 bwd (their input copies), LM head input copy (bwd) = 4L+2;
//   vocab-parallel CE: MAX all-reduce of N floats + SUM all-reduce of 2N floats, N = b*s.
//   with SP: each all-reduce becomes a reduce-scatter + all-gather pair (fwd/bwd),
//   the same bytes; plus all-reduces of the gradients of the parameters replicated
//   across tp whose gradients differ per rank (position embedding s*h, per layer
//   ln1/ln2 weight+bias and the two row-parallel biases 6h, final LN 2h).
//   mp axis: the 16-byte grad-norm/loss all-reduce.
nlohmann::json tp_bytes_per_step(const Shape& m, int64_t batch, int t, bool sp);

}  // namespace bench
