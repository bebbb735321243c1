// What attention keeps of earlier positions while a model generates (ABI 2.7's
// decoding calls, smp::sdk::Decode): each sample's K and V at their positions,
// so that a new token costs one position instead of the whole sequence. Used by
// smp_nn's attention kinds and smp_tp's parallel ones (this rank's kv heads).
#pragma once

#include <smp_nn/ops.hpp>

#include <smp/sdk/module.hpp>

#include <algorithm>
#include <string>

namespace smp_nn {

// [b, s] int64: position start[i] + j of sample i's j-th input.
inline Tensor decode_positions(const smp::sdk::Decode& d, int64_t s, const c10::Device& device) {
  const auto opts = at::TensorOptions().dtype(at::kLong);
  const Tensor start = at::tensor(d.start, opts).view({-1, 1});
  return (start + at::arange(s, opts).view({1, s})).to(device);
}

// A decoding call's rows of a learned position table [max_len, dim] for x
// [b, s, dim]: each sample's own positions.
inline Tensor position_rows(const Tensor& table, const smp::sdk::Decode& d, const Tensor& x, const std::string& node) {
  const Tensor pos = decode_positions(d, x.size(1), x.device());
  const int64_t last = pos.max().item<int64_t>();
  if (last >= table.size(0))
    throw smp::sdk::Error("node '" + node + "': position " + std::to_string(last) + " is past max_len " +
                          std::to_string(table.size(0)));
  return at::embedding(table, pos);
}

class KvCache {
 public:
  // Attention of this call's queries q [b, s, heads_local * head_dim] over the
  // cached positions and this call's, after k and v [b, s, kv_local * head_dim]
  // (this rank's kv heads, [kv_offset, kv_offset + kv_local)) are kept at their
  // positions. Query head j (of [first_q, first_q + heads_local)) uses kv head
  // j / group. Causal: position p sees positions 0..p. Softmax in fp32.
  Tensor attend(const smp::sdk::Decode& d, const Tensor& q, const Tensor& k, const Tensor& v, int64_t heads_local,
                int64_t kv_local, int64_t kv_offset, int64_t first_q, int64_t group, int64_t head_dim,
                const std::string& node) {
    const int64_t b = q.size(0), s = q.size(1);
    if (static_cast<int64_t>(d.start.size()) != b)
      throw smp::sdk::Error("node '" + node + "': a decoding call of " + std::to_string(b) + " samples with " +
                            std::to_string(d.start.size()) + " start positions");
    if (!k_.defined() || k_.size(0) != b || k_.size(1) != d.capacity || k_.scalar_type() != k.scalar_type()) {
      for (int64_t st : d.start)
        if (st != 0)
          throw smp::sdk::Error("node '" + node + "': a decoding call at position " + std::to_string(st) +
                                " with no cache for this batch (a new batch starts at position 0)");
      k_ = at::zeros({b, d.capacity, k.size(2)}, k.options());
      v_ = at::zeros({b, d.capacity, v.size(2)}, v.options());
    }
    // This call's positions into the cache: one copy when the samples are
    // level (the usual case: same-length prompts), else one scatter.
    const Tensor positions = decode_positions(d, s, q.device());  // [b, s]
    const int64_t first = d.start.front();
    const bool level = std::all_of(d.start.begin(), d.start.end(), [&](int64_t st) { return st == first; });
    if (level) {
      k_.narrow(1, first, s).copy_(k);
      v_.narrow(1, first, s).copy_(v);
    } else {
      const Tensor rows = at::arange(b, positions.options()).repeat_interleave(s);
      k_.index_put_({rows, positions.reshape({-1})}, k.reshape({b * s, -1}));
      v_.index_put_({rows, positions.reshape({-1})}, v.reshape({b * s, -1}));
    }
    const int64_t len = positions.max().item<int64_t>() + 1;
    // Grouped-query attention without copying the cache per query head: the
    // g query heads that share a kv head attend to it together, as one
    // [g * s, d] x [d, len] product per (sample, kv head).
    const int64_t g = std::min(group, heads_local);
    if (heads_local % g != 0 || first_q % g != 0) {  // an uneven split of heads: the general path
      const Tensor keys = kv_for_heads(k_.narrow(1, 0, len), kv_local, kv_offset, first_q, heads_local, group, head_dim);
      const Tensor values =
          kv_for_heads(v_.narrow(1, 0, len), kv_local, kv_offset, first_q, heads_local, group, head_dim);
      return attend_grouped(q, keys, values, positions, heads_local, 1, 0, head_dim, len);
    }
    return attend_grouped(q, k_.narrow(1, 0, len), v_.narrow(1, 0, len), positions, heads_local / g,
                          g, first_q / group - kv_offset, head_dim, len);
  }
  void clear() { k_ = v_ = Tensor(); }

 private:
  // Attention of q [b, s, u * g * d] over kv heads [kv_first, kv_first + u) of
  // keys and values [b, len, * x d]: query head j uses kv head kv_first + j / g.
  static Tensor attend_grouped(const Tensor& q, const Tensor& keys, const Tensor& values, const Tensor& positions,
                               int64_t u, int64_t g, int64_t kv_first, int64_t head_dim, int64_t len) {
    const int64_t b = q.size(0), s = q.size(1);
    const int64_t kv_total = keys.size(2) / head_dim;
    auto kv = [&](const Tensor& t) {  // [b, u, len, d], a view of the cache
      return t.view({b, len, kv_total, head_dim}).narrow(2, kv_first, u).permute({0, 2, 1, 3});
    };
    const Tensor qg = q.reshape({b, s, u, g, head_dim}).permute({0, 2, 3, 1, 4}).reshape({b, u, g * s, head_dim});
    const Tensor scores = at::matmul(qg, kv(keys).transpose(2, 3))
                              .to(at::kFloat)
                              .mul(1.0 / std::sqrt(static_cast<double>(head_dim)))
                              .view({b, u, g, s, len});
    // Key position j is hidden from query position p when j > p (and so every
    // kept position past this call's, stale from an earlier batch, is too).
    const Tensor key_pos = at::arange(len, positions.options()).view({1, 1, 1, 1, len});
    const Tensor hidden = key_pos > positions.view({b, 1, 1, s, 1});
    const Tensor probs = at::softmax(scores.masked_fill(hidden, -1e9), -1).to(q.scalar_type());
    return at::matmul(probs.view({b, u, g * s, len}), kv(values))
        .view({b, u, g, s, head_dim})
        .permute({0, 3, 1, 2, 4})
        .reshape({b, s, u * g * head_dim});
  }

  Tensor k_, v_;  // [b, capacity, kv_local * head_dim]
};

// A decoding call's refusals common to every attention kind.
inline void check_decodable(const AttentionConfig& c, const Tensor& pad_mask, const std::string& node) {
  if (!c.causal)
    throw smp::sdk::Error("node '" + node + "': decoding feeds new positions after the old ones, which needs "
                          "causal attention (causal = false here)");
  if (pad_mask.defined())
    throw smp::sdk::Error("node '" + node + "': a decoding call takes no padding mask (each sample's positions say "
                          "what it attends to)");
}

}  // namespace smp_nn
