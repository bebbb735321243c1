// The GPT model adapter, two architectures (model.arch):
//   gpt2:  token + learned position embeddings, pre-LN blocks (LayerNorm, GELU
//          MLP, biases), final LayerNorm, LM head tied to the token embedding;
//   llama: token embedding, pre-norm blocks with RMSNorm, rotary positions,
//          grouped-query attention and a SwiGLU MLP, no biases, final RMSNorm,
//          an untied LM head.
// Byte-level text data. It only describes the model: the layers come from the
// smp_nn / smp_tp kinds.
#include "text_dataset.h"

#include <smp/data/hf_llama.hpp>
#include <smp/sdk/plugin.hpp>
#include <smp/data/tokenizers.hpp>

#include <ATen/ATen.h>
#include <torch/version.h>

#include <cmath>
#include <map>
#include <memory>

namespace gpt {

using smp::sdk::Error;
using smp::sdk::Json;

struct Shape {
  int64_t layers, hidden, heads, seq_len, vocab;
  bool llama = false;
  int64_t kv_heads = 0;  // 0: heads
  int64_t ffn = 0;       // 0: 4 * hidden
};

// Named sizes, from tiny up to GPT-3 175B (the large ones are for planning and dry runs).
const std::map<std::string, Shape>& presets() {
  static const std::map<std::string, Shape> p{
      {"tiny", {2, 64, 4, 64, 256}},
      {"small", {4, 256, 4, 128, 256}},
      {"gpt2-small", {12, 768, 12, 1024, 50257}},
      {"gpt2-medium", {24, 1024, 16, 1024, 50257}},
      {"gpt2-large", {36, 1280, 20, 1024, 50257}},
      {"gpt2-xl", {48, 1600, 25, 1024, 50257}},
      {"gpt3-2.7b", {32, 2560, 32, 2048, 50257}},
      {"gpt3-6.7b", {32, 4096, 32, 2048, 50257}},
      {"gpt3-13b", {40, 5120, 40, 2048, 50257}},
      {"gpt3-175b", {96, 12288, 96, 2048, 50257}},
      // Llama-shaped (model.arch = "llama" follows from the preset).
      {"llama-tiny", {2, 64, 4, 64, 256, true, 2, 176}},
      {"llama-small", {4, 256, 8, 128, 256, true, 4, 704}},
      {"llama2-7b", {32, 4096, 32, 4096, 32000, true, 32, 11008}},
      {"llama3-8b", {32, 4096, 32, 8192, 128256, true, 8, 14336}},
      {"llama3-70b", {80, 8192, 64, 8192, 128256, true, 8, 28672}},
  };
  return p;
}

class GptAdapter : public smp::sdk::Adapter {
 public:
  GptAdapter(const Json& table, const smp::sdk::AdapterContext& ctx) {
    const uint64_t seed = ctx.seed;
    smp::sdk::expect_model_keys(table, {"preset", "arch", "layers", "hidden", "heads", "kv_heads", "seq_len", "vocab",
                                        "vocab_multiple", "dropout", "data", "val_fraction", "ffn", "mask_fraction",
                                        "rope_base", "tie_embeddings", "tokenizer", "tokenizer_model", "tokenizer_merges",
                                        "data_cache_path", "norm_eps", "from_hf"},
                                "gpt");
    // model.from_hf: the shape a Hugging Face LlamaForCausalLM's config.json gives.
    const Json cfg = smp::sdk::with_from_hf(table, smp::sdk::hf_llama_model_keys);
    Shape s{};
    if (cfg.contains("preset")) {
      std::string name = smp::sdk::model_get<std::string>(cfg, "preset");
      auto it = presets().find(name);
      if (it == presets().end()) {
        std::string names;
        for (auto& [n, _] : presets()) names += (names.empty() ? "" : ", ") + n;
        throw Error("model.preset: unknown preset '" + name + "' (known: " + names + ")");
      }
      s = it->second;
    } else {
      s = presets().at("tiny");
    }
    s.layers = smp::sdk::model_positive(cfg, "layers", s.layers, 4096);
    s.hidden = smp::sdk::model_positive(cfg, "hidden", s.hidden);
    s.heads = smp::sdk::model_positive(cfg, "heads", s.heads);
    s.seq_len = smp::sdk::model_positive(cfg, "seq_len", s.seq_len);
    s.vocab = smp::sdk::model_positive(cfg, "vocab", s.vocab);
    const auto tokenizer = smp::sdk::model_tokenizer(cfg);
    if (tokenizer) s.vocab = smp::sdk::model_vocab_for(cfg, *tokenizer, s.vocab);
    const std::string arch = smp::sdk::model_get<std::string>(cfg, "arch", s.llama ? "llama" : "gpt2");
    if (arch != "gpt2" && arch != "llama")
      throw Error("model.arch: expected \"gpt2\" or \"llama\", got \"" + arch + "\"");
    s.llama = arch == "llama";
    s.kv_heads = smp::sdk::model_positive(cfg, "kv_heads", s.kv_heads ? s.kv_heads : s.heads);
    if (!s.llama && s.kv_heads != s.heads)
      throw Error("model.kv_heads: grouped-query attention is part of model.arch = \"llama\" (gpt2 has kv_heads = heads)");
    if (s.heads % s.kv_heads != 0)
      throw Error("model.heads (" + std::to_string(s.heads) + ") must be divisible by model.kv_heads (" +
                  std::to_string(s.kv_heads) + ")");
    rope_base_ = smp::sdk::model_get<double>(cfg, "rope_base", s.llama ? 10000.0 : 0.0);
    if (!s.llama && rope_base_ != 0)
      throw Error("model.rope_base: rotary positions are part of model.arch = \"llama\" (gpt2 learns positions)");
    if (s.llama && rope_base_ <= 0) throw Error("model.rope_base: must be > 0, got " + std::to_string(rope_base_));
    tie_ = smp::sdk::model_get<bool>(cfg, "tie_embeddings", !s.llama);
    // The norms' epsilon: nodes keep their default (1e-5) unless given.
    if (cfg.contains("norm_eps")) {
      norm_eps_ = smp::sdk::model_get<double>(cfg, "norm_eps");
      if (!(norm_eps_ > 0) || !std::isfinite(norm_eps_))
        throw Error("model.norm_eps: must be a positive number, got " + cfg.at("norm_eps").dump());
    }
    shape_ = s;
    ffn_ = smp::sdk::model_positive(cfg, "ffn", s.ffn ? s.ffn : 4 * s.hidden);
    dropout_ = smp::sdk::model_get<double>(cfg, "dropout", 0.0);
    mask_fraction_ = smp::sdk::model_get<double>(cfg, "mask_fraction", 0.0);
    if (mask_fraction_ < 0 || mask_fraction_ >= 1)
      throw Error("model.mask_fraction: expected a number in [0, 1), got " + std::to_string(mask_fraction_));
    if (s.hidden % s.heads != 0)
      throw Error("model.hidden (" + std::to_string(s.hidden) + ") must be divisible by model.heads (" +
                  std::to_string(s.heads) + ")");
    // The embedding and the logits are padded as Megatron does; the padded
    // classes never appear in the data and are masked out of the loss.
    padded_vocab_ =
        smp::sdk::padded_vocab(s.vocab, smp::sdk::model_positive(cfg, "vocab_multiple", 128), ctx.tp());
    if (padded_vocab_ != s.vocab)
      smp::sdk::log(SMP_LOG_INFO, "gpt",
                    "vocabulary " + std::to_string(s.vocab) + " padded to " + std::to_string(padded_vocab_) +
                        " (a multiple of model.vocab_multiple x tp); the padded logits are masked out of the loss");
    // parallel.cp: each rank holds chunks r and 2 cp - 1 - r of 2 cp of every sequence.
    if (const int cp = ctx.axis_size("cp"); cp > 1 && s.seq_len % (2 * cp) != 0)
      throw Error("model.seq_len = " + std::to_string(s.seq_len) + " does not cut into 2 x parallel.cp = " +
                  std::to_string(2 * cp) + " equal chunks (context parallelism's causal load balance needs "
                  "seq_len % (2 cp) == 0)");
    const Json data = cfg.contains("data") ? cfg.at("data") : Json("/usr/share/common-licenses");
    const double val = smp::sdk::model_get<double>(cfg, "val_fraction", 0.1);
    if (!tokenizer && data.is_string() && !TextDataset::is_prepared(data.get<std::string>()) && s.vocab < 256)
      throw Error("model.vocab: byte-level data needs at least 256, got " + std::to_string(s.vocab));
    data_ = open_lm_data(data, val, s.seq_len, seed, s.vocab, tokenizer.get(),
                         smp::sdk::model_get<std::string>(cfg, "data_cache_path", ""));
    smp::sdk::log(SMP_LOG_INFO, "gpt", data_->describe());
  }

