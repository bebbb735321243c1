// Configs of the smp_nn module kinds, parsed once and shared with smp_tp so that a
// serial kind and its distributed kind read a node's JSON identically.
// Every error names the node and the key.
#pragma once

#include <smp/sdk/module.hpp>

#include <ATen/ATen.h>

#include <cstdint>
#include <limits>
#include <string>

namespace smp_nn {

using smp::sdk::config_get;
using smp::sdk::expect_node_keys;
using smp::sdk::Json;

inline void require(bool ok, const std::string& node, const std::string& what) {
  if (!ok) throw smp::sdk::Error("node '" + node + "': " + what);
}
inline int64_t positive(const Json& cfg, const char* key, const std::string& node) {
  auto v = config_get<int64_t>(cfg, key, node);
  require(v > 0, node, std::string("config key '") + key + "' must be > 0, got " + std::to_string(v));
  return v;
}
inline int64_t positive(const Json& cfg, const char* key, const std::string& node, int64_t fallback) {
  return cfg.contains(key) ? positive(cfg, key, node) : fallback;
}
inline double probability(const Json& cfg, const char* key, const std::string& node) {
  double p = config_get<double>(cfg, key, node, 0.0);
  require(p >= 0.0 && p < 1.0, node, std::string("config key '") + key + "' must be in [0, 1), got " + std::to_string(p));
  return p;
}
inline double stddev(const Json& cfg, const char* key, const std::string& node, double fallback) {
  double s = config_get<double>(cfg, key, node, fallback);
  require(s >= 0.0, node, std::string("config key '") + key + "' must be >= 0, got " + std::to_string(s));
  return s;
}

// embedding {num, dim, init_std=0.02, attend_bias=false (a bias [num] added by
// the attend method: BERT's tied MLM decoder)}; embedding_table has the same keys
// and ids (read by its tp kind).
struct EmbeddingConfig {
  int64_t num, dim;
  double init_std;
  bool attend_bias = false;
  static EmbeddingConfig parse(const Json& c, const std::string& node) {
    expect_node_keys(c, {"num", "dim", "init_std", "ids", "attend_bias"}, node);
    return {positive(c, "num", node), positive(c, "dim", node), stddev(c, "init_std", node, 0.02),
            config_get<bool>(c, "attend_bias", node, false)};
  }
};

// position_embedding {max_len, dim, init_std=0.01}
struct PositionEmbeddingConfig {
  int64_t max_len, dim;
  double init_std;
  static PositionEmbeddingConfig parse(const Json& c, const std::string& node) {
    expect_node_keys(c, {"max_len", "dim", "init_std"}, node);
    return {positive(c, "max_len", node), positive(c, "dim", node), stddev(c, "init_std", node, 0.01)};
  }
};

// layer_norm and rms_norm {dim, eps=1e-5} (rms_norm: Zhang & Sennrich 2019,
// Llama's norm: no mean, no bias)
struct NormConfig {
  int64_t dim;
  double eps;
  static NormConfig parse(const Json& c, const std::string& node) {
    expect_node_keys(c, {"dim", "eps"}, node);
    NormConfig r{positive(c, "dim", node), config_get<double>(c, "eps", node, 1e-5)};
    require(r.eps > 0, node, "config key 'eps' must be > 0");
    return r;
  }
};

// linear {in, out, bias=true, init_std=0.02}; tp_mode, gather_output and
// input_is_parallel are read by its tp kinds (see smp_tp).
struct LinearConfig {
  int64_t in, out;
  bool bias;
  double init_std;
  static LinearConfig parse(const Json& c, const std::string& node) {
    expect_node_keys(c, {"in", "out", "bias", "init_std", "tp_mode", "gather_output", "input_is_parallel"}, node);
    return {positive(c, "in", node), positive(c, "out", node), config_get<bool>(c, "bias", node, true),
            stddev(c, "init_std", node, 0.02)};
  }
};

// attention {hidden, heads, kv_heads=heads, causal=true, dropout=0, init_std=0.02,
//            out_init_std=init_std, bias=true, rope_base=0}
// kv_heads < heads is grouped-query attention (Ainslie et al. 2023): k and v
// have kv_heads heads, each shared by heads / kv_heads consecutive query heads.
struct AttentionConfig {
  int64_t hidden, heads, kv_heads;
  bool causal, bias = true;
  double dropout, init_std, out_init_std;
  double rope_base = 0;  // rotary position embedding of q and k with this base; 0 = none
  // Not a config key: set from the module context when the memory manager asks
  // (memory.checkpoint_attention_core): the core's activations are recomputed in backward.
  bool recompute_core = false;
  int64_t head_dim() const { return hidden / heads; }
  int64_t kv_dim() const { return kv_heads * head_dim(); }
  int64_t group() const { return heads / kv_heads; }  // query heads per kv head
  static AttentionConfig parse(const Json& c, const std::string& node, bool check_keys = true) {
    if (check_keys)
      expect_node_keys(c, {"hidden", "heads", "kv_heads", "causal", "dropout", "init_std", "out_init_std", "bias",
                           "rope_base"},
                       node);
    AttentionConfig r;
    r.hidden = positive(c, "hidden", node);
    r.heads = positive(c, "heads", node);
    require(r.hidden % r.heads == 0, node,
            "hidden " + std::to_string(r.hidden) + " not divisible by heads " + std::to_string(r.heads));
    r.kv_heads = positive(c, "kv_heads", node, r.heads);
    require(r.heads % r.kv_heads == 0, node,
            "heads " + std::to_string(r.heads) + " not divisible by kv_heads " + std::to_string(r.kv_heads));
    r.causal = config_get<bool>(c, "causal", node, true);
    r.bias = config_get<bool>(c, "bias", node, true);
    r.dropout = probability(c, "dropout", node);
    r.init_std = stddev(c, "init_std", node, 0.02);
    r.out_init_std = stddev(c, "out_init_std", node, r.init_std);
    r.rope_base = config_get<double>(c, "rope_base", node, 0.0);
    require(r.rope_base >= 0, node, "config key 'rope_base' must be >= 0 (0: no rotary embedding)");
    require(r.rope_base == 0 || r.head_dim() % 2 == 0, node,
            "rotary embedding (rope_base) needs an even head size, got " + std::to_string(r.head_dim()));
    return r;
  }
};

// mlp {hidden, ffn=4*hidden, bias=true, dropout=0, init_std=0.02, out_init_std=init_std}
struct MlpConfig {
  int64_t hidden, ffn;
  double dropout, init_std, out_init_std;
  bool bias = true;
  static MlpConfig parse(const Json& c, const std::string& node, bool check_keys = true) {
    if (check_keys) expect_node_keys(c, {"hidden", "ffn", "bias", "dropout", "init_std", "out_init_std"}, node);
    MlpConfig r;
    r.hidden = positive(c, "hidden", node);
    r.ffn = positive(c, "ffn", node, 4 * r.hidden);
    r.bias = config_get<bool>(c, "bias", node, true);
    r.dropout = probability(c, "dropout", node);
    r.init_std = stddev(c, "init_std", node, 0.02);
    r.out_init_std = stddev(c, "out_init_std", node, r.init_std);
    return r;
  }
};

// swiglu_mlp {hidden, ffn=4*hidden, bias=false, dropout=0, init_std=0.02, out_init_std=init_std}
// (Shazeer 2020; Llama's MLP: down(silu(gate x) * up x))
struct SwigluMlpConfig {
  int64_t hidden, ffn;
  bool bias;
  double dropout, init_std, out_init_std;
  static SwigluMlpConfig parse(const Json& c, const std::string& node) {
    expect_node_keys(c, {"hidden", "ffn", "bias", "dropout", "init_std", "out_init_std"}, node);
    SwigluMlpConfig r;
    r.hidden = positive(c, "hidden", node);
    r.ffn = positive(c, "ffn", node, 4 * r.hidden);
    r.bias = config_get<bool>(c, "bias", node, false);
    r.dropout = probability(c, "dropout", node);
    r.init_std = stddev(c, "init_std", node, 0.02);
    r.out_init_std = stddev(c, "out_init_std", node, r.init_std);
    return r;
  }
};

// transformer_layer {attention's and mlp's keys, eps = 1e-5,
//                    norm = "pre" (GPT-2: x + f(N(x))) | "post" (BERT: N(x + f(x))),
//                    norm_type = "layer_norm" | "rms_norm", mlp = "gelu" | "swiglu"}
// Llama's block: norm_type "rms_norm", mlp "swiglu", bias false, rope_base, kv_heads.
struct TransformerLayerConfig {
  AttentionConfig attn;
  MlpConfig mlp;
  double eps;
  bool post_norm = false;
  bool rms = false;     // norm_type = "rms_norm" (the norms have no bias)
  bool swiglu = false;  // mlp = "swiglu"
  SwigluMlpConfig swiglu_mlp() const {
    return {mlp.hidden, mlp.ffn, mlp.bias, mlp.dropout, mlp.init_std, mlp.out_init_std};
  }
  static TransformerLayerConfig parse(const Json& c, const std::string& node) {
    expect_node_keys(c, {"hidden", "heads", "kv_heads", "ffn", "causal", "dropout", "init_std", "out_init_std", "eps",
                         "norm", "norm_type", "mlp", "bias", "rope_base"},
                     node);
    TransformerLayerConfig r{AttentionConfig::parse(c, node, false), MlpConfig::parse(c, node, false),
                             config_get<double>(c, "eps", node, 1e-5)};
    require(r.eps > 0, node, "config key 'eps' must be > 0");
    const std::string norm = config_get<std::string>(c, "norm", node, "pre");
    require(norm == "pre" || norm == "post", node, "config key 'norm' must be \"pre\" or \"post\", got \"" + norm + "\"");
    r.post_norm = norm == "post";
    const std::string type = config_get<std::string>(c, "norm_type", node, "layer_norm");
    require(type == "layer_norm" || type == "rms_norm", node,
            "config key 'norm_type' must be \"layer_norm\" or \"rms_norm\", got \"" + type + "\"");
    r.rms = type == "rms_norm";
    const std::string mlp = config_get<std::string>(c, "mlp", node, "gelu");
    require(mlp == "gelu" || mlp == "swiglu", node,
            "config key 'mlp' must be \"gelu\" or \"swiglu\", got \"" + mlp + "\"");
    r.swiglu = mlp == "swiglu";
    return r;
  }
};

// The residual structure of a transformer layer around its two sublayers, for
// the serial and the tensor-parallel kinds alike: pre-LN x + f(LN1(x)) then
// h + g(LN2(h)); post-LN (BERT) LN1(x + f(x)) then LN2(h + g(h)).
template <class Attn, class Mlp, class Norm1, class Norm2>
at::Tensor transformer_block(bool post_norm, const at::Tensor& x, Attn&& attn, Mlp&& mlp, Norm1&& ln1, Norm2&& ln2) {
  if (post_norm) {
    at::Tensor h = ln1(x + attn(x));
    return ln2(h + mlp(h));
  }
  at::Tensor h = x + attn(ln1(x));
  return h + mlp(ln2(h));
}

// cross_entropy {ignore_index=-100, vocab (optional: the class count; logits with
//                fewer columns are a vocabulary-parallel shard under tp),
//                real_vocab (optional: a padded vocabulary's real classes; the logits of
//                classes >= real_vocab are masked out of the loss, as Megatron pads to 128 x tp),
//                reduction = "mean" (one output: the token mean) | "sum" (two outputs: the
//                sum over counted tokens and their count, for graph_set_loss_sum)}
// An optional third input, float weights shaped like the targets, weighs each
// token's loss and count (a loss mask).
struct CrossEntropyConfig {
  int64_t ignore_index;
  int64_t vocab;       // 0 = not given
  bool sum;            // reduction = "sum"
  int64_t real_vocab;  // 0 = every class is real
  static CrossEntropyConfig parse(const Json& c, const std::string& node) {
    expect_node_keys(c, {"ignore_index", "vocab", "real_vocab", "reduction"}, node);
    const std::string reduction = config_get<std::string>(c, "reduction", node, "mean");
    require(reduction == "mean" || reduction == "sum", node,
            "config key 'reduction' must be \"mean\" or \"sum\", got \"" + reduction + "\"");
    CrossEntropyConfig out{config_get<int64_t>(c, "ignore_index", node, -100), positive(c, "vocab", node, 0),
                           reduction == "sum", positive(c, "real_vocab", node, 0)};
    require(!out.real_vocab || !out.vocab || out.real_vocab <= out.vocab, node,
            "config key 'real_vocab' (" + std::to_string(out.real_vocab) + ") exceeds 'vocab' (" +
                std::to_string(out.vocab) + ")");
    return out;
  }
  // Logits of padded classes to -inf (exp gives exactly 0: the loss and the real
  // classes' gradients are those of the unpadded vocabulary). first_class: the
  // class of column 0 (a vocabulary-parallel shard's offset).
  at::Tensor mask_padding(const at::Tensor& logits, int64_t first_class = 0) const {
    const int64_t v = logits.size(-1);
    if (!real_vocab || first_class + v <= real_vocab) return logits;
    at::Tensor padded = at::arange(first_class, first_class + v, logits.options().dtype(at::kLong)).ge(real_vocab);
    return logits.masked_fill(padded, -std::numeric_limits<double>::infinity());
  }
  // The inputs after logits: int64 targets [...] matching logits [..., V], and
  // the optional weights shaped like the targets. Returns the weights (or undefined).
  at::Tensor check_inputs(const std::vector<at::Tensor>& in, const std::string& node, const char* logits_shape) const {
    const at::Tensor &logits = in[0], &targets = in[1];
    if (targets.scalar_type() != at::kLong || logits.dim() != targets.dim() + 1 ||
        logits.sizes().slice(0, targets.dim()) != targets.sizes())
      throw smp::sdk::Error("node '" + node + "': expects logits " + logits_shape + " and int64 targets [...], got " +
                            c10::str(logits.sizes()) + " and " + c10::str(targets.sizes()));
    if (in.size() < 3) return {};
    if (in[2].sizes() != targets.sizes() || !at::isFloatingType(in[2].scalar_type()))
      throw smp::sdk::Error("node '" + node + "': weights must be floating point shaped like the targets " +
                            c10::str(targets.sizes()) + ", got " + c10::str(in[2].sizes()) + " " +
                            std::string(c10::toString(in[2].scalar_type())));
    return in[2].detach();  // data, not a function of the parameters
  }
  // The module's outputs: the mean, or (sum, count).
  template <class Sums>
  std::vector<at::Tensor> outputs(const Sums& s) const {
    if (!sum) return {s.mean()};
    return {s.sum, s.count};
  }
};

}  // namespace smp_nn
