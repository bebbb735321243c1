// The encoder both BERT and RoBERTa describe (Devlin et al. 2019): token and
// learned position embeddings (and, for BERT, segment embeddings), summed and
// layer-normed; post-LN bidirectional transformer layers with a padding mask;
// the masked-LM head (dense, GELU, layer norm, a decoder tied to the token
// embedding with its own bias). Layers come from smp_nn / smp_tp.
#pragma once

#include "corpus.h"

#include <smp/sdk/adapter.hpp>

#include <map>
#include <string>

namespace encoder {

struct EncoderShape {
  int64_t layers = 0, hidden = 0, heads = 0, seq_len = 0, vocab = 0;
  int64_t ffn = 0;           // default 4 x hidden
  int64_t padded_vocab = 0;  // vocab padded to model.vocab_multiple x tp (fit_vocab)
  int64_t vocab_multiple = 128;
  std::string adapter;       // names the plugin in the log
  double dropout = 0.1;      // BERT's hidden and attention-probability dropout
  double mask_prob = 0.15;   // the share of real tokens the masked LM predicts
  int tp = 1;                // the job's tensor parallelism (tables are padded to split)
};

// Refuses a [model] key other than the shape's (below), "data",
// "val_fraction" and the tokenizer's, naming the key and the known ones (the SDK's check).
void expect_model_keys(const smp::sdk::Json& cfg, const std::string& adapter);

// Reads the shape from [model]: preset (default "tiny"), then the single keys.
// Errors name the key; `adapter` names the plugin in the log.
EncoderShape parse_shape(const smp::sdk::Json& cfg, const smp::sdk::AdapterContext& ctx,
                         const std::map<std::string, EncoderShape>& presets, const std::string& adapter);

// Sets the vocabulary once the data is read: model.vocab when given (at least
// the data's ids and the four special tokens, else an error), else the larger
// of the preset's and that; then pads it to model.vocab_multiple x tp.
void fit_vocab(EncoderShape& s, const smp::sdk::Json& cfg, const Vocab& data);

// The graph's inputs, in this order (the adapter's batch() returns them so):
//   tokens [b, s] int64, segments [b, s] int64 (with_segments), pad_mask [b, s]
//   int64 (1 = a real token), mlm_targets [b, s] int64 (-100 = not predicted),
//   mlm_weights [b, s] float (weighted_mlm: each predicted token's weight).
// Declares them, the nodes up to the MLM loss, the throughput unit (tokens),
// the FLOPs per sample and that batch() cuts the sequences (dim 1) under
// parallel.cp (batch() returns sequence_share of each); returns the value names.
// Under cp the seq_len must cut into 2 cp chunks (parse_shape checks) and
// dropout must be 0 (the cp rules refuse it).
struct EncoderValues {
  std::string hidden;              // the last layer's output [b, s, h]
  std::string mlm_sum, mlm_count;  // the MLM loss's (weighted) sum and count
};
EncoderValues describe_encoder(smp::sdk::GraphBuilder& g, const EncoderShape& s, bool with_segments,
                               bool weighted_mlm);

// The shared presets: "tiny" and "small" for CPU runs (byte vocabulary), and the
// published sizes with the given vocabulary (for planning and dry runs).
// This rank's share of a [b, s] input under parallel.cp (the input itself otherwise).
inline at::Tensor sequence_share(const at::Tensor& t, const smp::sdk::BatchRequest& r) {
  return smp::sdk::sequence_share_of(t, 1, r.sequence, "parallel.cp");
}

std::map<std::string, EncoderShape> presets(int64_t published_vocab, const std::string& base_name,
                                            const std::string& large_name);

}  // namespace encoder
