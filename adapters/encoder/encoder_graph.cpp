#include "encoder_graph.h"

#include "corpus.h"

namespace encoder {

using smp::sdk::Error;
using smp::sdk::Json;

void expect_model_keys(const Json& cfg, const std::string& adapter) {
  smp::sdk::expect_model_keys(cfg, {"preset", "layers", "hidden", "heads", "seq_len", "vocab", "vocab_multiple", "ffn",
                                    "dropout", "mask_prob", "data", "val_fraction", "tokenizer", "tokenizer_model",
                                    "tokenizer_merges"},
                              adapter);
}

std::map<std::string, EncoderShape> presets(int64_t published_vocab, const std::string& base_name,
                                            const std::string& large_name) {
  auto shape = [](int64_t l, int64_t h, int64_t a, int64_t s, int64_t v) {
    EncoderShape e;
    e.layers = l, e.hidden = h, e.heads = a, e.seq_len = s, e.vocab = v;
    return e;
  };
  return {{"tiny", shape(2, 64, 4, 64, kByteVocab)},
          {"small", shape(4, 256, 4, 128, kByteVocab)},
          {base_name, shape(12, 768, 12, 512, published_vocab)},
          {large_name, shape(24, 1024, 16, 512, published_vocab)}};
}

EncoderShape parse_shape(const Json& cfg, const smp::sdk::AdapterContext& ctx,
                         const std::map<std::string, EncoderShape>& known, const std::string& adapter) {
  EncoderShape s = known.at("tiny");
  if (cfg.contains("preset")) {
    const std::string name = smp::sdk::model_get<std::string>(cfg, "preset");
    auto it = known.find(name);
    if (it == known.end()) {
      std::string names;
      for (auto& [n, _] : known) names += (names.empty() ? "" : ", ") + n;
      throw Error("model.preset: unknown preset '" + name + "' (known: " + names + ")");
    }
    s = it->second;
  }
  s.layers = smp::sdk::model_positive(cfg, "layers", s.layers, 4096);
  s.hidden = smp::sdk::model_positive(cfg, "hidden", s.hidden);
  s.heads = smp::sdk::model_positive(cfg, "heads", s.heads);
  s.seq_len = smp::sdk::model_positive(cfg, "seq_len", s.seq_len);
  s.vocab = smp::sdk::model_positive(cfg, "vocab", s.vocab);
  s.ffn = smp::sdk::model_positive(cfg, "ffn", 4 * s.hidden);
  s.dropout = smp::sdk::model_get<double>(cfg, "dropout", s.dropout);
  s.mask_prob = smp::sdk::model_get<double>(cfg, "mask_prob", s.mask_prob);
  if (s.dropout < 0 || s.dropout >= 1)
    throw Error("model.dropout: expected a number in [0, 1), got " + std::to_string(s.dropout));
  if (s.mask_prob <= 0 || s.mask_prob >= 1)
    throw Error("model.mask_prob: expected a number in (0, 1), got " + std::to_string(s.mask_prob));
  if (s.hidden % s.heads != 0)
    throw Error("model.hidden (" + std::to_string(s.hidden) + ") must be divisible by model.heads (" +
                std::to_string(s.heads) + ")");
  if (s.seq_len < 8) throw Error("model.seq_len: expected at least 8, got " + std::to_string(s.seq_len));
  // parallel.cp: each rank holds chunks r and 2 cp - 1 - r of 2 cp of every
  // sequence (the layout every cp kind shares; bidirectional attention does
  // not need its balance, but costs nothing under it either).
  if (const int cp = ctx.axis_size("cp"); cp > 1 && s.seq_len % (2 * cp) != 0)
    throw Error("model.seq_len = " + std::to_string(s.seq_len) + " does not cut into 2 x parallel.cp = " +
                std::to_string(2 * cp) + " equal chunks (context parallelism's layout needs seq_len % (2 cp) == 0)");
  s.tp = ctx.tp();
  s.vocab_multiple = smp::sdk::model_positive(cfg, "vocab_multiple", 128);
  s.adapter = adapter;
  return s;
}

void fit_vocab(EncoderShape& s, const Json& cfg, const Vocab& data) {
  if (!cfg.contains("vocab") && s.vocab < data.size()) s.vocab = data.size();  // the preset's is the bytes'
  if (s.vocab < data.size())
    throw Error("model.vocab: the data's " + std::to_string(data.data) +
                " ids and [PAD], [CLS], [SEP], [MASK] need at least " + std::to_string(data.size()) + ", got " +
                std::to_string(s.vocab));
  s.padded_vocab = smp::sdk::padded_vocab(s.vocab, s.vocab_multiple, s.tp);
  if (s.padded_vocab != s.vocab)
    smp::sdk::log(SMP_LOG_INFO, s.adapter.c_str(),
                  "vocabulary " + std::to_string(s.vocab) + " padded to " + std::to_string(s.padded_vocab) +
                      " (a multiple of model.vocab_multiple x tp); the padded logits are masked out of the loss");
}

EncoderValues describe_encoder(smp::sdk::GraphBuilder& g, const EncoderShape& s, bool with_segments,
                               bool weighted_mlm) {
  const double h = static_cast<double>(s.hidden), sl = static_cast<double>(s.seq_len),
               V = static_cast<double>(s.padded_vocab), a = static_cast<double>(s.heads);
  const bool drop = s.dropout > 0;
  g.input("tokens");
  if (with_segments) g.input("segments");
  g.input("pad_mask");
  g.input("mlm_targets");
  if (weighted_mlm) g.input("mlm_weights");

  // Per-sample cost hints, as GPT's (the same layer kinds; bench/results/memory-estimate.json).
  const double act_bytes =
      4.0 * (16.0 * sl * h + a * sl * sl + (drop ? 2.0 * sl * h + 2.0 * a * sl * sl : 0.0));
  const double fp32_extra = 4.0 * a * sl * sl;
  const double core_bytes = 4.0 * a * sl * sl * (drop ? 3.0 : 1.0);
  const double emb = 4.0 * sl * h;

  // The token embedding is also the MLM decoder (tied), whose bias it holds.
  const Json wte{{"num", s.padded_vocab}, {"dim", s.hidden}, {"init_std", 0.02}, {"attend_bias", true}};
  g.node({"embed.tokens", "embedding", wte, {"tokens"}, {"tok"}, "", "wte", 0.0, 4.0 * V * h, emb});
  std::string x = "tok";
  if (with_segments) {
    // Two segments (A, B); padded to a multiple of tp so the table splits like the
    // token embedding (and lays its output out the same way under sequence parallelism).
    const int64_t types = smp::sdk::padded_vocab(2, 1, s.tp);
    g.node({"embed.segments", "embedding", {{"num", types}, {"dim", s.hidden}, {"init_std", 0.02}}, {"segments"},
            {"seg"}, "", "", 0.0, 4.0 * static_cast<double>(types) * h, emb});
    g.node({"embed.sum", "add", Json::object(), {"tok", "seg"}, {"tok_seg"}, "", "", sl * h, 0.0, emb});
    x = "tok_seg";
  }
  g.node({"embed.positions", "position_embedding", {{"max_len", s.seq_len}, {"dim", s.hidden}, {"init_std", 0.02}},
          {x}, {"emb"}, "", "", sl * h, 4.0 * sl * h, emb});
  g.node({"embed.norm", "layer_norm", {{"dim", s.hidden}, {"eps", 1e-12}}, {"emb"}, {"h0"}, "", "", 5.0 * sl * h,
          8.0 * h, emb});
  x = "h0";
  if (drop) {
    g.node({"embed.dropout", "dropout", {{"p", s.dropout}}, {x}, {"h0d"}, "", "", sl * h, 0, emb});
    x = "h0d";
  }
  for (int64_t i = 0; i < s.layers; ++i) {
    const std::string y = "h" + std::to_string(i + 1);
    const Json cfg{{"hidden", s.hidden}, {"heads", s.heads},     {"ffn", s.ffn},      {"causal", false},
                   {"norm", "post"},     {"dropout", s.dropout}, {"init_std", 0.02}, {"eps", 1e-12}};
    g.node({"layers." + std::to_string(i), "transformer_layer", cfg, {x, "pad_mask"}, {y}, "", "",
            24.0 * sl * h * h + 4.0 * sl * sl * h, 4.0 * (12.0 * h * h + 13.0 * h), act_bytes, fp32_extra,
            core_bytes});
    x = y;
  }
  // The MLM head: dense + GELU + layer norm, then the tied decoder. The dense
  // layer is column-split under tp with its output gathered (whole on every rank).
  g.node({"mlm.dense", "linear", {{"in", s.hidden}, {"out", s.hidden}, {"init_std", 0.02}}, {x}, {"mlm_d"}, "", "",
          2.0 * sl * h * h, 4.0 * (h * h + h), emb});
  g.node({"mlm.act", "gelu", Json::object(), {"mlm_d"}, {"mlm_a"}, "", "", 8.0 * sl * h, 0, emb});
  g.node({"mlm.norm", "layer_norm", {{"dim", s.hidden}, {"eps", 1e-12}}, {"mlm_a"}, {"mlm_h"}, "", "", 5.0 * sl * h,
          8.0 * h, emb});
  g.node({"mlm.decoder", "embedding", wte, {"mlm_h"}, {"mlm_logits"}, "attend", "wte", 2.0 * sl * h * V, 0.0,
          4.0 * sl * V});
  std::vector<std::string> loss_in{"mlm_logits", "mlm_targets"};
  if (weighted_mlm) loss_in.push_back("mlm_weights");
  g.node({"mlm.loss", "cross_entropy",
          {{"vocab", s.padded_vocab}, {"real_vocab", s.vocab}, {"reduction", "sum"}},
          loss_in, {"mlm_sum", "mlm_count"}, "", "", 5.0 * sl * V, 0, 4.0 * sl * V, 2.0 * sl * V});  // fp32 log-softmax
  g.throughput_unit("tokens", sl);
  // Under parallel.cp every [b, s] input is this rank's share of the sequence
  // (encoder::sequence_share); the positions, the attention (with its padding
  // mask) and the summed losses follow the share's global positions.
  g.split_sequence(1);
  // Megatron's training FLOPs per sample (the decoder runs on every position;
  // BERT's pooler and classifier are negligible).
  g.flops_per_sample(72.0 * sl * static_cast<double>(s.layers) * h * h *
                     (1.0 + sl / (6.0 * h) + V / (12.0 * static_cast<double>(s.layers) * h)));
  return {x, "mlm_sum", "mlm_count"};
}

}  // namespace encoder
