// Forward math of the smp_nn kinds, written once and reused by smp_tp on shards.
#pragma once

#include <smp_nn/gelu_kernels.hpp>
#include <smp_nn/init.hpp>

#include <smp/sdk/checkpoint.hpp>

#include <torch/csrc/autograd/custom_function.h>
#include <torch/version.h>

#include <cmath>
#include <vector>

namespace smp_nn {

// Per-site dropout seeds derived from a call's rng_seed (splitmix64 of seed ^ salt).
enum DropoutSite : uint64_t { kAttnProbs = 1, kAttnOut = 2, kMlpOut = 3, kPlain = 4 };
inline uint64_t mix_seed(uint64_t seed, uint64_t salt) {
  uint64_t z = seed ^ (salt * 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Inverted dropout whose mask depends only on (seed, full logical shape): the mask is
// drawn for the whole tensor and a shard takes its slice, so a distributed layer drops
// exactly the elements the serial layer drops. x is the slice [start, start + x.size(dim))
// of dimension `dim` of a tensor of shape `full` (empty `full` = x is the whole tensor).
inline Tensor dropout(const Tensor& x, double p, bool training, uint64_t seed, at::IntArrayRef full = {},
                      int64_t dim = 0, int64_t start = 0) {
  if (!training || p <= 0.0) return x;
  std::vector<int64_t> shape = full.empty() ? x.sizes().vec() : full.vec();
  at::Generator gen = smp::sdk::init_generator(seed);
  Tensor keep = at::empty(shape, at::TensorOptions().dtype(at::kFloat)).uniform_(0.0, 1.0, gen).ge_(p);
  // This rank's slice in storage of its own: a view would keep the whole
  // mask (every tp rank's heads) alive for backward.
  if (!full.empty()) keep = keep.narrow(dim, start, x.size(dim)).contiguous();
  // Drawn on the CPU (the mask is then the same on every device), applied on x's.
  return x * keep.mul_(1.0 / (1.0 - p)).to(x.device(), x.scalar_type());
}

inline Tensor linear(const Tensor& x, const LinearParams& p) {
  return p.bias.defined() ? at::linear(x, p.weight, p.bias) : at::linear(x, p.weight);
}
// q, k and v from one GEMM over the concatenated weights (the parameters stay
// three): one kernel with three times the columns instead of three, and in
// backward one input-gradient GEMM instead of three and the two sums of their
// results. Returns views into the one output. `decoding`: three GEMMs
// instead, as concatenating the weights reads and writes them once more per
// call, which a decoding call of a position per sample, whose cost is reading
// the weights, would pay on every token. (Only there: a checkpointed layer's
// forward, without gradients, must compute as its recomputation does.)
inline std::vector<Tensor> qkv_projection(const Tensor& x, const LinearParams& q, const LinearParams& k,
                                          const LinearParams& v, bool decoding = false) {
  const int biases = q.bias.defined() + k.bias.defined() + v.bias.defined();
  if ((biases != 0 && biases != 3) || decoding) return {linear(x, q), linear(x, k), linear(x, v)};
  const Tensor w = at::cat({q.weight, k.weight, v.weight}, 0);
  const Tensor y = biases ? at::linear(x, w, at::cat({q.bias, k.bias, v.bias}, 0)) : at::linear(x, w);
  return y.split_with_sizes({q.weight.size(0), k.weight.size(0), v.weight.size(0)}, -1);
}
inline Tensor layer_norm(const Tensor& x, const LayerNormParams& p, double eps) {
  return at::layer_norm(x, {p.weight.size(0)}, p.weight, p.bias, eps);
}
// x / sqrt(mean(x^2) + eps) * weight, the statistic in fp32 whatever the
// compute dtype (16-bit sums of squares over a long row lose the small terms).
inline Tensor rms_norm(const Tensor& x, const RmsNormParams& p, double eps) {
  const Tensor x32 = x.to(at::kFloat);
  const Tensor normed = x32 * at::rsqrt(x32.pow(2).mean({-1}, /*keepdim=*/true) + eps);
  return normed.to(x.scalar_type()) * p.weight;
}
// GELU's tanh form. A contiguous CPU float tensor takes smp_nn's one-pass
// kernels (gelu_kernels.hpp: no tanh, and a backward that is one pass too);
// any other at::gelu. Saves x for backward, as at::gelu does.
struct GeluTanh : torch::autograd::Function<GeluTanh> {
  static Tensor forward(torch::autograd::AutogradContext* ctx, const Tensor& x) {
    ctx->save_for_backward({x});
    Tensor y = at::empty_like(x);
    kernels::gelu_tanh_forward(x.data_ptr<float>(), y.data_ptr<float>(), x.numel());
    return y;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list g) {
    const Tensor x = ctx->get_saved_variables()[0], gy = g[0].contiguous();
    Tensor dx = at::empty_like(x);
    kernels::gelu_tanh_backward(gy.data_ptr<float>(), x.data_ptr<float>(), dx.data_ptr<float>(), x.numel());
    return {dx};
  }
};
inline Tensor gelu_tanh(const Tensor& x) {
  if (!x.device().is_cpu() || x.scalar_type() != at::kFloat || !x.is_contiguous()) return at::gelu(x, "tanh");
  if (x.requires_grad() && at::GradMode::is_enabled()) return GeluTanh::apply(x);
  Tensor y = at::empty_like(x);
  kernels::gelu_tanh_forward(x.data_ptr<float>(), y.data_ptr<float>(), x.numel());
  return y;
}

// Rotary position embedding (Su et al. 2021) of t [b, s, heads * head_dim]: in
// each head, the pair (x_i, x_{i + d/2}) at position p turns by p * base^(-2i/d)
// (the rotate-half layout of GPT-NeoX and Hugging Face's Llama). Angles in fp64,
// cos and sin in t's dtype. positions: undefined (0..s-1 in every sample), or
// [b, s] int64, each sample's own (a decoding call's, see kv_cache.hpp).
inline Tensor rotary(const Tensor& t, int64_t heads, int64_t head_dim, double base, const Tensor& positions = {}) {
  const int64_t b = t.size(0), s = t.size(1), half = head_dim / 2;
  const auto f64 = at::TensorOptions().dtype(at::kDouble).device(t.device());
  const Tensor inv_freq = at::pow(base, at::arange(0, half, f64).mul(-2.0 / static_cast<double>(head_dim)));
  const Tensor pos = positions.defined() ? positions.to(f64) : at::arange(s, f64).view({1, s});
  const Tensor angles = pos.unsqueeze(-1) * inv_freq;  // [1 or b, s, d/2]
  const int64_t pb = pos.size(0);
  const Tensor cos = at::cat({angles.cos(), angles.cos()}, -1).to(t.scalar_type()).view({pb, s, 1, head_dim});
  const Tensor sin = at::cat({angles.sin(), angles.sin()}, -1).to(t.scalar_type()).view({pb, s, 1, head_dim});
  const Tensor x = t.reshape({b, s, heads, head_dim});
  const Tensor rotated = at::cat({x.narrow(-1, half, half).neg(), x.narrow(-1, 0, half)}, -1);
  return (x * cos + rotated * sin).reshape({b, s, heads * head_dim});
}

// Grouped-query attention: the k or v heads that query heads [first_q,
// first_q + n_q) use, one per query head, from t [b, s, kv_local * head_dim]
// holding kv heads [kv_offset, kv_offset + kv_local). Query head j uses kv head
// j / group. t itself when every query head has its own.
inline Tensor kv_for_heads(const Tensor& t, int64_t kv_local, int64_t kv_offset, int64_t first_q, int64_t n_q,
                           int64_t group, int64_t head_dim) {
  if (group == 1 && kv_local == n_q) return t;
  const Tensor idx = at::arange(first_q, first_q + n_q, at::TensorOptions().dtype(at::kLong).device(t.device()))
                         .div(group, "floor")
                         .sub(kv_offset);
  const int64_t b = t.size(0), s = t.size(1);
  return t.reshape({b, s, kv_local, head_dim}).index_select(2, idx).reshape({b, s, n_q * head_dim});
}
// A transformer layer's norm: LayerNorm, or RMSNorm when it has no bias.
inline Tensor block_norm(const Tensor& x, const LayerNormParams& p, double eps) {
  return p.bias.defined() ? layer_norm(x, p, eps) : rms_norm(x, RmsNormParams{p.weight}, eps);
}

// Scaled dot-product attention over `heads_local` heads.
//   q, k, v: [b, s, heads_local * head_dim] (heads contiguous along the last dim)
//   pad_mask: undefined or [b, s], nonzero = keep; combined with the causal mask.
//   The attention-probability dropout mask is drawn for all `heads_total` heads and
//   sliced at `head_offset` (see dropout()).
// Returns [b, s, heads_local * head_dim].
inline Tensor attention_core(const Tensor& q, const Tensor& k, const Tensor& v, int64_t heads_local,
                             int64_t head_dim, bool causal, const Tensor& pad_mask, double p, bool training,
                             uint64_t seed, int64_t heads_total, int64_t head_offset) {
  const int64_t b = q.size(0), s = q.size(1);
  auto split = [&](const Tensor& t) { return t.reshape({b, s, heads_local, head_dim}).transpose(1, 2); };
#if TORCH_VERSION_MAJOR >= 2
  // LibTorch 2 without dropout or padding: the fused kernel (FlashAttention on a
  // GPU, its CPU port on the CPU), which never materialises the [b, n, s, s]
  // scores and keeps its softmax statistics in fp32. Same math as below up to
  // rounding. (Dropout stays below: its mask must be smp's keyed one, so that
  // every layout drops the same elements.)
  if (!pad_mask.defined() && (!training || p <= 0.0))
    return at::scaled_dot_product_attention(split(q), split(k), split(v), {}, 0.0, causal)
        .transpose(1, 2)
        .reshape({b, s, heads_local * head_dim});
#endif
  // The math path as batched GEMMs over [b * heads, s, head_dim]. Softmax in
  // fp32 whatever the compute dtype (Megatron's attention_softmax_in_fp32):
  // 16-bit sums over long rows lose the small terms.
  const int64_t bn = b * heads_local;
  auto batched = [&](const Tensor& t) { return split(t).reshape({bn, s, head_dim}); };
  const double scale = 1.0 / std::sqrt(double(head_dim));
  const Tensor q3 = batched(q), kt3 = batched(k).transpose(1, 2);
  Tensor scores;
  if (causal && !pad_mask.defined() && q.scalar_type() != at::kHalf) {
    // One kernel for scale * q k^T + mask: the causal mask as an additive bias
    // (0 / -1e9, which fp16 cannot hold: fp16 takes the path below) in the
    // GEMM's accumulator, instead of a matmul, a scaling pass and a masked fill
    // over the [b, n, s, s] scores.
    const Tensor bias = at::full({s, s}, -1e9, q.options().requires_grad(false)).triu_(1);
    scores = at::baddbmm(bias, q3, kt3, /*beta=*/1.0, /*alpha=*/scale).to(at::kFloat);
  } else {
    scores = at::bmm(q3, kt3).to(at::kFloat).mul(scale).view({b, heads_local, s, s});
    Tensor masked;  // true = may not attend, broadcastable to [b, n, s, s]
    if (causal) masked = at::ones({s, s}, at::TensorOptions().dtype(at::kBool).device(q.device())).triu(1);
    if (pad_mask.defined()) {
      if (pad_mask.dim() != 2 || pad_mask.size(0) != b || pad_mask.size(1) != s)
        throw smp::sdk::Error("attention: padding mask must be [b, s] = [" + std::to_string(b) + ", " +
                              std::to_string(s) + "], got " + c10::str(pad_mask.sizes()));
      Tensor pad = pad_mask.eq(0).reshape({b, 1, 1, s});
      masked = masked.defined() ? at::logical_or(masked, pad) : pad;
    }
    // A large finite negative (not -inf): a fully masked row gives a uniform row, not NaN.
    if (masked.defined()) scores = scores.masked_fill(masked, -1e9);
  }
  Tensor probs = at::softmax(scores, -1).to(q.scalar_type()).view({b, heads_local, s, s});
  probs = dropout(probs, p, training, seed, {b, heads_total, s, s}, 1, head_offset);
  return at::bmm(probs.reshape({bn, s, s}), batched(v))
      .view({b, heads_local, s, head_dim})
      .transpose(1, 2)
      .reshape({b, s, heads_local * head_dim});
}

// attention_core, or (recompute: selective activation checkpointing, Korthikanti
// et al. 2022) the same keeping only q, k, v and recomputing scores, softmax and
// dropout in backward: the [b, n, s, s] tensors are the bulk of a layer's
// activations at long sequences. The dropout mask depends only on the seed, so
// the recomputation draws the same one.
inline Tensor attention_core(bool recompute, const Tensor& q, const Tensor& k, const Tensor& v, int64_t heads_local,
                             int64_t head_dim, bool causal, const Tensor& pad_mask, double p, bool training,
                             uint64_t seed, int64_t heads_total, int64_t head_offset) {
  if (!recompute) return attention_core(q, k, v, heads_local, head_dim, causal, pad_mask, p, training, seed, heads_total,
                                        head_offset);
  auto core = [=](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{attention_core(in[0], in[1], in[2], heads_local, head_dim, causal, pad_mask, p,
                                              training, seed, heads_total, head_offset)};
  };
  return smp::sdk::checkpointed(core, {q, k, v})[0];
}

// Cross entropy over the last dim as weighted sums: (sum of w * nll, sum of w)
// over the tokens whose target != ignore_index. logits [..., V], targets [...]
// int64, weights undefined (w = 1: the count of tokens) or float [...] (a loss
// mask, as Megatron's; BERT weighs its masked tokens to normalise the MLM loss
// over the whole global batch). Computed in fp32 whatever the logits' dtype
// (bf16/fp16 compute): the loss is fp32.
struct LossSums {
  Tensor sum, count;
  // sum / count, and 0 (not NaN) when nothing counts.
  Tensor mean() const { return sum.div(count.add(count.eq(0).to(count.scalar_type()))); }
};
inline LossSums cross_entropy_sums(const Tensor& logits, const Tensor& targets, int64_t ignore_index,
                                   const Tensor& weights = {}) {
  Tensor lsm = at::log_softmax(logits, -1, at::kFloat);
  Tensor valid = targets.ne(ignore_index);
  Tensor idx = targets.masked_fill(valid.logical_not(), 0).unsqueeze(-1);
  Tensor w = valid.to(at::kFloat);
  if (weights.defined()) w = w.mul(weights.to(at::kFloat));
  return {lsm.gather(-1, idx).squeeze(-1).neg().mul(w).sum(), w.sum()};
}
// Token-mean cross entropy (no counted token gives 0).
inline Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index) {
  return cross_entropy_sums(logits, targets, ignore_index).mean();
}

// Shape / dtype checks with node names.
inline void expect_dim(const Tensor& t, int64_t ndim, int64_t last, const std::string& node, const char* what) {
  if (t.dim() != ndim || (last >= 0 && t.size(-1) != last))
    throw smp::sdk::Error("node '" + node + "': " + what + " must be " + std::to_string(ndim) + "-D" +
                          (last >= 0 ? " with last dim " + std::to_string(last) : std::string()) + ", got " +
                          c10::str(t.sizes()));
}
inline void expect_ids(const Tensor& ids, int64_t num, const std::string& node) {
  if (ids.scalar_type() != at::kLong)
    throw smp::sdk::Error("node '" + node + "': ids must be int64, got " + std::string(c10::toString(ids.scalar_type())));
  if (ids.numel() == 0) return;
  int64_t lo = ids.min().item<int64_t>(), hi = ids.max().item<int64_t>();
  if (lo < 0 || hi >= num)
    throw smp::sdk::Error("node '" + node + "': ids must be in [0, " + std::to_string(num) + "), got [" +
                          std::to_string(lo) + ", " + std::to_string(hi) + "]");
}
inline void expect_inputs(const std::vector<Tensor>& in, size_t lo, size_t hi, const std::string& node,
                          const std::string& method) {
  if (in.size() < lo || in.size() > hi)
    throw smp::sdk::Error("node '" + node + "': method '" + method + "' takes " + std::to_string(lo) +
                          (hi != lo ? ".." + std::to_string(hi) : std::string()) + " inputs, got " +
                          std::to_string(in.size()));
}
inline void expect_method(const std::string& method, const std::string& node, const char* allowed = "forward") {
  if (method != allowed)
    throw smp::sdk::Error(SMP_ERR_NOT_FOUND, "node '" + node + "': unknown method '" + method + "'");
}

}  // namespace smp_nn