  void describe(smp::sdk::GraphBuilder& g) override {
    g.input("tokens");
    g.input("targets");
    std::string x = shape_.llama ? describe_llama(g) : describe_gpt2(g);
    const Shape& s = shape_;
    const double h = static_cast<double>(s.hidden), sl = static_cast<double>(s.seq_len),
                 V = static_cast<double>(padded_vocab_);
    if (tie_)
      g.node({"lm_head", "embedding", {{"num", padded_vocab_}, {"dim", s.hidden}, {"init_std", 0.02}}, {x}, {"logits"},
              "attend", "wte", 2.0 * sl * h * V, 0.0, 4.0 * sl * h});  // keeps its input; the loss keeps the logits' log-softmax
    else
      g.node({"lm_head", "embedding", {{"num", padded_vocab_}, {"dim", s.hidden}, {"init_std", 0.02}}, {x}, {"logits"},
              "attend", "", 2.0 * sl * h * V, 4.0 * V * h, 4.0 * sl * h});
    // The loss is a sum over the tokens that count (masked targets do not) with
    // their count: the core divides by the step's tokens once, so masked batches
    // weigh every token the same whatever the microbatching.
    g.node({"loss", "cross_entropy", {{"vocab", padded_vocab_}, {"real_vocab", s.vocab}, {"reduction", "sum"}},
            {"logits", "targets"},
            {"loss_sum", "loss_tokens"}, "", "", 5.0 * sl * V, 0, 4.0 * sl * V, 2.0 * sl * V});  // fp32 log-softmax
    g.loss_sum("loss_sum", "loss_tokens");
    g.throughput_unit("tokens", sl);
    g.split_sequence(1);  // batch() gives each rank of parallel.cp its share of the tokens
  }

