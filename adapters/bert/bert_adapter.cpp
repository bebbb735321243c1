// The BERT adapter (Devlin et al. 2019): masked-LM and next-sentence pre-training
// of the shared encoder (adapters/encoder) on byte-level text, sentence pairs
// from encoder/pair_data (keyed by seed, split, step and global sample, so every
// layout sees the same data).
//
// The loss is the masked-LM mean over the step's masked tokens plus the NSP
// mean over its samples, however the step is cut into microbatches and ranks:
// each masked token carries the weight B / M (B samples and M masked tokens in
// the whole global batch, known to every rank since the masks are keyed), the
// loss is the sum of the weighted MLM terms and the NSP terms, and its count is
// the number of samples (the core divides the step's sum by B once).
//
// Under parallel.cp each rank holds its share of every sequence (chunks r and
// 2 cp - 1 - r of 2 cp): its MLM terms are those of its masked tokens, however
// many they are (the weights B / M are global), and the NSP terms and the
// sample count come from the rank holding [CLS] (global position 0, cp rank 0;
// the pooler's select gives zeros elsewhere and the labels there are ignored),
// so that the sums over cp are the serial step's.
#include "corpus.h"
#include "encoder_graph.h"
#include "pair_data.h"

#include <smp/sdk/plugin.hpp>
#include <smp/data/tokenizers.hpp>

#include <ATen/ATen.h>

#include <algorithm>
#include <memory>

namespace bert {

using smp::sdk::Json;

class BertAdapter : public smp::sdk::Adapter {
 public:
  BertAdapter(const Json& cfg, const smp::sdk::AdapterContext& ctx) {
    encoder::expect_model_keys(cfg, "bert");
    shape_ = encoder::parse_shape(cfg, ctx, encoder::presets(30522, "bert-base", "bert-large"), "bert");
    const std::string data = smp::sdk::model_get<std::string>(cfg, "data", "/usr/share/common-licenses");
    const auto tokenizer = smp::sdk::model_tokenizer(cfg);
    corpus_ = std::make_unique<encoder::SentenceCorpus>(data, smp::sdk::model_get<double>(cfg, "val_fraction", 0.1),
                                                        tokenizer.get());
    encoder::fit_vocab(shape_, cfg, corpus_->vocab());
    data_ = std::make_unique<encoder::PairData>(*corpus_, shape_.seq_len, shape_.mask_prob, ctx.seed);
    smp::sdk::log(SMP_LOG_INFO, "bert", corpus_->describe(data));
  }

  void describe(smp::sdk::GraphBuilder& g) override {
    const double h = static_cast<double>(shape_.hidden);
    encoder::EncoderValues enc = encoder::describe_encoder(g, shape_, /*segments=*/true, /*weighted=*/true);
    g.input("nsp_labels");
    // Next-sentence prediction on the pooled first token: dense + tanh, then a
    // 2-way classifier. Small and replicated under tp (Megatron's pooler is too).
    g.node({"nsp.first", "select", {{"dim", 1}, {"index", 0}}, {enc.hidden}, {"cls"}, "", "", 0, 0, 4.0 * h});
    g.node({"nsp.pooler", "linear", {{"in", shape_.hidden}, {"out", shape_.hidden}, {"init_std", 0.02}, {"tp_mode", "none"}},
            {"cls"}, {"pooled_pre"}, "", "", 2.0 * h * h, 4.0 * (h * h + h), 4.0 * h});
    g.node({"nsp.tanh", "tanh", Json::object(), {"pooled_pre"}, {"pooled"}, "", "", h, 0, 4.0 * h});
    g.node({"nsp.classifier", "linear", {{"in", shape_.hidden}, {"out", 2}, {"init_std", 0.02}, {"tp_mode", "none"}},
            {"pooled"}, {"nsp_logits"}, "", "", 4.0 * h, 4.0 * (2.0 * h + 2.0), 8.0});
    g.node({"nsp.loss", "cross_entropy", {{"vocab", 2}, {"reduction", "sum"}}, {"nsp_logits", "nsp_labels"},
            {"nsp_sum", "nsp_count"}, "", "", 10.0, 0, 8.0});
    g.node({"loss", "add", Json::object(), {enc.mlm_sum, "nsp_sum"}, {"loss_sum"}, "", "", 1, 0, 0});
    g.loss_sum("loss_sum", "nsp_count");
    // The MLM weights make mlm_sum / mlm_count the mean over masked tokens.
    g.metric("mlm_loss", enc.mlm_sum, enc.mlm_count);
    g.metric("nsp_loss", "nsp_sum", "nsp_count");
  }

  std::vector<at::Tensor> batch(const smp::sdk::BatchRequest& r) override {
    const bool val = r.split == SMP_SPLIT_VALIDATION;
    const int64_t n = r.num_samples, s = shape_.seq_len;
    at::Tensor tokens = at::empty({n, s}, at::kLong), segments = at::empty({n, s}, at::kLong),
               targets = at::empty({n, s}, at::kLong), labels = at::empty({n}, at::kLong);
    // B / M for the whole global batch (each rank computes it: the masks are keyed).
    const float w = static_cast<float>(static_cast<double>(r.global_batch) /
                                       static_cast<double>(std::max<int64_t>(1, data_->masked_in_step(val, r.step, r.global_batch))));
    for (int64_t i = 0; i < n; ++i) {
      const encoder::PairSample in = data_->sample(val, r.step, r.first_sample + i);
      std::copy(in.tokens.begin(), in.tokens.end(), tokens[i].data_ptr<int64_t>());
      std::copy(in.segments.begin(), in.segments.end(), segments[i].data_ptr<int64_t>());
      std::copy(in.targets.begin(), in.targets.end(), targets[i].data_ptr<int64_t>());
      labels[i] = in.random_next;
    }
    // Corruption never produces [PAD] (random tokens are data ids), so padding is where [PAD] is.
    at::Tensor pad = tokens.ne(corpus_->vocab().pad()).to(at::kLong);
    at::Tensor weights = at::zeros({n, s}, at::kFloat).masked_fill_(targets.ne(-100), w);
    // Next-sentence prediction is counted where [CLS] is: the share holding position 0.
    if (r.sequence.split() && r.sequence.index != 0) labels.fill_(-100);
    const auto share = [&](const at::Tensor& t) { return encoder::sequence_share(t, r); };
    return {share(tokens), share(segments), share(pad), share(targets), share(weights), labels};
  }

 private:
  encoder::EncoderShape shape_;
  std::unique_ptr<encoder::SentenceCorpus> corpus_;
  std::unique_ptr<encoder::PairData> data_;
};

}  // namespace bert

SMP_PLUGIN(smp::sdk::PluginBuilder("bert", "0.1.0").adapter<bert::BertAdapter>("bert"))
