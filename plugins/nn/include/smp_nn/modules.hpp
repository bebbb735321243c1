// The serial module kinds of smp_nn.so. Header-only so that tests (and smp_tp's
// serial-equivalence checks) can instantiate them directly.
//
// kind                 config                                         method: inputs -> outputs
// embedding            {num, dim, init_std=0.02, attend_bias=false}   forward: ids [b,s] int64 -> [b,s,dim]
//                                                                     attend: x [b,s,dim] -> x W^T (+ b) [b,s,num]
// position_embedding   {max_len, dim, init_std=0.01}                  forward: x [b,s,dim] -> x + P[:s]
// layer_norm           {dim, eps=1e-5}                                forward: x [...,dim] -> [...,dim]
// rms_norm             {dim, eps=1e-5}                                forward: x [...,dim] -> [...,dim] (no mean, no bias)
// swiglu_mlp           {hidden, ffn=4*hidden, bias=false, dropout=0,  forward: x [...,h] -> down(silu(gate x) * up x)
//                       init_std=0.02, out_init_std=init_std}
// linear               {in, out, bias=true, init_std=0.02}            forward: x [...,in] -> [...,out]
// attention            {hidden, heads, kv_heads=heads, causal=true,   forward: x [b,s,h] (, pad mask [b,s]) -> [b,s,h]
//                       dropout=0, init_std=0.02, out_init_std=init_std,
//                       bias=true, rope_base=0 (rotary q and k with this base; 0 = none)}
// mlp                  {hidden, ffn=4h, dropout=0, init_std, out_init_std}  forward: x [...,h] -> [...,h]
// transformer_layer    {hidden, heads, kv_heads, ffn=4h, causal=true,        forward: x [b,s,h] (, pad mask) -> [b,s,h]
//                       dropout=0, init_std, out_init_std, eps=1e-5, bias,
//                       norm="pre"|"post", norm_type="layer_norm"|"rms_norm",
//                       mlp="gelu"|"swiglu", rope_base}
// moe, moe_loss        see moe.hpp (a mixture of experts and its loss and metrics)
// cross_entropy        {ignore_index=-100, vocab (optional),           forward: logits [b,s,V], targets [b,s] (, weights [b,s])
//                       real_vocab (optional), reduction="mean"|"sum"}    -> scalar mean, or (sum, count) with reduction "sum"
// add                  {}                                             forward: x1..xn -> sum
// concat               {dim=-1}                                       forward: x1..xn -> cat along dim
// relu                 {}                                             forward: x -> relu(x)
// gelu                 {approximate="none"|"tanh"}                    forward: x -> gelu(x)
// dropout              {p=0}                                          forward: x -> dropout(x) (training only)
// mse_loss             {}                                             forward: pred, target -> scalar mean
// embedding_table      {num, dim, init_std=0.02}                      forward: ids [n] or [b,k] int64 -> ids.shape + [dim]
// mul                  {}                                             forward: x1..xn -> product
// bce_with_logits      {}                                             forward: logits, labels -> scalar mean
// ranking_metrics      {k=10}                                         forward: scores [b,n] -> (hits, ndcg sum, users)
// select               {dim, index=0}                                 forward: x -> x.select(dim, index) (BERT's first token)
// tanh                 {}                                             forward: x -> tanh(x)
//
// Dropout masks are drawn from call.rng_seed (see ops.hpp), so the same seed gives the
// same masks, whatever the layout.
#pragma once

#include <smp_nn/kv_cache.hpp>
#include <smp_nn/ops.hpp>
#include <smp_nn/sequence_split.hpp>

#include <smp/sdk/module.hpp>

#include <string>
#include <vector>

