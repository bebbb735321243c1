// Parameter initialisation of the smp_nn kinds, from a counter-based
// smp::sdk::InitStream(ctx.init_seed): every value is a function of (seed, draw,
// index in the FULL serial tensor), so a distributed kind (smp_tp) generates only
// its shard, and that shard is bit-identical to the slice of the serial parameter.
// No rank ever materialises a full tensor it does not keep.
//
// Only weights draw (biases are zero, layer-norm weight 1 / bias 0); the draws of a
// module, in order:
//   embedding / embedding_table: weight [num, dim] ~ N(0, init_std)
//   position_embedding:          weight [max_len, dim] ~ N(0, init_std)
//   linear:                      weight [out, in] ~ N(0, init_std); bias [out] = 0
//   attention:                   q.weight [h, h], k.weight, v.weight [kv_heads * head_dim, h]
//                                ~ N(0, init_std) (rows grouped by head), out.weight [h, h] ~ N(0, out_init_std)
//   mlp:                         fc.weight [ffn, h] ~ N(0, init_std), proj.weight [h, ffn] ~ N(0, out_init_std)
//   swiglu_mlp:                  gate.weight, up.weight [ffn, h] ~ N(0, init_std), down.weight ~ N(0, out_init_std)
//   transformer_layer:           ln1, attention (as above), ln2, mlp or swiglu_mlp (as above), one stream
//   moe:                         see moe.hpp
// The sharded initialisers take (rank, size) of tp: column-parallel weights
// (q, k, v, fc) split their rows and biases, row-parallel ones (out, proj) their
// columns, with the bias whole.
#pragma once

#include <smp_nn/config.hpp>

#include <smp/sdk/init.hpp>

#include <ATen/ATen.h>

namespace smp_nn {

using at::Tensor;

inline Tensor param(Tensor t) { return t.requires_grad_(true); }

using smp::sdk::InitStream;
using smp::sdk::Slice;

inline Tensor normal(InitStream& s, at::IntArrayRef shape, double std, Slice slice = Slice::all()) {
  return s.normal(shape, std, slice);
}

struct LinearParams {
  Tensor weight, bias;  // weight [out, in]; bias [out] or undefined
};
struct LayerNormParams {
  Tensor weight, bias;  // [dim]
};
struct RmsNormParams {
  Tensor weight;  // [dim]
};
struct AttentionParams {
  LinearParams q, k, v, out;
};
struct MlpParams {
  LinearParams fc, proj;
};
struct SwigluMlpParams {
  LinearParams gate, up, down;
};
// The norms' bias is undefined under norm_type "rms_norm"; mlp or swiglu is
// set by the config's mlp.
struct TransformerLayerParams {
  LayerNormParams ln1;
  AttentionParams attn;
  LayerNormParams ln2;
  MlpParams mlp;
  SwigluMlpParams swiglu;
};

// Not yet requires_grad tensors: full, or part `rank` of `size` (tp).
// split: 0 = column-parallel (weight rows and bias split), 1 = row-parallel
// (weight columns split, bias whole), -1 = whole.
inline LinearParams init_linear(InitStream& s, int64_t in, int64_t out, bool bias, double std, int split = -1,
                                int rank = 0, int size = 1) {
  LinearParams p;
  const Slice slice = split < 0 ? Slice::all() : Slice::part(split, split == 0 ? out : in, rank, size);
  p.weight = normal(s, {out, in}, std, slice);
  if (bias) p.bias = smp::sdk::init_constant({split == 0 ? out / size : out}, 0.0);
  return p;
}
inline LayerNormParams init_layer_norm(int64_t dim) {
  return {smp::sdk::init_constant({dim}, 1.0), smp::sdk::init_constant({dim}, 0.0)};
}
inline RmsNormParams init_rms_norm(int64_t dim) { return {smp::sdk::init_constant({dim}, 1.0)}; }
// Under tp, k and v split by heads when kv_heads divides tp and are whole on
// every rank otherwise (Megatron's rule for grouped-query attention).
inline bool kv_split(const AttentionConfig& c, int size) { return size > 1 && c.kv_heads % size == 0; }
inline AttentionParams init_attention(InitStream& s, const AttentionConfig& c, int rank = 0, int size = 1) {
  const int col = size > 1 ? 0 : -1, row = size > 1 ? 1 : -1, kv = kv_split(c, size) ? 0 : -1;
  AttentionParams p;
  p.q = init_linear(s, c.hidden, c.hidden, c.bias, c.init_std, col, rank, size);
  p.k = init_linear(s, c.hidden, c.kv_dim(), c.bias, c.init_std, kv, rank, size);
  p.v = init_linear(s, c.hidden, c.kv_dim(), c.bias, c.init_std, kv, rank, size);
  p.out = init_linear(s, c.hidden, c.hidden, c.bias, c.out_init_std, row, rank, size);
  return p;
}
inline MlpParams init_mlp(InitStream& s, const MlpConfig& c, int rank = 0, int size = 1) {
  const int col = size > 1 ? 0 : -1, row = size > 1 ? 1 : -1;
  MlpParams p;
  p.fc = init_linear(s, c.hidden, c.ffn, c.bias, c.init_std, col, rank, size);
  p.proj = init_linear(s, c.ffn, c.hidden, c.bias, c.out_init_std, row, rank, size);
  return p;
}
// In this order from the node's stream: gate, up (column-split under tp), down (row-split).
inline SwigluMlpParams init_swiglu_mlp(InitStream& s, const SwigluMlpConfig& c, int rank = 0, int size = 1) {
  const int col = size > 1 ? 0 : -1, row = size > 1 ? 1 : -1;
  SwigluMlpParams p;
  p.gate = init_linear(s, c.hidden, c.ffn, c.bias, c.init_std, col, rank, size);
  p.up = init_linear(s, c.hidden, c.ffn, c.bias, c.init_std, col, rank, size);
  p.down = init_linear(s, c.ffn, c.hidden, c.bias, c.out_init_std, row, rank, size);
  return p;
}
inline TransformerLayerParams init_transformer_layer(InitStream& s, const TransformerLayerConfig& c, int rank = 0,
                                                     int size = 1) {
  TransformerLayerParams p;
  auto norm = [&] { return c.rms ? LayerNormParams{init_rms_norm(c.attn.hidden).weight, {}} : init_layer_norm(c.attn.hidden); };
  p.ln1 = norm();
  p.attn = init_attention(s, c.attn, rank, size);
  p.ln2 = norm();
  if (c.swiglu) p.swiglu = init_swiglu_mlp(s, c.swiglu_mlp(), rank, size);
  else p.mlp = init_mlp(s, c.mlp, rank, size);
  return p;
}

// Mark every tensor a leaf parameter (serial layout).
inline void make_params(LinearParams& p) {
  param(p.weight);
  if (p.bias.defined()) param(p.bias);
}
inline void make_params(LayerNormParams& p) {
  param(p.weight);
  if (p.bias.defined()) param(p.bias);
}
inline void make_params(RmsNormParams& p) { param(p.weight); }
inline void make_params(AttentionParams& p) { make_params(p.q), make_params(p.k), make_params(p.v), make_params(p.out); }
inline void make_params(MlpParams& p) { make_params(p.fc), make_params(p.proj); }
inline void make_params(SwigluMlpParams& p) { make_params(p.gate), make_params(p.up), make_params(p.down); }
inline void make_params(TransformerLayerParams& p) {
  make_params(p.ln1), make_params(p.attn), make_params(p.ln2);
  if (p.swiglu.gate.weight.defined()) make_params(p.swiglu);
  else make_params(p.mlp);
}

}  // namespace smp_nn
