// Context parallelism's all-to-all form (DeepSpeed-Ulysses, Jacobs et al.
// 2023): each of the cp ranks holds its load-balanced share of the sequence
// for every head (block_attention.hpp); one all-to-all gives each rank the
// whole sequence for heads / cp of the heads, attention runs on them, and a
// second all-to-all gives back every head for the rank's share. Two
// all-to-alls of the activations per call, each way; the heads (and the kv
// heads under grouped-query attention) must divide by cp.
#pragma once

#include <smp_nn/block_attention.hpp>
#include <smp_nn/key_padding.hpp>

#include <smp/sdk/collectives.hpp>

#include <string>
#include <vector>

namespace smp_nn {

namespace detail {

// [b, h, s, d] -> rank j gets heads [j h/cp, (j+1) h/cp) of every rank's
// share: [b, h/cp, cp s, d], the sources in rank order along the sequence.
inline Tensor heads_to_sequence(const Tensor& x, const smp::sdk::Comm& comm) {
  const int64_t cp = comm.size(), b = x.size(0), h = x.size(1), s = x.size(2), d = x.size(3);
  const Tensor parts = x.reshape({b, cp, h / cp, s, d}).permute({1, 0, 2, 3, 4}).contiguous();
  const std::vector<int64_t> ones(static_cast<size_t>(cp), 1);
  const Tensor got = smp::sdk::all_to_all(parts, comm, ones, ones);  // [cp (source), b, h/cp, s, d]
  return got.permute({1, 2, 0, 3, 4}).reshape({b, h / cp, cp * s, d});
}

// The inverse: [b, h/cp, cp s, d] -> [b, h, s, d].
inline Tensor sequence_to_heads(const Tensor& y, const smp::sdk::Comm& comm) {
  const int64_t cp = comm.size(), b = y.size(0), hl = y.size(1), s = y.size(2) / cp, d = y.size(3);
  const Tensor parts = y.reshape({b, hl, cp, s, d}).permute({2, 0, 1, 3, 4}).contiguous();
  const std::vector<int64_t> ones(static_cast<size_t>(cp), 1);
  const Tensor got = smp::sdk::all_to_all(parts, comm, ones, ones);  // [cp (head group), b, h/cp, s, d]
  return got.permute({1, 0, 2, 3, 4}).reshape({b, cp * hl, s, d});
}

}  // namespace detail

// Attention of this rank's share of the sequence (q [b, heads, seq / cp, d];
// k, v [b, kv_heads, seq / cp, d]) over the whole sequence, which the cp ranks
// of `comm` hold in load-balanced shares. Grouped-query attention: each kv
// head serves heads / kv_heads query heads. pad_mask (optional): this rank's
// share of the keys' padding mask [b, seq / cp] (nonzero = a real token); every
// rank passes one or none. Differentiable. `key` names the setting in messages.
inline Tensor ulysses_attention(const Tensor& q, const Tensor& k, const Tensor& v, int64_t seq,
                                const smp::sdk::Comm& comm, bool causal, double scale, const std::string& key,
                                const Tensor& pad_mask = {}) {
  const int64_t cp = comm.size(), heads = q.size(1), kv_heads = k.size(1);
  if (heads % cp != 0 || kv_heads % cp != 0)
    throw smp::sdk::Error(key + ": the all-to-all form splits the heads over cp = " + std::to_string(cp) +
                          ", which does not divide " + std::to_string(heads) + " heads and " +
                          std::to_string(kv_heads) + " kv heads (use the ring form, or a cp that divides both)");
  std::vector<Tensor> shares;
  for (int64_t r = 0; r < cp; ++r) shares.push_back(context_parallel_positions(seq, cp, r, key));
  const Tensor pos = at::cat(shares);  // the positions along the gathered sequence
  const Tensor qs = detail::heads_to_sequence(q, comm);
  Tensor ks = detail::heads_to_sequence(k, comm), vs = detail::heads_to_sequence(v, comm);
  if (heads != kv_heads) {  // this rank's query heads are group-major over its kv heads
    ks = ks.repeat_interleave(heads / kv_heads, 1);
    vs = vs.repeat_interleave(heads / kv_heads, 1);
  }
  // The gathered sequence's padding keys, in the same order (the shares in rank order).
  Tensor key_pad = gather_key_padding(pad_mask, q, comm, key);
  if (key_pad.defined()) key_pad = key_pad.permute({1, 0, 2}).reshape({q.size(0), -1});
  const BlockAttention a = block_attention(qs, ks, vs, pos, pos, causal, scale, key_pad);
  return detail::sequence_to_heads(a.out, comm);
}

}  // namespace smp_nn