namespace smp_nn {

using smp::sdk::Call;
using smp::sdk::Module;
using smp::sdk::ModuleContext;
using smp::sdk::Param;

inline void add_params(std::vector<Param>& out, const std::string& prefix, const LinearParams& p, int w_dim = -1,
                       int b_dim = -1, bool b_sum = false) {
  out.push_back({prefix + "weight", p.weight, w_dim, false});
  if (p.bias.defined()) out.push_back({prefix + "bias", p.bias, b_dim, b_sum});
}
inline void add_params(std::vector<Param>& out, const std::string& prefix, const LayerNormParams& p,
                       bool tp_grad_sum = false) {
  out.push_back({prefix + "weight", p.weight, -1, tp_grad_sum});
  if (p.bias.defined()) out.push_back({prefix + "bias", p.bias, -1, tp_grad_sum});
}

inline void add_params(std::vector<Param>& out, const std::string& prefix, const RmsNormParams& p,
                       bool tp_grad_sum = false) {
  out.push_back({prefix + "weight", p.weight, -1, tp_grad_sum});
}

// ---- serial math on full parameters (reused by tests) ----
// decode: a decoding call's positions, whose K and V `cache` keeps (kv_cache.hpp).
// seq: the sequence axis' split (positions and attention span its ranks), or null.
inline Tensor attention_forward(const AttentionParams& p, const AttentionConfig& c, const Tensor& x,
                                const Tensor& pad_mask, bool training, uint64_t seed, KvCache* cache = nullptr,
                                const smp::sdk::Decode* decode = nullptr, const std::string& node = "",
                                const SequenceSplit* seq = nullptr) {
  const bool split = seq && seq->split();
  if (split) seq->check_call(decode != nullptr);
  std::vector<Tensor> qkv = qkv_projection(x, p.q, p.k, p.v, decode != nullptr);
  if (decode) check_decodable(c, pad_mask, node);
  const Tensor positions = decode  ? decode_positions(*decode, x.size(1), x.device())
                           : split ? seq->positions(x.size(1), x.device()).view({1, -1})
                                   : Tensor();
  if (c.rope_base > 0) {
    qkv[0] = rotary(qkv[0], c.heads, c.head_dim(), c.rope_base, positions);
    qkv[1] = rotary(qkv[1], c.kv_heads, c.head_dim(), c.rope_base, positions);
  }
  if (decode)
    return linear(cache->attend(*decode, qkv[0], qkv[1], qkv[2], c.heads, c.kv_heads, 0, 0, c.group(), c.head_dim(),
                                node),
                  p.out);
  if (split)
    return linear(seq->attend(qkv[0], qkv[1], qkv[2], c.heads, c.kv_heads, c.head_dim(), c.causal, pad_mask), p.out);
  for (int i : {1, 2}) qkv[i] = kv_for_heads(qkv[i], c.kv_heads, 0, 0, c.heads, c.group(), c.head_dim());
  Tensor ctx = attention_core(c.recompute_core, qkv[0], qkv[1], qkv[2], c.heads, c.head_dim(), c.causal, pad_mask,
                              c.dropout, training, mix_seed(seed, kAttnProbs), c.heads, 0);
  return dropout(linear(ctx, p.out), c.dropout, training, mix_seed(seed, kAttnOut));
}
inline Tensor mlp_forward(const MlpParams& p, const MlpConfig& c, const Tensor& x, bool training, uint64_t seed) {
  return dropout(linear(gelu_tanh(linear(x, p.fc)), p.proj), c.dropout, training, mix_seed(seed, kMlpOut));
}
// silu(gate) * up, the gated activation of a SwiGLU MLP.
inline Tensor swiglu(const Tensor& gate, const Tensor& up) { return at::silu(gate) * up; }
inline Tensor swiglu_mlp_forward(const SwigluMlpParams& p, const SwigluMlpConfig& c, const Tensor& x, bool training,
                                 uint64_t seed) {
  return dropout(linear(swiglu(linear(x, p.gate), linear(x, p.up)), p.down), c.dropout, training,
                 mix_seed(seed, kMlpOut));
}
inline Tensor transformer_layer_forward(const TransformerLayerParams& p, const TransformerLayerConfig& c,
                                        const Tensor& x, const Tensor& pad_mask, bool training, uint64_t seed,
                                        KvCache* cache = nullptr, const smp::sdk::Decode* decode = nullptr,
                                        const std::string& node = "", const SequenceSplit* seq = nullptr) {
  return transformer_block(
      c.post_norm, x,
      [&](const Tensor& t) {
        return attention_forward(p.attn, c.attn, t, pad_mask, training, seed, cache, decode, node, seq);
      },
      [&](const Tensor& t) {
        return c.swiglu ? swiglu_mlp_forward(p.swiglu, c.swiglu_mlp(), t, training, seed)
                        : mlp_forward(p.mlp, c.mlp, t, training, seed);
      },
      [&](const Tensor& t) { return block_norm(t, p.ln1, c.eps); }, [&](const Tensor& t) { return block_norm(t, p.ln2, c.eps); });
}

class Embedding : public Module {
 public:
  Embedding(const Json& cfg, const ModuleContext& ctx) : node_(ctx.node_name), c_(EmbeddingConfig::parse(cfg, node_)) {
    InitStream gen(ctx.init_seed);
    weight_ = param(normal(gen, {c_.num, c_.dim}, c_.init_std));
    if (c_.attend_bias) bias_ = param(smp::sdk::init_constant({c_.num}, 0.0));
  }
  std::vector<Tensor> forward(const Call& call) override {
    expect_inputs(call.inputs, 1, 1, node_, call.method);
    if (call.method == "attend") {
      expect_dim(call.inputs[0], 3, c_.dim, node_, "attend input");
      return {bias_.defined() ? at::linear(call.inputs[0], weight_, bias_) : at::linear(call.inputs[0], weight_)};
    }
    expect_method(call.method, node_);
    expect_ids(call.inputs[0], c_.num, node_);
    return {at::embedding(weight_, call.inputs[0])};
  }
  std::vector<Param> parameters() override {
    std::vector<Param> out{{"weight", weight_, -1, false}};
    if (bias_.defined()) out.push_back({"attend_bias", bias_, -1, false});
    return out;
  }

