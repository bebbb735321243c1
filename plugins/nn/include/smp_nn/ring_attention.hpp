// Ring attention over a context-parallel group: each of the cp ranks holds the
// queries, keys and values of its load-balanced share of every sequence
// (block_attention.hpp: chunks r and 2 cp - 1 - r), and the key/value blocks
// travel round the ring, rank r sending to r + 1 and receiving from r - 1.
//
// Forward: at each of cp steps the rank starts sending the block it holds and
// receiving the next, attends its queries to the block it holds meanwhile,
// and merges by log-sum-exp. Backward (the flash-attention gradient per block,
// against the merged output and log-sum-exp): the blocks travel round again,
// each with its dK/dV accumulator, which every rank adds to; after the last
// step one more hop brings each accumulator home. The input gradient dQ stays.
//
// Without a causal mask (an encoder's bidirectional attention) every block is
// attended to whole, whatever the chunks' order: the load-balanced layout is
// kept (it costs nothing there and is the one adapters cut), and a padding mask
// (key_padding.hpp, gathered once) hides each block's padding keys.
#pragma once

#include <smp_nn/block_attention.hpp>
#include <smp_nn/key_padding.hpp>

#include <smp/sdk/collectives.hpp>

#include <torch/csrc/autograd/custom_function.h>

#include <limits>
#include <vector>

