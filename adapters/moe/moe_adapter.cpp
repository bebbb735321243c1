// The MoE model adapter: a llama-shaped decoder (RMSNorm, rotary positions,
// grouped-query attention, no biases, untied head) whose MLP is a mixture of
// experts in every moe_every-th layer after the first dense_layers; the other
// layers are dense SwiGLU blocks. Byte-level text data (gpt's reader).
//
// Each MoE layer is six nodes (norm, attention, residual, norm, moe, residual)
// so that the pipeline partitioner can cut anywhere; the moe nodes chain a
// statistics vector (smp_nn/moe.hpp) that moe_loss adds to the loss and turns
// into the metrics moe_load, moe_dropped, moe_aux, moe_z, moe_a2a_bytes, moe_a2a_ms.
#include "text_dataset.h"

#include <smp/data/hf_llama.hpp>
#include <smp/sdk/plugin.hpp>
#include <smp/data/tokenizers.hpp>

#include <ATen/ATen.h>

#include <cmath>
#include <map>
#include <memory>

namespace moe {

using smp::sdk::Error;
using smp::sdk::Json;

struct Shape {
  int64_t layers, hidden, heads, kv_heads, seq_len, vocab, ffn;  // ffn: the dense layers'
  int64_t experts, top_k, expert_ffn, shared_experts, moe_every, dense_layers;
};

// tiny and small train here; the others are for --estimate-memory and planning.
const std::map<std::string, Shape>& presets() {
  static const std::map<std::string, Shape> p{
      {"tiny", {2, 64, 4, 2, 64, 256, 176, 4, 2, 128, 0, 1, 0}},
      // Fine-grained experts (DeepSeek-MoE): 16 of ffn 128, top 4.
      {"small", {4, 128, 4, 2, 128, 256, 352, 16, 4, 128, 0, 1, 0}},
      // Mixtral 8x7B (Jiang et al. 2024), at a 4096-token context.
      {"mixtral-8x7b", {32, 4096, 32, 8, 4096, 32000, 14336, 8, 2, 14336, 0, 1, 0}},
      // DeepSeek-MoE 16B (Dai et al. 2024): 64 fine-grained experts, 6 routed
      // and 2 shared, the first layer dense.
      {"deepseek-moe-16b", {28, 2048, 16, 16, 4096, 102400, 10944, 64, 6, 1408, 2, 1, 1}},
  };
  return p;
}

class MoeAdapter : public smp::sdk::Adapter {
 public:
  MoeAdapter(const Json& table, const smp::sdk::AdapterContext& ctx) {
    smp::sdk::expect_model_keys(
        table, {"preset", "layers", "hidden", "heads", "kv_heads", "seq_len", "vocab", "vocab_multiple", "ffn",
                "experts", "top_k", "expert_ffn", "shared_experts", "moe_every", "dense_layers", "capacity_factor",
                "router", "router_jitter", "aux_loss_weight", "z_loss_weight", "expert_tp", "rope_base", "data",
                "val_fraction", "tokenizer", "tokenizer_model", "tokenizer_merges", "data_cache_path", "from_hf"},
        "moe");
    // model.from_hf: the shape a Hugging Face MixtralForCausalLM's config.json gives.
    const Json cfg = smp::sdk::with_from_hf(table, smp::sdk::hf_mixtral_model_keys);
    const std::string preset = smp::sdk::model_get<std::string>(cfg, "preset", "tiny");
    auto it = presets().find(preset);
    if (it == presets().end()) {
      std::string names;
      for (auto& [n, _] : presets()) names += (names.empty() ? "" : ", ") + n;
      throw Error("model.preset: unknown preset '" + preset + "' (known: " + names + ")");
    }
    Shape s = it->second;
    for (auto [key, field] : std::initializer_list<std::pair<const char*, int64_t*>>{
             {"layers", &s.layers}, {"hidden", &s.hidden}, {"heads", &s.heads}, {"kv_heads", &s.kv_heads},
             {"seq_len", &s.seq_len}, {"vocab", &s.vocab}, {"ffn", &s.ffn}, {"experts", &s.experts},
             {"top_k", &s.top_k}, {"expert_ffn", &s.expert_ffn}, {"moe_every", &s.moe_every}})
      *field = smp::sdk::model_positive(cfg, key, *field,
                                        std::string(key) == "layers" || std::string(key) == "experts" ? 4096 : int64_t{1} << 24);
    const auto tokenizer = smp::sdk::model_tokenizer(cfg);
    if (tokenizer) s.vocab = smp::sdk::model_vocab_for(cfg, *tokenizer, s.vocab);
    s.shared_experts = smp::sdk::model_get<int64_t>(cfg, "shared_experts", s.shared_experts);
    s.dense_layers = smp::sdk::model_get<int64_t>(cfg, "dense_layers", s.dense_layers);
    if (s.shared_experts < 0 || s.dense_layers < 0)
      throw Error("model.shared_experts and model.dense_layers must be >= 0");
    if (s.hidden % s.heads != 0 || s.heads % s.kv_heads != 0)
      throw Error("model.hidden (" + std::to_string(s.hidden) + ") must be divisible by model.heads (" +
                  std::to_string(s.heads) + "), and model.heads by model.kv_heads (" + std::to_string(s.kv_heads) + ")");
    if (s.top_k > s.experts)
      throw Error("model.top_k (" + std::to_string(s.top_k) + ") exceeds model.experts (" + std::to_string(s.experts) + ")");
    shape_ = s;
    // The moe nodes' own keys, passed through (smp_nn's moe checks their values).
    router_ = Json::object();
    for (const char* key : {"capacity_factor", "router", "router_jitter", "aux_loss_weight", "z_loss_weight", "expert_tp"})
      if (cfg.contains(key)) router_[key] = cfg.at(key);
    rope_base_ = smp::sdk::model_get<double>(cfg, "rope_base", 10000.0);
    if (rope_base_ <= 0) throw Error("model.rope_base: must be > 0, got " + std::to_string(rope_base_));
    padded_vocab_ = smp::sdk::padded_vocab(s.vocab, smp::sdk::model_positive(cfg, "vocab_multiple", 128), ctx.tp());
    const Json data = cfg.contains("data") ? cfg.at("data") : Json("/usr/share/common-licenses");
    const double val = smp::sdk::model_get<double>(cfg, "val_fraction", 0.1);
    if (!tokenizer && data.is_string() && !gpt::TextDataset::is_prepared(data.get<std::string>()) && s.vocab < 256)
      throw Error("model.vocab: byte-level data needs at least 256, got " + std::to_string(s.vocab));
    data_ = gpt::open_lm_data(data, val, s.seq_len, ctx.seed, s.vocab, tokenizer.get(),
                              smp::sdk::model_get<std::string>(cfg, "data_cache_path", ""));
    smp::sdk::log(SMP_LOG_INFO, "moe", data_->describe());
  }