 private:
  std::string node_;
  EmbeddingConfig c_;
  Tensor weight_, bias_;
};

class EmbeddingTable : public Module {
 public:
  EmbeddingTable(const Json& cfg, const ModuleContext& ctx)
      : node_(ctx.node_name), c_(EmbeddingConfig::parse(cfg, node_)) {
    require(!c_.attend_bias, node_, "config key 'attend_bias' is for embedding (a table has no attend method)");
    InitStream gen(ctx.init_seed);
    weight_ = param(normal(gen, {c_.num, c_.dim}, c_.init_std));
  }
  std::vector<Tensor> forward(const Call& call) override {
    expect_method(call.method, node_);
    expect_inputs(call.inputs, 1, 1, node_, call.method);
    expect_ids(call.inputs[0], c_.num, node_);
    return {at::embedding(weight_, call.inputs[0])};
  }
  std::vector<Param> parameters() override { return {{"weight", weight_, -1, false}}; }

 private:
  std::string node_;
  EmbeddingConfig c_;
  Tensor weight_;
};

class PositionEmbedding : public Module {
 public:
  PositionEmbedding(const Json& cfg, const ModuleContext& ctx)
      : node_(ctx.node_name), c_(PositionEmbeddingConfig::parse(cfg, node_)), seq_(SequenceSplit::from(ctx)) {
    InitStream gen(ctx.init_seed);
    weight_ = param(normal(gen, {c_.max_len, c_.dim}, c_.init_std));
  }
  std::vector<Tensor> forward(const Call& call) override {
    expect_method(call.method, node_);
    expect_inputs(call.inputs, 1, 1, node_, call.method);
    const Tensor& x = call.inputs[0];
    expect_dim(x, 3, c_.dim, node_, "input");
    if (call.decode) return {x + position_rows(weight_, *call.decode, x, node_)};
    if (x.size(1) * seq_.size > c_.max_len)
      throw smp::sdk::Error("node '" + node_ + "': sequence length " + std::to_string(x.size(1) * seq_.size) +
                            " exceeds max_len " + std::to_string(c_.max_len));
    if (seq_.split()) return {x + weight_.index_select(0, seq_.positions(x.size(1), x.device()))};
    return {x + weight_.narrow(0, 0, x.size(1))};
  }
  std::vector<Param> parameters() override { return {{"weight", weight_, -1, false}}; }

