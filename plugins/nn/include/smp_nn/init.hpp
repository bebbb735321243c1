// Parameter initialisation of the smp_nn kinds. The FULL (serial) tensors are always
// generated, from smp::sdk::init_generator(ctx.init_seed), in a fixed documented order;
// distributed kinds (smp_tp) generate the same full tensors and keep their slice, so a
// shard is bit-identical to the corresponding slice of the serial parameter.
//
// Only weights draw from the generator (biases are zero, layer-norm weight 1 / bias 0),
// so the order below is the order of the normal_() draws:
//   embedding / embedding_table: weight [num, dim] ~ N(0, init_std)
//   position_embedding:          weight [max_len, dim] ~ N(0, init_std)
//   linear:                      weight [out, in] ~ N(0, init_std); bias [out] = 0
//   attention:                   q.weight, k.weight, v.weight ~ N(0, init_std) (each [h, h],
//                                rows grouped by head), out.weight [h, h] ~ N(0, out_init_std)
//   mlp:                         fc.weight [ffn, h] ~ N(0, init_std), proj.weight [h, ffn] ~ N(0, out_init_std)
//   transformer_layer:           ln1, attention (as above), ln2, mlp (as above), one generator
#pragma once

#include <smp_nn/config.hpp>

#include <ATen/ATen.h>

namespace smp_nn {

using at::Tensor;

inline Tensor param(Tensor t) { return t.requires_grad_(true); }

inline Tensor normal(at::Generator& gen, at::IntArrayRef shape, double std) {
  return at::empty(shape, at::TensorOptions().dtype(at::kFloat)).normal_(0.0, std, gen);
}

// A slice of a full tensor as a fresh leaf parameter: rows [rank*n/size, (rank+1)*n/size) of dim.
inline Tensor shard(const Tensor& full, int64_t dim, int rank, int size) {
  int64_t n = full.size(dim) / size;
  return param(full.narrow(dim, rank * n, n).clone());
}

struct LinearParams {
  Tensor weight, bias;  // weight [out, in]; bias [out] or undefined
};
struct LayerNormParams {
  Tensor weight, bias;  // [dim]
};
struct AttentionParams {
  LinearParams q, k, v, out;
};
struct MlpParams {
  LinearParams fc, proj;
};
struct TransformerLayerParams {
  LayerNormParams ln1;
  AttentionParams attn;
  LayerNormParams ln2;
  MlpParams mlp;
};

// Full (unsliced, not yet requires_grad) tensors.
inline LinearParams init_linear(at::Generator& gen, int64_t in, int64_t out, bool bias, double std) {
  LinearParams p;
  p.weight = normal(gen, {out, in}, std);
  if (bias) p.bias = at::zeros({out}, at::kFloat);
  return p;
}
inline LayerNormParams init_layer_norm(int64_t dim) {
  return {at::ones({dim}, at::kFloat), at::zeros({dim}, at::kFloat)};
}
inline AttentionParams init_attention(at::Generator& gen, const AttentionConfig& c) {
  AttentionParams p;
  p.q = init_linear(gen, c.hidden, c.hidden, true, c.init_std);
  p.k = init_linear(gen, c.hidden, c.hidden, true, c.init_std);
  p.v = init_linear(gen, c.hidden, c.hidden, true, c.init_std);
  p.out = init_linear(gen, c.hidden, c.hidden, true, c.out_init_std);
  return p;
}
inline MlpParams init_mlp(at::Generator& gen, const MlpConfig& c) {
  MlpParams p;
  p.fc = init_linear(gen, c.hidden, c.ffn, true, c.init_std);
  p.proj = init_linear(gen, c.ffn, c.hidden, true, c.out_init_std);
  return p;
}
inline TransformerLayerParams init_transformer_layer(at::Generator& gen, const TransformerLayerConfig& c) {
  TransformerLayerParams p;
  p.ln1 = init_layer_norm(c.attn.hidden);
  p.attn = init_attention(gen, c.attn);
  p.ln2 = init_layer_norm(c.attn.hidden);
  p.mlp = init_mlp(gen, c.mlp);
  return p;
}

// Mark every tensor a leaf parameter (serial layout).
inline void make_params(LinearParams& p) {
  param(p.weight);
  if (p.bias.defined()) param(p.bias);
}
inline void make_params(LayerNormParams& p) { param(p.weight), param(p.bias); }
inline void make_params(AttentionParams& p) { make_params(p.q), make_params(p.k), make_params(p.v), make_params(p.out); }
inline void make_params(MlpParams& p) { make_params(p.fc), make_params(p.proj); }
inline void make_params(TransformerLayerParams& p) {
  make_params(p.ln1), make_params(p.attn), make_params(p.ln2), make_params(p.mlp);
}

}  // namespace smp_nn
