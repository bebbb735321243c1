// Attention computed a block of keys at a time and merged by log-sum-exp: the
// arithmetic of context parallelism's ring attention (Liu et al. 2023, Ring
// Attention; Megatron-LM's context parallelism), where each rank holds a part
// of the sequence and the key/value blocks travel round the ring. Every block
// carries its tokens' global positions, so that a causal mask follows the
// positions and not the block's order.
//
// Load balancing (Megatron's and torch.distributed's context_parallel "head
// tail"): the sequence is cut into 2 cp equal chunks and rank r holds chunks
// r and 2 cp - 1 - r, so that every rank's share of a causal mask's work is
// the same.
//
// Pure LibTorch (differentiable with autograd); the communication is not here.
#pragma once

#include <smp/sdk/module.hpp>
#include <smp/sdk/sequence.hpp>

#include <ATen/ATen.h>

#include <limits>
#include <string>

namespace smp_nn {

using at::Tensor;

// The attention of queries over one block of keys: out [b, h, sq, d] (the
// softmax-weighted values over the keys this block lets each query see), and
// lse [b, h, sq] (fp32, or fp64 for fp64 inputs; the log of the softmax's denominator over those keys,
// -inf where the block lets a query see none, whose out is then 0).
struct BlockAttention {
  Tensor out, lse;
};

// scale q k^T [b, h, sq, sk], in fp32 at least (double stays double); q_pos
// [sq], k_pos [sk] the tokens' global positions (int64). causal: query i sees
// key j iff k_pos[j] <= q_pos[i], the others' scores are -inf. key_pad
// (optional, [b, sk] bool, true = a padding key): those scores are -1e9, the
// large finite negative of whole-sequence attention (ops.hpp's
// attention_core), so that a query whose keys are all padding attends as it
// does there, and a block whose keys are all padding weighs nothing in a
// merge with one that has a real key (exp(-1e9 - lse) is 0).
inline Tensor masked_scores(const Tensor& q, const Tensor& k, const Tensor& q_pos, const Tensor& k_pos, bool causal,
                            double scale, const Tensor& key_pad = {}) {
  Tensor scores = at::matmul(q, k.transpose(-2, -1)).to(at::promote_types(q.scalar_type(), at::kFloat)).mul(scale);
  if (key_pad.defined()) scores = scores.masked_fill(key_pad.view({key_pad.size(0), 1, 1, key_pad.size(1)}), -1e9);
  if (causal)  // after the padding: a key the mask hides stays -inf
    scores = scores.masked_fill(k_pos.view({1, -1}).gt(q_pos.view({-1, 1})), -std::numeric_limits<float>::infinity());
  return scores;
}

// q [b, h, sq, d]; k, v [b, h, sk, d]; positions and masks as masked_scores.
inline BlockAttention block_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& q_pos,
                                      const Tensor& k_pos, bool causal, double scale, const Tensor& key_pad = {}) {
  const Tensor scores = masked_scores(q, k, q_pos, k_pos, causal, scale, key_pad);
  // A query that sees no key of the block gets lse -inf and out 0. Its row of
  // -inf scores is replaced by zeros before the log-sum-exp, whose gradient
  // would otherwise be exp(-inf - -inf) = NaN (times a zero from upstream,
  // still NaN).
  const Tensor blind = causal ? at::isinf(scores).all(-1, true) : at::zeros({1}, at::kBool);
  const Tensor lse = at::where(blind.squeeze(-1), -std::numeric_limits<float>::infinity(),
                               at::logsumexp(at::where(blind, 0.0f, scores), -1));  // [b, h, sq]
  const Tensor safe = at::where(blind.squeeze(-1), 0.0f, lse);
  const Tensor p = at::exp(scores - safe.unsqueeze(-1));  // 0 where hidden
  return {at::matmul(p.to(v.scalar_type()), v), lse};
}

// a and b: the same queries over disjoint sets of keys; the result is theirs
// over the union (a query that sees no key in either keeps out 0, lse -inf).
inline BlockAttention merge(const BlockAttention& a, const BlockAttention& b) {
  // Where both are -inf, logaddexp's gradient would be NaN: zeros stand in.
  const Tensor blind = at::isinf(a.lse).logical_and(at::isinf(b.lse));
  const Tensor lse = at::where(blind, -std::numeric_limits<float>::infinity(),
                               at::logaddexp(at::where(blind, 0.0f, a.lse), at::where(blind, 0.0f, b.lse)));
  const Tensor safe = at::where(blind, 0.0f, lse);
  // exp(-inf - finite) = 0: a side that saw nothing weighs nothing.
  const Tensor wa = at::exp(a.lse - safe).unsqueeze(-1), wb = at::exp(b.lse - safe).unsqueeze(-1);
  return {a.out * wa.to(a.out.scalar_type()) + b.out * wb.to(b.out.scalar_type()), lse};
}

// The global positions rank `rank` of `cp` holds (sdk/sequence.hpp).
using smp::sdk::context_parallel_positions;

}  // namespace smp_nn