 private:
  std::string node_;
  PositionEmbeddingConfig c_;
  SequenceSplit seq_;
  Tensor weight_;
};

// A normalisation over the last dimension (layer_norm, rms_norm): its
// parameters from Init(dim), applied by Apply with the config's eps.
template <class Params, Params (*Init)(int64_t), Tensor (*Apply)(const Tensor&, const Params&, double)>
class Norm : public Module {
 public:
  Norm(const Json& cfg, const ModuleContext& ctx) : node_(ctx.node_name), c_(NormConfig::parse(cfg, node_)) {
    p_ = Init(c_.dim);
    make_params(p_);
  }
  std::vector<Tensor> forward(const Call& call) override {
    expect_method(call.method, node_);
    expect_inputs(call.inputs, 1, 1, node_, call.method);
    if (call.inputs[0].dim() < 1 || call.inputs[0].size(-1) != c_.dim)
      throw smp::sdk::Error("node '" + node_ + "': input last dim must be " + std::to_string(c_.dim) + ", got " +
                            c10::str(call.inputs[0].sizes()));
    return {Apply(call.inputs[0], p_, c_.eps)};
  }
  std::vector<Param> parameters() override {
    std::vector<Param> out;
    add_params(out, "", p_);
    return out;
  }

 private:
  std::string node_;
  NormConfig c_;
  Params p_;
};
using LayerNorm = Norm<LayerNormParams, init_layer_norm, layer_norm>;
using RmsNorm = Norm<RmsNormParams, init_rms_norm, rms_norm>;

class Linear : public Module {
 public:
  Linear(const Json& cfg, const ModuleContext& ctx) : node_(ctx.node_name), c_(LinearConfig::parse(cfg, node_)) {
    InitStream gen(ctx.init_seed);
    p_ = init_linear(gen, c_.in, c_.out, c_.bias, c_.init_std);
    make_params(p_);
  }
  std::vector<Tensor> forward(const Call& call) override {
    expect_method(call.method, node_);
    expect_inputs(call.inputs, 1, 1, node_, call.method);
    if (call.inputs[0].dim() < 1 || call.inputs[0].size(-1) != c_.in)
      throw smp::sdk::Error("node '" + node_ + "': input last dim must be " + std::to_string(c_.in) + ", got " +
                            c10::str(call.inputs[0].sizes()));
    return {linear(call.inputs[0], p_)};
  }
  std::vector<Param> parameters() override {
    std::vector<Param> out;
    add_params(out, "", p_);
    return out;
  }

 private:
  std::string node_;
  LinearConfig c_;
  LinearParams p_;
};

class Attention : public Module {
 public:
  Attention(const Json& cfg, const ModuleContext& ctx)
      : node_(ctx.node_name), c_(AttentionConfig::parse(cfg, node_)), seq_(SequenceSplit::from(ctx)) {
    seq_.check_heads(c_.heads, c_.kv_heads);
    c_.recompute_core = ctx.recompute_attention_core();
    InitStream gen(ctx.init_seed);
    p_ = init_attention(gen, c_);
    make_params(p_);
  }
  std::vector<Tensor> forward(const Call& call) override {
    expect_method(call.method, node_);
    expect_inputs(call.inputs, 1, 2, node_, call.method);
    expect_dim(call.inputs[0], 3, c_.hidden, node_, "input");
    Tensor mask = call.inputs.size() > 1 ? call.inputs[1] : Tensor();
    if (!call.decode) cache_.clear();
    return {attention_forward(p_, c_, call.inputs[0], mask, call.training, call.rng_seed, &cache_, call.decode, node_,
                              &seq_)};
  }
  std::vector<Param> parameters() override {
    std::vector<Param> out;
    add_params(out, "q.", p_.q), add_params(out, "k.", p_.k), add_params(out, "v.", p_.v);
    add_params(out, "out.", p_.out);
    return out;
  }