  std::vector<at::Tensor> batch(const smp::sdk::BatchRequest& r) override {
    at::Tensor tokens = at::empty({r.num_samples, shape_.seq_len}, at::kLong);
    at::Tensor targets = at::empty({r.num_samples, shape_.seq_len}, at::kLong);
    data_->fill(r.split == SMP_SPLIT_VALIDATION, r.step, r.global_batch, r.first_sample, r.num_samples, tokens.data_ptr<int64_t>(),
                targets.data_ptr<int64_t>());
    if (mask_fraction_ > 0) mask_targets(r, targets);
    return {smp::sdk::sequence_share_of(tokens, 1, r.sequence, "parallel.cp"),
            smp::sdk::sequence_share_of(targets, 1, r.sequence, "parallel.cp")};
  }

 private:
  // The attention core's bytes kept per sample (fp32) and the fp32 extra of
  // 16-bit runs, by the path it takes (see describe_gpt2).
  std::pair<double, double> attention_core_bytes(double a, double sl) const {
#if TORCH_VERSION_MAJOR >= 2
    const bool fused_core = dropout_ <= 0;
#else
    const bool fused_core = false;
#endif
    return {fused_core ? 4.0 * a * sl : 4.0 * a * sl * sl * (dropout_ > 0 ? 3.0 : 1.0),
            fused_core ? 2.0 * a * sl : 4.0 * a * sl * sl};
  }

