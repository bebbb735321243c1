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
#pragma once

#include <smp_nn/block_attention.hpp>

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

class RingAttention : public torch::autograd::Function<RingAttention> {
 public:
  // q [b, h, s/cp, d], k, v [b, kv_heads, s/cp, d]: this rank's share; seq
  // the whole sequence. The blocks travel with their kv heads only.
  static Tensor forward(torch::autograd::AutogradContext* ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                        int64_t seq, const smp::sdk::Comm& comm, bool causal, double scale) {
    const int cp = comm.size(), r = comm.rank();
    const int64_t group = q.size(1) / k.size(1);
    const std::vector<Tensor> pos = ring_positions(seq, cp);
    Tensor block = at::stack({k, v}).contiguous();  // [2, b, kv_heads, s/cp, d]
    BlockAttention acc;
    for (int step = 0, src = r; step < cp; ++step, src = (src + cp - 1) % cp) {
      RingHop hop;
      if (step + 1 < cp) hop = ring_hop(comm, block, step);  // travels while this block is attended to
      const BlockAttention b =
          block_attention(q, expand_kv(block[0], group), expand_kv(block[1], group), pos[r], pos[src], causal, scale);
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
      const Tensor kb = expand_kv(block[0], group), vb = expand_kv(block[1], group);
      const Tensor s = masked_scores(q, kb, pos[r], pos[src], causal, scale);
      const Tensor p = at::exp(s - safe_lse);  // masked scores give 0
      const Tensor dp = at::matmul(dout, vb.transpose(-2, -1)).to(acc);
      const Tensor ds = p * (dp - D);
      dq += at::matmul(ds, kb.to(acc)).mul(scale);
      dblock[0] += fold_kv(at::matmul(ds.transpose(-2, -1), q.to(acc)).mul(scale), group).to(dblock.scalar_type());
      dblock[1] += fold_kv(at::matmul(p.transpose(-2, -1), dout.to(acc)), group).to(dblock.scalar_type());
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
    return {dq.to(q.scalar_type()), dblock[0], dblock[1], Tensor(), Tensor(), Tensor(), Tensor()};
  }
};

}  // namespace detail

// Attention of this rank's queries over the whole sequence of keys and
// values, which the cp ranks of `comm` hold in load-balanced shares (q [b,
// heads, seq / cp, head_dim], k, v [b, kv_heads, seq / cp, head_dim]; rank r's
// chunks r and 2 cp - 1 - r of 2 cp). kv_heads divides heads.
// Returns this rank's output [b, heads, seq / cp, head_dim]; differentiable.
inline Tensor ring_attention(const Tensor& q, const Tensor& k, const Tensor& v, int64_t seq,
                             const smp::sdk::Comm& comm, bool causal, double scale) {
  return detail::RingAttention::apply(q, k, v, seq, comm, causal, scale);
}

}  // namespace smp_nn