 private:
  std::string node_;
  AttentionConfig c_;
  SequenceSplit seq_;
  AttentionParams p_;
  KvCache cache_;
};

class Mlp : public Module {
 public:
  Mlp(const Json& cfg, const ModuleContext& ctx) : node_(ctx.node_name), c_(MlpConfig::parse(cfg, node_)) {
    InitStream gen(ctx.init_seed);
    p_ = init_mlp(gen, c_);
    make_params(p_);
  }
  std::vector<Tensor> forward(const Call& call) override {
    expect_method(call.method, node_);
    expect_inputs(call.inputs, 1, 1, node_, call.method);
    if (call.inputs[0].dim() < 1 || call.inputs[0].size(-1) != c_.hidden)
      throw smp::sdk::Error("node '" + node_ + "': input last dim must be " + std::to_string(c_.hidden) +
                            ", got " + c10::str(call.inputs[0].sizes()));
    return {mlp_forward(p_, c_, call.inputs[0], call.training, call.rng_seed)};
  }
  std::vector<Param> parameters() override {
    std::vector<Param> out;
    add_params(out, "fc.", p_.fc), add_params(out, "proj.", p_.proj);
    return out;
  }

 private:
  std::string node_;
  MlpConfig c_;
  MlpParams p_;
};

class SwigluMlp : public Module {
 public:
  SwigluMlp(const Json& cfg, const ModuleContext& ctx) : node_(ctx.node_name), c_(SwigluMlpConfig::parse(cfg, node_)) {
    InitStream gen(ctx.init_seed);
    p_ = init_swiglu_mlp(gen, c_);
    make_params(p_);
  }
  std::vector<Tensor> forward(const Call& call) override {
    expect_method(call.method, node_);
    expect_inputs(call.inputs, 1, 1, node_, call.method);
    if (call.inputs[0].dim() < 1 || call.inputs[0].size(-1) != c_.hidden)
      throw smp::sdk::Error("node '" + node_ + "': input last dim must be " + std::to_string(c_.hidden) +
                            ", got " + c10::str(call.inputs[0].sizes()));
    return {swiglu_mlp_forward(p_, c_, call.inputs[0], call.training, call.rng_seed)};
  }
  std::vector<Param> parameters() override {
    std::vector<Param> out;
    add_params(out, "gate.", p_.gate), add_params(out, "up.", p_.up), add_params(out, "down.", p_.down);
    return out;
  }

 private:
  std::string node_;
  SwigluMlpConfig c_;
  SwigluMlpParams p_;
};

class TransformerLayer : public Module {
 public:
  TransformerLayer(const Json& cfg, const ModuleContext& ctx)
      : node_(ctx.node_name), c_(TransformerLayerConfig::parse(cfg, node_)), seq_(SequenceSplit::from(ctx)) {
    seq_.check_heads(c_.attn.heads, c_.attn.kv_heads);
    c_.attn.recompute_core = ctx.recompute_attention_core();
    InitStream gen(ctx.init_seed);
    p_ = init_transformer_layer(gen, c_);
    make_params(p_);
  }
  std::vector<Tensor> forward(const Call& call) override {
    expect_method(call.method, node_);
    expect_inputs(call.inputs, 1, 2, node_, call.method);
    expect_dim(call.inputs[0], 3, c_.attn.hidden, node_, "input");
    Tensor mask = call.inputs.size() > 1 ? call.inputs[1] : Tensor();
    if (!call.decode) cache_.clear();
    return {transformer_layer_forward(p_, c_, call.inputs[0], mask, call.training, call.rng_seed, &cache_, call.decode,
                                      node_, &seq_)};
  }
  std::vector<Param> parameters() override {
    std::vector<Param> out;
    add_params(out, "ln1.", p_.ln1);
    add_params(out, "attn.q.", p_.attn.q), add_params(out, "attn.k.", p_.attn.k);
    add_params(out, "attn.v.", p_.attn.v), add_params(out, "attn.out.", p_.attn.out);
    add_params(out, "ln2.", p_.ln2);
    if (c_.swiglu)
      add_params(out, "mlp.gate.", p_.swiglu.gate), add_params(out, "mlp.up.", p_.swiglu.up),
          add_params(out, "mlp.down.", p_.swiglu.down);
    else
      add_params(out, "mlp.fc.", p_.mlp.fc), add_params(out, "mlp.proj.", p_.mlp.proj);
    return out;
  }