  bool is_moe_layer(int64_t i) const {
    return i >= shape_.dense_layers && (i - shape_.dense_layers) % shape_.moe_every == shape_.moe_every - 1;
  }

  void describe(smp::sdk::GraphBuilder& g) override {
    const Shape& s = shape_;
    const double h = static_cast<double>(s.hidden), sl = static_cast<double>(s.seq_len),
                 V = static_cast<double>(padded_vocab_), L = static_cast<double>(s.layers),
                 a = static_cast<double>(s.heads), kvd = h * static_cast<double>(s.kv_heads) / a,
                 f = static_cast<double>(s.ffn), E = static_cast<double>(s.experts), k = static_cast<double>(s.top_k),
                 ef = static_cast<double>(s.expert_ffn), sf = static_cast<double>(s.shared_experts) * ef;
    g.input("tokens");
    g.input("targets");
    g.node({"wte", "embedding", {{"num", padded_vocab_}, {"dim", s.hidden}, {"init_std", 0.02}}, {"tokens"}, {"h0"},
            "", "", 0.0, 4.0 * V * h, 4.0 * sl * h});
    const double out_std = 0.02 / std::sqrt(2.0 * L);
    const Json attn{{"hidden", s.hidden}, {"heads", s.heads}, {"kv_heads", s.kv_heads}, {"causal", true},
                    {"init_std", 0.02}, {"out_init_std", out_std}, {"bias", false}, {"rope_base", rope_base_}};
    // Per sample: attention FLOPs and parameters; activations kept for backward
    // (q, rotated q and k, v expanded to every head, the context, scores' fp32
    // softmax on the math path).
    const double attn_params = 2.0 * h * h + 2.0 * h * kvd;
    const double attn_flops = 2.0 * sl * attn_params + 4.0 * sl * sl * h;
    const double attn_act = 4.0 * sl * (6.0 * h + 2.0 * kvd) + 4.0 * a * sl * sl;
    std::string x = "h0", stats;
    for (int64_t i = 0; i < s.layers; ++i) {
      const std::string p = "blocks." + std::to_string(i), y = "h" + std::to_string(i + 1);
      if (!is_moe_layer(i)) {
        Json c = attn;
        c.update({{"ffn", s.ffn}, {"norm_type", "rms_norm"}, {"mlp", "swiglu"}});
        const double params = attn_params + 3.0 * h * f + 2.0 * h;
        g.node({p, "transformer_layer", c, {x}, {y}, "", "", attn_flops + 6.0 * sl * h * f, 4.0 * params,
                attn_act + 4.0 * sl * (4.0 * h + 4.0 * f)});
        x = y;
        continue;
      }
      g.node({p + ".ln1", "rms_norm", {{"dim", s.hidden}}, {x}, {p + ".a_in"}, "", "", 4.0 * sl * h, 4.0 * h,
              8.0 * sl * h});
      g.node({p + ".attn", "attention", attn, {p + ".a_in"}, {p + ".a_out"}, "", "", attn_flops, 4.0 * attn_params,
              attn_act});
      g.node({p + ".res1", "add", Json::object(), {x, p + ".a_out"}, {p + ".mid"}, "", "", sl * h, 0, 0});
      g.node({p + ".ln2", "rms_norm", {{"dim", s.hidden}}, {p + ".mid"}, {p + ".m_in"}, "", "", 4.0 * sl * h, 4.0 * h,
              8.0 * sl * h});
      Json mc = router_;
      mc.update({{"hidden", s.hidden}, {"experts", s.experts}, {"top_k", s.top_k}, {"ffn", s.expert_ffn},
                 {"shared_experts", s.shared_experts}, {"init_std", 0.02}, {"out_init_std", out_std}});
      std::vector<std::string> in{p + ".m_in"};
      if (!stats.empty()) in.push_back(stats);
      const std::string next = p + ".stats";
      // Router, k routed experts and the shared ones per token. Kept for
      // backward per token: the router's probabilities, k rows of h each as
      // sorted, as received (the all-to-all's buffers), as computed, as sent
      // back and gated (5 k h), and the experts' four ffn-wide values.
      const double moe_params = E * h + 3.0 * E * h * ef + 3.0 * h * sf;
      const double moe_flops = 2.0 * sl * h * E + 6.0 * sl * h * (k * ef + sf);
      const double moe_act = 4.0 * sl * (E * 2.0 + k * (5.0 * h + 4.0 * ef) + 2.0 * h + 4.0 * sf);
      g.node({p + ".moe", "moe", mc, in, {p + ".m_out", next}, "", "", moe_flops, 4.0 * moe_params, moe_act});
      stats = next;
      g.node({p + ".res2", "add", Json::object(), {p + ".mid", p + ".m_out"}, {y}, "", "", sl * h, 0, 0});
      x = y;
    }
    g.node({"norm_f", "rms_norm", {{"dim", s.hidden}}, {x}, {"hf"}, "", "", 4.0 * sl * h, 4.0 * h, 8.0 * sl * h});
    g.node({"lm_head", "embedding", {{"num", padded_vocab_}, {"dim", s.hidden}, {"init_std", 0.02}}, {"hf"}, {"logits"},
            "attend", "", 2.0 * sl * h * V, 4.0 * V * h, 4.0 * sl * h});
    const bool any_moe = !stats.empty();
    g.node({"loss", "cross_entropy", {{"vocab", padded_vocab_}, {"real_vocab", s.vocab}, {"reduction", "sum"}},
            {"logits", "targets"}, {any_moe ? "ce_sum" : "loss_sum", "loss_tokens"}, "", "", 5.0 * sl * V, 0,
            4.0 * sl * V, 2.0 * sl * V});
    if (any_moe) {
      g.node({"moe_loss", "moe_loss", Json::object(), {"ce_sum", stats},
              {"loss_sum", "aux", "aux_n", "z", "z_n", "dropped", "assigned", "load_max", "load_mean", "a2a_bytes",
               "a2a_ms", "microbatches"},
              "", "", 16.0, 0, 64.0});
      g.metric("moe_load", "load_max", "load_mean");
      g.metric("moe_dropped", "dropped", "assigned");
      g.metric("moe_aux", "aux", "aux_n");
      g.metric("moe_z", "z", "z_n");
      g.metric("moe_a2a_bytes", "a2a_bytes", "microbatches");
      g.metric("moe_a2a_ms", "a2a_ms", "microbatches");
    }
    g.loss_sum("loss_sum", "loss_tokens");
    g.throughput_unit("tokens", sl);
    // Training FLOPs: three times the forward (active parameters only).
    double fwd = 2.0 * sl * h * V;
    for (int64_t i = 0; i < s.layers; ++i)
      fwd += attn_flops + (is_moe_layer(i) ? 2.0 * sl * h * E + 6.0 * sl * h * (k * ef + sf) : 6.0 * sl * h * f);
    g.flops_per_sample(3.0 * fwd);
  }

  std::vector<at::Tensor> batch(const smp::sdk::BatchRequest& r) override {
    at::Tensor tokens = at::empty({r.num_samples, shape_.seq_len}, at::kLong);
    at::Tensor targets = at::empty({r.num_samples, shape_.seq_len}, at::kLong);
    data_->fill(r.split == SMP_SPLIT_VALIDATION, r.step, r.global_batch, r.first_sample, r.num_samples, tokens.data_ptr<int64_t>(),
                targets.data_ptr<int64_t>());
    return {tokens, targets};
  }

 private:
  Shape shape_{};
  Json router_;
  double rope_base_ = 10000.0;
  int64_t padded_vocab_ = 0;
  std::unique_ptr<gpt::LmData> data_;
};

}  // namespace moe

SMP_PLUGIN(smp::sdk::PluginBuilder("moe", "0.1.0").adapter<moe::MoeAdapter>("moe"))
