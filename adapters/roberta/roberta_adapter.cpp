// The RoBERTa adapter (Liu et al. 2019): BERT's encoder (adapters/encoder)
// trained on the masked LM alone, with RoBERTa's data recipe (full-sentence
// packing, dynamic masking: encoder/packed_data). No segment embeddings and no
// next-sentence task. The loss is Core 2.0's summed loss: the MLM terms and the
// masked-token count, divided once per step (under parallel.cp each rank's
// share of them, summed over cp).
#include "corpus.h"
#include "encoder_graph.h"
#include "packed_data.h"

#include <smp/sdk/plugin.hpp>
#include <smp/data/tokenizers.hpp>

#include <ATen/ATen.h>

#include <algorithm>
#include <memory>

namespace roberta {

using smp::sdk::Json;

class RobertaAdapter : public smp::sdk::Adapter {
 public:
  RobertaAdapter(const Json& cfg, const smp::sdk::AdapterContext& ctx) {
    encoder::expect_model_keys(cfg, "roberta");
    shape_ = encoder::parse_shape(cfg, ctx, encoder::presets(50265, "roberta-base", "roberta-large"), "roberta");
    const std::string path = smp::sdk::model_get<std::string>(cfg, "data", "/usr/share/common-licenses");
    const auto tokenizer = smp::sdk::model_tokenizer(cfg);
    encoder::SentenceCorpus corpus(path, smp::sdk::model_get<double>(cfg, "val_fraction", 0.1), tokenizer.get());
    encoder::fit_vocab(shape_, cfg, corpus.vocab());
    data_ = std::make_unique<encoder::PackedData>(corpus, shape_.seq_len, shape_.mask_prob, ctx.seed);
    smp::sdk::log(SMP_LOG_INFO, "roberta",
                  corpus.describe(path) + "; " + std::to_string(data_->sequences(false)) + " train / " +
                      std::to_string(data_->sequences(true)) + " validation sequences of up to " +
                      std::to_string(shape_.seq_len) + " tokens");
  }

  void describe(smp::sdk::GraphBuilder& g) override {
    encoder::EncoderValues enc = encoder::describe_encoder(g, shape_, /*segments=*/false, /*weighted=*/false);
    g.loss_sum(enc.mlm_sum, enc.mlm_count);
    g.metric("mlm_loss", enc.mlm_sum, enc.mlm_count);
  }

  std::vector<at::Tensor> batch(const smp::sdk::BatchRequest& r) override {
    const bool val = r.split == SMP_SPLIT_VALIDATION;
    const int64_t n = r.num_samples, s = shape_.seq_len;
    at::Tensor tokens = at::empty({n, s}, at::kLong), targets = at::empty({n, s}, at::kLong);
    std::vector<int64_t> tok, tgt;
    for (int64_t i = 0; i < n; ++i) {
      data_->sample(val, r.step * r.global_batch + r.first_sample + i, tok, tgt);
      std::copy(tok.begin(), tok.end(), tokens[i].data_ptr<int64_t>());
      std::copy(tgt.begin(), tgt.end(), targets[i].data_ptr<int64_t>());
    }
    const at::Tensor pad = tokens.ne(data_->vocab().pad()).to(at::kLong);
    return {encoder::sequence_share(tokens, r), encoder::sequence_share(pad, r), encoder::sequence_share(targets, r)};
  }

 private:
  encoder::EncoderShape shape_;
  std::unique_ptr<encoder::PackedData> data_;
};

}  // namespace roberta

SMP_PLUGIN(smp::sdk::PluginBuilder("roberta", "0.1.0").adapter<roberta::RobertaAdapter>("roberta"))