 private:
  std::string node_;
  TransformerLayerConfig c_;
  SequenceSplit seq_;
  TransformerLayerParams p_;
  KvCache cache_;
};

class CrossEntropy : public Module {
 public:
  CrossEntropy(const Json& cfg, const ModuleContext& ctx)
      : node_(ctx.node_name), c_(CrossEntropyConfig::parse(cfg, node_)) {}
  std::vector<Tensor> forward(const Call& call) override {
    expect_method(call.method, node_);
    expect_inputs(call.inputs, 2, 3, node_, call.method);
    const Tensor weights = c_.check_inputs(call.inputs, node_, "[..., V]");
    const Tensor &logits = call.inputs[0], &targets = call.inputs[1];
    if (c_.vocab && logits.size(-1) != c_.vocab)
      throw smp::sdk::Error("node '" + node_ + "': logits last dim " + std::to_string(logits.size(-1)) +
                            " != vocab " + std::to_string(c_.vocab));
    return c_.outputs(cross_entropy_sums(c_.mask_padding(logits), targets, c_.ignore_index, weights));
  }

 private:
  std::string node_;
  CrossEntropyConfig c_;
};

// ---- small utilities for DAG test models ----
class Add : public Module {
 public:
  Add(const Json& cfg, const ModuleContext& ctx) : node_(ctx.node_name) { expect_node_keys(cfg, {}, node_); }
  std::vector<Tensor> forward(const Call& call) override {
    expect_method(call.method, node_);
    expect_inputs(call.inputs, 1, SIZE_MAX, node_, call.method);
    Tensor y = call.inputs[0];
    for (size_t i = 1; i < call.inputs.size(); ++i) y = y + call.inputs[i];
    return {y};
  }

 private:
  std::string node_;
};

class Concat : public Module {
 public:
  Concat(const Json& cfg, const ModuleContext& ctx)
      : node_(ctx.node_name), dim_(config_get<int64_t>(cfg, "dim", node_, -1)) {
    expect_node_keys(cfg, {"dim"}, node_);
  }
  std::vector<Tensor> forward(const Call& call) override {
    expect_method(call.method, node_);
    expect_inputs(call.inputs, 1, SIZE_MAX, node_, call.method);
    return {at::cat(call.inputs, dim_)};
  }

 private:
  std::string node_;
  int64_t dim_;
};

class Relu : public Module {
 public:
  Relu(const Json& cfg, const ModuleContext& ctx) : node_(ctx.node_name) { expect_node_keys(cfg, {}, node_); }
  std::vector<Tensor> forward(const Call& call) override {
    expect_method(call.method, node_);
    expect_inputs(call.inputs, 1, 1, node_, call.method);
    return {at::relu(call.inputs[0])};
  }

 private:
  std::string node_;
};

class Gelu : public Module {
 public:
  Gelu(const Json& cfg, const ModuleContext& ctx)
      : node_(ctx.node_name), approximate_(config_get<std::string>(cfg, "approximate", node_, "none")) {
    expect_node_keys(cfg, {"approximate"}, node_);
    require(approximate_ == "none" || approximate_ == "tanh", node_,
            "config key 'approximate' must be \"none\" or \"tanh\", got \"" + approximate_ + "\"");
  }
  std::vector<Tensor> forward(const Call& call) override {
    expect_method(call.method, node_);
    expect_inputs(call.inputs, 1, 1, node_, call.method);
    return {approximate_ == "tanh" ? gelu_tanh(call.inputs[0]) : at::gelu(call.inputs[0], approximate_)};
  }

