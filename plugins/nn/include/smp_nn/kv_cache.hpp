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
    int64_t len = 0;
    for (int64_t i = 0; i < b; ++i) {
      k_[i].narrow(0, d.start[static_cast<size_t>(i)], s).copy_(k[i]);
      v_[i].narrow(0, d.start[static_cast<size_t>(i)], s).copy_(v[i]);
      len = std::max(len, d.start[static_cast<size_t>(i)] + s);
    }
    const Tensor keys = kv_for_heads(k_.narrow(1, 0, len), kv_local, kv_offset, first_q, heads_local, group, head_dim);
    const Tensor values = kv_for_heads(v_.narrow(1, 0, len), kv_local, kv_offset, first_q, heads_local, group, head_dim);
    auto heads = [&](const Tensor& t, int64_t n) { return t.reshape({b, n, heads_local, head_dim}).transpose(1, 2); };
    const Tensor scores = at::matmul(heads(q, s), heads(keys, len).transpose(2, 3))
                              .to(at::kFloat)
                              .mul(1.0 / std::sqrt(static_cast<double>(head_dim)));  // [b, n, s, len]
    // Key position j is hidden from query position p when j > p (and so every
    // kept position past this call's, stale from an earlier batch, is too).
    const Tensor query_pos = decode_positions(d, s, q.device()).view({b, 1, s, 1});
    const Tensor key_pos = at::arange(len, at::TensorOptions().dtype(at::kLong).device(q.device())).view({1, 1, 1, len});
    const Tensor probs = at::softmax(scores.masked_fill(key_pos > query_pos, -1e9), -1).to(q.scalar_type());
    return at::matmul(probs, heads(values, len)).transpose(1, 2).reshape({b, s, heads_local * head_dim});
  }
  void clear() { k_ = v_ = Tensor(); }

 private:
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