  // GPT-2's embeddings and blocks; returns the final norm's output.
  std::string describe_gpt2(smp::sdk::GraphBuilder& g) {
    const Shape& s = shape_;
    const double h = static_cast<double>(s.hidden), sl = static_cast<double>(s.seq_len),
                 V = static_cast<double>(padded_vocab_), L = static_cast<double>(s.layers),
                 a = static_cast<double>(s.heads);
    // Cost hints per sample (forward FLOPs; fp32 bytes). FLOPs are Megatron's
    // counts; activations are what smp_nn's transformer_layer keeps for
    // backward, measured by the MemoryEstimate tests.
    //
    // The attention core takes one of two paths (smp_nn's attention_core):
    //  - fused (LibTorch 2 without dropout; GPT has no padding mask):
    //    scaled_dot_product_attention keeps its output and one fp32 log-sum-exp
    //    per row, a s elements, never the [a, s, s] scores;
    //  - math: the softmax runs in fp32 and keeps its fp32 output, a s^2
    //    elements; under bf16/fp16 its 16-bit copy (for the product with V) is
    //    kept too. With dropout, the mask and the dropped probabilities as well.
    // Either way 16 s h elements more (Megatron's count without the scores and
    // dropout), plus the dropout masks when p > 0. The core's own part is what
    // selective checkpointing recomputes.
    const auto [core_bytes, fp32_extra] = attention_core_bytes(a, sl);
    const double act_bytes = 4.0 * (16.0 * sl * h + (dropout_ > 0 ? 2.0 * sl * h : 0.0)) + core_bytes;
    g.node({"wte", "embedding", {{"num", padded_vocab_}, {"dim", s.hidden}, {"init_std", 0.02}}, {"tokens"}, {"tok_emb"},
            "", "wte", 0.0, 4.0 * V * h, 4.0 * sl * h});
    g.node({"wpe", "position_embedding", {{"max_len", s.seq_len}, {"dim", s.hidden}, {"init_std", 0.01}},
            {"tok_emb"}, {"h0"}, "", "", sl * h, 4.0 * sl * h, 4.0 * sl * h});
    std::string x = "h0";
    if (dropout_ > 0) {
      g.node({"drop", "dropout", {{"p", dropout_}}, {x}, {"h0d"}, "", "", sl * h, 0, 4.0 * sl * h});
      x = "h0d";
    }
    const double out_std = 0.02 / std::sqrt(2.0 * L);
    for (int64_t i = 0; i < s.layers; ++i) {
      std::string y = "h" + std::to_string(i + 1);
      Json cfg{{"hidden", s.hidden}, {"heads", s.heads}, {"ffn", ffn_}, {"causal", true},
               {"dropout", dropout_}, {"init_std", 0.02}, {"out_init_std", out_std}};
      if (norm_eps_ > 0) cfg["eps"] = norm_eps_;
      const double flops = 24.0 * sl * h * h + 4.0 * sl * sl * h;
      const double params = 4.0 * (12.0 * h * h + 13.0 * h);
      g.node({"blocks." + std::to_string(i), "transformer_layer", cfg, {x}, {y}, "", "", flops, params, act_bytes,
              fp32_extra, core_bytes});
      x = y;
    }
    g.node({"ln_f", "layer_norm", norm_config(s.hidden), {x}, {"hf"}, "", "", 5.0 * sl * h, 8.0 * h, 4.0 * sl * h});
    // Megatron's training FLOPs per sample without recomputation.
    g.flops_per_sample(72.0 * sl * L * h * h * (1.0 + sl / (6.0 * h) + V / (12.0 * L * h)));
    return "hf";
  }