 private:
  std::string node_;
  std::string approximate_;
};

class Dropout : public Module {
 public:
  Dropout(const Json& cfg, const ModuleContext& ctx) : node_(ctx.node_name), p_(probability(cfg, "p", node_)) {
    expect_node_keys(cfg, {"p"}, node_);
  }
  std::vector<Tensor> forward(const Call& call) override {
    expect_method(call.method, node_);
    expect_inputs(call.inputs, 1, 1, node_, call.method);
    return {dropout(call.inputs[0], p_, call.training, mix_seed(call.rng_seed, kPlain))};
  }

 protected:
  std::string node_;
  double p_;
};

class MseLoss : public Module {
 public:
  MseLoss(const Json& cfg, const ModuleContext& ctx) : node_(ctx.node_name) { expect_node_keys(cfg, {}, node_); }
  std::vector<Tensor> forward(const Call& call) override {
    expect_method(call.method, node_);
    expect_inputs(call.inputs, 2, 2, node_, call.method);
    if (call.inputs[0].sizes() != call.inputs[1].sizes())
      throw smp::sdk::Error("node '" + node_ + "': pred " + c10::str(call.inputs[0].sizes()) + " and target " +
                            c10::str(call.inputs[1].sizes()) + " differ in shape");
    // In fp32 whatever the compute dtype, like cross_entropy: a loss is a long sum
    // (and LibTorch 1.13 has no bf16 mse on the CPU).
    return {at::mse_loss(call.inputs[0].to(at::kFloat), call.inputs[1].to(at::kFloat))};
  }

 private:
  std::string node_;
};

// The elementwise product of its inputs (NCF's generalized matrix factorization).
class Mul : public Module {
 public:
  Mul(const Json& cfg, const ModuleContext& ctx) : node_(ctx.node_name) { expect_node_keys(cfg, {}, node_); }
  std::vector<Tensor> forward(const Call& call) override {
    expect_method(call.method, node_);
    expect_inputs(call.inputs, 2, SIZE_MAX, node_, call.method);
    Tensor y = call.inputs[0];
    for (size_t i = 1; i < call.inputs.size(); ++i) y = y * call.inputs[i];
    return {y};
  }

 private:
  std::string node_;
};

// Binary cross entropy on logits against 0/1 labels of the same shape, the
// mean over every element (a per-sample mean when samples have equal sizes), in fp32.
class BceWithLogits : public Module {
 public:
  BceWithLogits(const Json& cfg, const ModuleContext& ctx) : node_(ctx.node_name) { expect_node_keys(cfg, {}, node_); }
  std::vector<Tensor> forward(const Call& call) override {
    expect_method(call.method, node_);
    expect_inputs(call.inputs, 2, 2, node_, call.method);
    if (call.inputs[0].sizes() != call.inputs[1].sizes())
      throw smp::sdk::Error("node '" + node_ + "': logits " + c10::str(call.inputs[0].sizes()) + " and labels " +
                            c10::str(call.inputs[1].sizes()) + " differ in shape");
    return {at::binary_cross_entropy_with_logits(call.inputs[0].to(at::kFloat), call.inputs[1].to(at::kFloat))};
  }

