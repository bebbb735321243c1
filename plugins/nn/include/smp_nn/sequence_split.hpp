// A kind's view of a sequence axis (parallel.cp): the share of every sample's
// sequence this rank holds, the global positions of its tokens, and the
// attention of its queries over the whole sequence, as a ring or an
// all-to-all over heads (parallel.cp_mode). Without a sequence axis (or one of
// size 1) it is inert and the kinds run as they always have.
#pragma once

#include <smp_nn/ring_attention.hpp>
#include <smp_nn/ulysses_attention.hpp>

#include <smp/sdk/module.hpp>
#include <smp_test_faults/fault.hpp>

#include <cmath>
#include <string>

namespace smp_nn {

struct SequenceSplit {
  smp::sdk::Comm comm;
  int rank = 0, size = 1;
  bool alltoall = false;
  std::string key = "parallel.cp", node;

  static SequenceSplit from(const smp::sdk::ModuleContext& ctx) {
    SequenceSplit s;
    s.node = ctx.node_name;
    const smp::sdk::SequenceShare share = ctx.sequence();
    if (!share.split()) return s;
    s.rank = share.index, s.size = share.size;
    s.key = "parallel." + share.axis;
    s.comm = ctx.comm(share.axis);
    const std::string mode = ctx.parallel.value(share.axis + "_mode", std::string("ring"));
    if (mode != "ring" && mode != "alltoall")
      throw smp::sdk::Error("node '" + s.node + "': " + s.key + "_mode = \"" + mode +
                            "\": expected \"ring\" or \"alltoall\"");
    s.alltoall = mode == "alltoall";
    return s;
  }
  bool split() const { return size > 1; }

  // The global positions of the `local` tokens this rank holds (int64, on `device`).
  Tensor positions(int64_t local, const at::Device& device) const {
    static const bool fault = smp_test_faults::fault("cp_position_offset");  // tests only: ranks > 0 one off
    const Tensor p = context_parallel_positions(local * size, size, rank, key);
    return (fault && rank > 0 ? p - 1 : p).to(device);
  }

  // The all-to-all form gives each rank heads / cp of the query heads and of
  // the kv heads it attends with (this rank's, under tp).
  void check_heads(int64_t heads, int64_t kv_heads) const {
    if (!split() || !alltoall) return;
    if (heads % size != 0 || kv_heads % size != 0)
      throw smp::sdk::Error("node '" + node + "': " + key + "_mode = \"alltoall\" splits the heads over " + key +
                            " = " + std::to_string(size) + ", which does not divide this rank's " +
                            std::to_string(heads) + " heads and " + std::to_string(kv_heads) +
                            " kv heads (use " + key + "_mode = \"ring\", or a cp that divides both)");
  }
  void check_call(bool decoding) const {
    if (!split()) return;
    if (decoding)
      throw smp::sdk::Error("node '" + node + "': a decoding call under " + key + " = " + std::to_string(size) +
                            " (generate with " + key + " = 1; a checkpoint loads into any layout)");
  }

  // This rank's queries over the whole sequence: q [b, s, heads * d], k and v
  // [b, s, kv_heads * d] with heads a multiple of kv_heads (query head j uses
  // kv head j / (heads / kv_heads)); returns [b, s, heads * d]. pad_mask
  // (optional): this rank's share of the keys' padding mask [b, s], nonzero =
  // a real token (an encoder's; every rank's share hides its padding keys
  // from every query, whichever rank holds them).
  Tensor attend(const Tensor& q, const Tensor& k, const Tensor& v, int64_t heads, int64_t kv_heads, int64_t head_dim,
                bool causal, const Tensor& pad_mask = {}) const {
    const int64_t b = q.size(0), s = q.size(1);
    auto split_heads = [&](const Tensor& t, int64_t n) { return t.reshape({b, s, n, head_dim}).transpose(1, 2); };
    const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
    const Tensor qh = split_heads(q, heads), kh = split_heads(k, kv_heads), vh = split_heads(v, kv_heads);
    const Tensor out = alltoall ? ulysses_attention(qh, kh, vh, s * size, comm, causal, scale,
                                                    key + "_mode = \"alltoall\"", pad_mask)
                                : ring_attention(qh.contiguous(), kh.contiguous(), vh.contiguous(), s * size, comm,
                                                 causal, scale, pad_mask);
    return out.transpose(1, 2).reshape({b, s, heads * head_dim});
  }
};

}  // namespace smp_nn