  // Llama's embedding and blocks (no position embedding: rotary q and k in
  // every attention); returns the final RMSNorm's output.
  std::string describe_llama(smp::sdk::GraphBuilder& g) {
    const Shape& s = shape_;
    const double h = static_cast<double>(s.hidden), sl = static_cast<double>(s.seq_len),
                 V = static_cast<double>(padded_vocab_), L = static_cast<double>(s.layers),
                 a = static_cast<double>(s.heads), f = static_cast<double>(ffn_),
                 kvd = h * static_cast<double>(s.kv_heads) / a;
    g.node({"wte", "embedding", {{"num", padded_vocab_}, {"dim", s.hidden}, {"init_std", 0.02}}, {"tokens"}, {"h0"},
            "", tie_ ? "wte" : "", 0.0, 4.0 * V * h, 4.0 * sl * h});
    std::string x = "h0";
    if (dropout_ > 0) {
      g.node({"drop", "dropout", {{"p", dropout_}}, {x}, {"h0d"}, "", "", sl * h, 0, 4.0 * sl * h});
      x = "h0d";
    }
    const auto [core_bytes, fp32_extra] = attention_core_bytes(a, sl);
    // Kept for backward per sample (elements): the norms' inputs and fp32
    // statistics, q, rotated q and k, v (expanded to every head), the context,
    // the MLP's input, gate, up, silu(gate) and product, the residuals.
    const double act_bytes = 4.0 * sl * (12.0 * h + 4.0 * kvd + 4.0 * f) + core_bytes;
    const double out_std = 0.02 / std::sqrt(2.0 * L);
    const double layer_params = 2.0 * h * h + 2.0 * h * kvd + 3.0 * h * f + 2.0 * h;
    const double layer_flops = 2.0 * sl * (layer_params - 2.0 * h) + 4.0 * sl * sl * h;
    for (int64_t i = 0; i < s.layers; ++i) {
      std::string y = "h" + std::to_string(i + 1);
      Json cfg{{"hidden", s.hidden}, {"heads", s.heads}, {"kv_heads", s.kv_heads}, {"ffn", ffn_},
               {"causal", true}, {"dropout", dropout_}, {"init_std", 0.02}, {"out_init_std", out_std},
               {"norm_type", "rms_norm"}, {"mlp", "swiglu"}, {"bias", false}, {"rope_base", rope_base_}};
      if (norm_eps_ > 0) cfg["eps"] = norm_eps_;
      g.node({"blocks." + std::to_string(i), "transformer_layer", cfg, {x}, {y}, "", "", layer_flops,
              4.0 * layer_params, act_bytes, fp32_extra, core_bytes});
      x = y;
    }
    g.node({"norm_f", "rms_norm", norm_config(s.hidden), {x}, {"hf"}, "", "", 4.0 * sl * h, 4.0 * h, 8.0 * sl * h});
    // Training FLOPs: three times the forward GEMMs and attention.
    g.flops_per_sample(3.0 * (L * layer_flops + 2.0 * sl * h * V));
    return "hf";
  }

  // Padding-like masking: each target is ignored (-100) with probability
  // mask_fraction, drawn per (split, step, global sample) so every layout masks
  // the same tokens, and microbatches end up with different token counts.
  void mask_targets(const smp::sdk::BatchRequest& r, at::Tensor& targets) const {
    for (int64_t i = 0; i < r.num_samples; ++i) {
      const uint64_t s = 0x5eedULL * 1000003ULL + static_cast<uint64_t>(r.step) * 7919ULL +
                         static_cast<uint64_t>(r.first_sample + i) + (r.split == SMP_SPLIT_VALIDATION ? 777777ULL : 0ULL);
      at::Tensor drop = at::rand({shape_.seq_len}, smp::sdk::init_generator(s)).lt(mask_fraction_);
      targets[i].masked_fill_(drop, -100);
    }
  }

  Shape shape_{};
  int64_t padded_vocab_ = 0;
  int64_t ffn_ = 0;
  double rope_base_ = 0;
  double norm_eps_ = 0;  // model.norm_eps; 0: the nodes' default

  Json norm_config(int64_t dim) const {
    Json c{{"dim", dim}};
    if (norm_eps_ > 0) c["eps"] = norm_eps_;
    return c;
  }
  bool tie_ = true;
  double dropout_ = 0;
  double mask_fraction_ = 0;
  std::unique_ptr<LmData> data_;
};

}  // namespace gpt

SMP_PLUGIN(smp::sdk::PluginBuilder("gpt", "0.1.0").adapter<gpt::GptAdapter>("gpt"))