 private:
  std::string node_;
};

// Leave-one-out ranking quality {k = 10}: scores [b, n] or [b, n, 1], the
// candidates of b users with the held-out positive in column 0. Outputs the
// hits (users whose positive ranks in the top k), the summed NDCG@k
// (1 / log2(rank + 2) when it does) and the users: for graph.metric(). A
// candidate scoring the same as the positive ranks ahead of it (no lucky ties).
class RankingMetrics : public Module {
 public:
  RankingMetrics(const Json& cfg, const ModuleContext& ctx) : node_(ctx.node_name) {
    expect_node_keys(cfg, {"k"}, node_);
    k_ = config_get<int64_t>(cfg, "k", node_, 10);
    require(k_ > 0, node_, "config key 'k' must be > 0");
  }
  std::vector<Tensor> forward(const Call& call) override {
    expect_method(call.method, node_);
    expect_inputs(call.inputs, 1, 1, node_, call.method);
    Tensor s = call.inputs[0].detach().to(at::kFloat);
    if (s.dim() == 3 && s.size(2) == 1) s = s.squeeze(2);
    if (s.dim() != 2)
      throw smp::sdk::Error("node '" + node_ + "': scores must be [users, candidates] (or [.., .., 1]), got " +
                            c10::str(call.inputs[0].sizes()));
    Tensor positive = s.narrow(1, 0, 1);
    Tensor rank = s.narrow(1, 1, s.size(1) - 1).ge(positive).sum(1).to(at::kFloat);  // candidates ahead
    Tensor hit = rank.lt(static_cast<double>(k_)).to(at::kDouble);  // sums in double: exact counts, stable NDCG
    Tensor ndcg = hit.div(rank.to(at::kDouble).add(2.0).log2());
    return {hit.sum(), ndcg.sum(), at::full({}, static_cast<double>(s.size(0)), hit.options())};
  }

 private:
  std::string node_;
  int64_t k_ = 10;
};

// x.select(dim, index): one position of a dimension, e.g. BERT's pooled first
// token (dim 1, index 0) of [b, s, h]. A negative dim or index counts from the end.
// Under a sequence axis (parallel.cp) a select along the sequence (dim 1 of
// [b, s, ...]) picks the token at that global position: the rank whose share
// holds it gives it, every other rank zeros. What consumes the output must
// count it on the holder's rank only (BERT gives its next-sentence labels
// there, and ignores them on the others), since the loss is summed over cp.
class Select : public Module {
 public:
  Select(const Json& cfg, const ModuleContext& ctx)
      : node_(ctx.node_name),
        dim_(config_get<int64_t>(cfg, "dim", node_)),
        index_(config_get<int64_t>(cfg, "index", node_, 0)),
        seq_(SequenceSplit::from(ctx)) {
    expect_node_keys(cfg, {"dim", "index"}, node_);
  }
  std::vector<Tensor> forward(const Call& call) override {
    expect_method(call.method, node_);
    expect_inputs(call.inputs, 1, 1, node_, call.method);
    return {select(call.inputs[0])};
  }
  int64_t dim() const { return dim_; }
  // x's dim 1 holds this rank's share of the sequence (whole when not split).
  Tensor select(const Tensor& x) const {
    const int64_t d = dim_ < 0 ? dim_ + x.dim() : dim_;
    const bool shared = seq_.split() && d == 1;
    const int64_t n = shared ? x.size(1) * seq_.size : d >= 0 && d < x.dim() ? x.size(d) : 0;
    if (d < 0 || d >= x.dim() || index_ >= n || index_ < -n)
      throw smp::sdk::Error("node '" + node_ + "': cannot select index " + std::to_string(index_) + " of dim " +
                            std::to_string(dim_) + " from " + c10::str(x.sizes()) +
                            (shared ? " (this rank's share of " + std::to_string(n) + " positions)" : ""));
    if (!shared) return x.select(d, index_);
    const int64_t global = index_ < 0 ? index_ + n : index_;
    const Tensor local = seq_.positions(x.size(1), at::kCPU).eq(global).nonzero();
    if (local.numel() == 0) return at::zeros_like(x.select(1, 0));
    return x.select(1, local.item<int64_t>());
  }

 private:
  std::string node_;
  int64_t dim_, index_;
  SequenceSplit seq_;
};

class Tanh : public Module {
 public:
  Tanh(const Json& cfg, const ModuleContext& ctx) : node_(ctx.node_name) { expect_node_keys(cfg, {}, node_); }
  std::vector<Tensor> forward(const Call& call) override {
    expect_method(call.method, node_);
    expect_inputs(call.inputs, 1, 1, node_, call.method);
    return {at::tanh(call.inputs[0])};
  }

 private:
  std::string node_;
};

}  // namespace smp_nn