namespace smp_nn {

namespace detail {

// Where each rank's block of keys sits in the sequence.
inline std::vector<Tensor> ring_positions(int64_t seq, int cp) {
  std::vector<Tensor> out;
  for (int r = 0; r < cp; ++r) out.push_back(context_parallel_positions(seq, cp, r, "parallel.cp"));
  return out;
}

// Grouped-query attention: each kv head serves `group` query heads in a row
// ([b, kv, s, d] -> [b, kv group, s, d]), and its gradient is their sum.
inline Tensor expand_kv(const Tensor& t, int64_t group) { return group == 1 ? t : t.repeat_interleave(group, 1); }
inline Tensor fold_kv(const Tensor& t, int64_t group) {
  if (group == 1) return t;
  return t.reshape({t.size(0), t.size(1) / group, group, t.size(2), t.size(3)}).sum(2);
}

// Sends `mine` to the next rank and receives the previous rank's into a
// buffer of the same shape; returns {send, recv} events and the buffer.
struct RingHop {
  smp::sdk::Event sent, received;
  Tensor incoming;
};
inline RingHop ring_hop(const smp::sdk::Comm& comm, const Tensor& mine, int tag) {
  const int cp = comm.size(), r = comm.rank();
  RingHop h;
  h.incoming = at::empty_like(mine);
  h.sent = comm.send_async(mine, (r + 1) % cp, tag);
  h.received = comm.recv_async(h.incoming, (r + cp - 1) % cp, tag);
  return h;
}

// Under a causal mask a block from another rank is half needed (the
// load-balanced split: this rank holds chunks r and 2cp-1-r, the block's
// owner chunks src and 2cp-1-src): from a rank before this one (src < r),
// every query sees the block's first chunk whole and its second not at all;
// from a rank after it, the queries of this rank's first chunk see none of
// the block and those of its second see all of it. So half the work, and
// no mask. In its own block (src == r) the first chunk's queries see only
// the first chunk's keys: three quarters of the block, masked.
//
// So a block is attended to as tiles, each a range of this rank's queries
// against a range of the block's keys, masked or not; the tiles' query
// ranges are disjoint and in order, and a query no tile covers sees none of
// the block. `half` is a chunk: half of this rank's share.
struct Tile {
  int64_t q0, qn, k0, kn;
  bool masked;
};
inline std::vector<Tile> block_tiles(bool causal, int r, int src, int64_t half) {
  const int64_t all = 2 * half;
  if (!causal) return {{0, all, 0, all, false}};
  if (src == r) return {{0, half, 0, half, true}, {half, half, 0, all, true}};
  if (src < r) return {{0, all, 0, half, false}};
  return {{half, half, 0, all, false}};
}

// The gradients of one block's part: dq for the queries given, and the
// dK/dV of the keys given (GQA folded), against the merged output's lse and D.
struct BlockGrads {
  Tensor dq, dk, dv;
};
inline BlockGrads block_grads(const Tensor& q, const Tensor& dout, const Tensor& safe_lse, const Tensor& D,
                              const Tensor& kb, const Tensor& vb, const Tensor& q_pos, const Tensor& k_pos,
                              bool causal, double scale, int64_t group, at::ScalarType acc, const Tensor& key_pad) {
  const Tensor s = masked_scores(q, kb, q_pos, k_pos, causal, scale, key_pad);
  const Tensor p = at::exp(s - safe_lse);  // masked scores give 0
  const Tensor dp = at::matmul(dout, vb.transpose(-2, -1)).to(acc);
  const Tensor ds = p * (dp - D);
  return {at::matmul(ds, kb.to(acc)).mul(scale), fold_kv(at::matmul(ds.transpose(-2, -1), q.to(acc)).mul(scale), group),
          fold_kv(at::matmul(p.transpose(-2, -1), dout.to(acc)), group)};
}

class RingAttention : public torch::autograd::Function<RingAttention> {
 public:
  // q [b, h, s/cp, d], k, v [b, kv_heads, s/cp, d]: this rank's share; seq
  // the whole sequence. The blocks travel with their kv heads only. key_pad:
  // every rank's padding keys ([cp, b, s/cp] bool, gather_key_padding), or none.
  static Tensor forward(torch::autograd::AutogradContext* ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                        int64_t seq, const smp::sdk::Comm& comm, bool causal, double scale,
                        const c10::optional<Tensor>& padding) {
    const Tensor key_pad = padding.has_value() ? *padding : Tensor();
    const int cp = comm.size(), r = comm.rank();
    const int64_t group = q.size(1) / k.size(1);
    const std::vector<Tensor> pos = ring_positions(seq, cp);
    // Block src's padding keys k0 .. k0 + kn, or undefined.
    const auto pad_of = [&](int src, int64_t k0, int64_t kn) {
      return key_pad.defined() ? key_pad[src].narrow(1, k0, kn) : Tensor();
    };
    Tensor block = at::stack({k, v}).contiguous();  // [2, b, kv_heads, s/cp, d]
    BlockAttention acc;
    for (int step = 0, src = r; step < cp; ++step, src = (src + cp - 1) % cp) {
      RingHop hop;
      if (step + 1 < cp) hop = ring_hop(comm, block, step);  // travels while this block is attended to
      // The tiles' results in query order; a query no tile covers: out 0, lse -inf.
      std::vector<Tensor> outs, lses;
      int64_t next = 0;
      const auto unseen = [&](int64_t until) {
        if (until <= next) return;
        const Tensor qn = q.narrow(2, next, until - next);
        outs.push_back(at::zeros_like(qn, block.options()));
        lses.push_back(at::full(qn.sizes().slice(0, 3), -std::numeric_limits<float>::infinity(),
                                q.options().dtype(at::promote_types(q.scalar_type(), at::kFloat))));
      };
      for (const Tile& t : block_tiles(causal, r, src, q.size(2) / 2)) {
        unseen(t.q0);
        const BlockAttention a = block_attention(
            q.narrow(2, t.q0, t.qn), expand_kv(block[0].narrow(2, t.k0, t.kn), group),
            expand_kv(block[1].narrow(2, t.k0, t.kn), group), pos[r].narrow(0, t.q0, t.qn),
            pos[src].narrow(0, t.k0, t.kn), t.masked, scale, pad_of(src, t.k0, t.kn));
        outs.push_back(a.out), lses.push_back(a.lse);
        next = t.q0 + t.qn;
      }
      unseen(q.size(2));
      const BlockAttention b = outs.size() == 1 ? BlockAttention{outs[0], lses[0]}
                                                : BlockAttention{at::cat(outs, 2), at::cat(lses, 2)};
      acc = step == 0 ? b : merge(acc, b);
      if (step + 1 < cp) {
        hop.sent.wait();
        hop.received.wait();
        block = hop.incoming;
      }
    }
    ctx->save_for_backward({q, k, v, acc.out, acc.lse});
    ctx->saved_data["seq"] = seq;
    ctx->saved_data["causal"] = causal;
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["comm"] = smp::sdk::comm_id(comm);
    if (key_pad.defined()) ctx->saved_data["key_pad"] = key_pad;
    return acc.out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const Tensor &q = saved[0], &k = saved[1], &v = saved[2], &out = saved[3], &lse = saved[4];
    const smp::sdk::Comm comm(reinterpret_cast<smp_comm*>(ctx->saved_data["comm"].toInt()));
    const bool causal = ctx->saved_data["causal"].toBool();
    const double scale = ctx->saved_data["scale"].toDouble();
    const int cp = comm.size(), r = comm.rank();
    const int64_t group = q.size(1) / k.size(1);
    const std::vector<Tensor> pos = ring_positions(ctx->saved_data["seq"].toInt(), cp);
    const Tensor key_pad = ctx->saved_data.count("key_pad") ? ctx->saved_data["key_pad"].toTensor() : Tensor();
    const Tensor dout = grads[0].contiguous();
    // D = rowsum(dO * O): the softmax's backward against the merged output.
    const at::ScalarType acc = at::promote_types(q.scalar_type(), at::kFloat);
    const Tensor D = (dout.to(acc) * out.to(acc)).sum(-1, true);
    const Tensor safe_lse = at::where(at::isinf(lse), at::zeros_like(lse), lse).unsqueeze(-1);
    Tensor dq = at::zeros_like(q, acc);
    Tensor block = at::stack({k, v}).contiguous();
    Tensor dblock = at::zeros_like(block);  // the dK/dV of the block held, travelling with it
    const int kTagBase = 1 << 20;
    for (int step = 0, src = r; step < cp; ++step, src = (src + cp - 1) % cp) {
      RingHop kv;
      if (step + 1 < cp) kv = ring_hop(comm, block, kTagBase + 2 * step);
      for (const Tile& t : block_tiles(causal, r, src, q.size(2) / 2)) {
        const auto qs = [&](const Tensor& x) { return x.narrow(2, t.q0, t.qn); };
        const auto ks = [&](const Tensor& x) { return x.narrow(2, t.k0, t.kn); };
        const BlockGrads g =
            block_grads(qs(q), qs(dout), qs(safe_lse), qs(D), expand_kv(ks(block[0]), group),
                        expand_kv(ks(block[1]), group), pos[r].narrow(0, t.q0, t.qn), pos[src].narrow(0, t.k0, t.kn),
                        t.masked, scale, group, acc,
                        key_pad.defined() ? key_pad[src].narrow(1, t.k0, t.kn) : Tensor());
        qs(dq).add_(g.dq);  // views: the sums land in dq and dblock
        ks(dblock[0]).add_(g.dk.to(dblock.scalar_type()));
        ks(dblock[1]).add_(g.dv.to(dblock.scalar_type()));
      }
      // The accumulator follows its block: every hop but the first is on
      // the way home (after cp hops it is back with the block's owner).
      RingHop dkv = ring_hop(comm, dblock, kTagBase + 2 * step + 1);
      if (step + 1 < cp) {
        kv.sent.wait();
        kv.received.wait();
        block = kv.incoming;
      }
      dkv.sent.wait();
      dkv.received.wait();
      dblock = dkv.incoming;
    }
    // dblock is now this rank's own block's.
    return {dq.to(q.scalar_type()), dblock[0], dblock[1], Tensor(), Tensor(), Tensor(), Tensor(), Tensor()};
  }
};

}  // namespace detail

// Attention of this rank's queries over the whole sequence of keys and
// values, which the cp ranks of `comm` hold in load-balanced shares (q [b,
// heads, seq / cp, head_dim], k, v [b, kv_heads, seq / cp, head_dim]; rank r's
// chunks r and 2 cp - 1 - r of 2 cp). kv_heads divides heads. pad_mask
// (optional): this rank's share of the keys' padding mask [b, seq / cp]
// (nonzero = a real token); every rank of the group passes one or none.
// Returns this rank's output [b, heads, seq / cp, head_dim]; differentiable.
inline Tensor ring_attention(const Tensor& q, const Tensor& k, const Tensor& v, int64_t seq,
                             const smp::sdk::Comm& comm, bool causal, double scale, const Tensor& pad_mask = {}) {
  const Tensor key_pad = gather_key_padding(pad_mask, q, comm, "ring attention");
  return detail::RingAttention::apply(q, k, v, seq, comm, causal, scale,
                                      key_pad.defined() ? c10::optional<Tensor>(key_pad) : c10::nullopt);
}

}  // namespace smp_nn
