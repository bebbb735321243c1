// Hugging Face's Llama layout (transformers' LlamaForCausalLM) for smp's `gpt`
// adapter with model.arch = "llama", and Mixtral's (MixtralForCausalLM) for
// the `moe` adapter when every layer is a mixture of experts with Mixtral's
// router and nothing Mixtral lacks. Only the names differ: both keep
// nn.Linear's [out, in] weights and rotate q and k by halves (GPT-NeoX's
// layout, plugins/nn ops.hpp rotary), so no tensor is permuted or transposed.
// The vocabulary: smp pads the embedding and head to a multiple of its
// padding; Hugging Face's files hold the model's vocab_size rows.
#pragma once

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <map>
#include <optional>
#include <set>
#include <vector>
#include <string>

namespace smp::llama {

// parameter name -> whole tensor
using Tensors = std::map<std::string, at::Tensor>;

// What config.json says and smp's model needs.
struct Shape {
  int64_t layers = 0, hidden = 0, heads = 0, kv_heads = 0, ffn = 0;
  int64_t vocab = 0;         // the model's (config.json's vocab_size)
  int64_t padded_vocab = 0;  // rows smp holds (>= vocab)
  int64_t seq_len = 0;       // max_position_embeddings
  double rope_theta = 10000.0, eps = 1e-5;
  bool tied = false;  // the head is the embedding
  // Mixtral (MixtralForCausalLM, the moe adapter): experts per layer, > 0;
  // ffn is then each expert's.
  int64_t experts = 0, top_k = 0;
};

// The shape of a checkpoint of the gpt adapter with arch "llama", or of the
// moe adapter, from its manifest (its "graph" and "model"). Throws naming what
// is not a Llama, or what Mixtral cannot express (shared experts, dense
// layers, a router other than softmax-then-top-k renormalised, dropping
// tokens at a capacity, biases).
Shape shape_of_manifest(const nlohmann::json& manifest);

// smp's names ("wte.weight", "blocks.0.attn.q.weight", ...) to Hugging
// Face's ("model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
// ...), the padded vocabulary rows cut off. Throws naming a parameter that has
// no place in LlamaForCausalLM.
Tensors to_hf(const Tensors& smp, const Shape& shape);
// Back, the vocabulary padded with zero rows to shape.padded_vocab. Throws
// naming a tensor that is not one of LlamaForCausalLM's or a missing one.
Tensors from_hf(const Tensors& hf, const Shape& shape);

// The shape tensor `name` has in LlamaForCausalLM (MixtralForCausalLM with
// experts) of `shape`, or an empty optional where the name is not one of its
// tensors. Layer and expert numbers must be written as transformers writes
// them (decimal, no leading zero) and below the config's counts.
std::optional<std::vector<int64_t>> hf_shape_of(const std::string& name, const Shape& shape);
// Whether a Hugging Face folder of `shape` must hold `name` (the tied head's
// lm_head.weight and the old rotary inv_freq buffers may be left out).
bool hf_required(const std::string& name, const Shape& shape);
// How many tensors a folder of `shape` must hold, and the first `most` of
// those missing from `present` (for a message that stays short).
int64_t hf_required_count(const Shape& shape);
std::vector<std::string> hf_missing(const std::set<std::string>& present, const Shape& shape, size_t most);

// config.json of LlamaForCausalLM (MixtralForCausalLM with experts) for
// `shape`; torch_dtype "float32" or "bfloat16".
nlohmann::json config_json(const Shape& shape, const std::string& torch_dtype);
// The shape config.json describes (smp/data/hf_llama.hpp's checks: what smp's
// Llama cannot represent is refused naming the key, starting with `where`).
// padded_vocab = vocab.
Shape shape_of_config(const nlohmann::json& config, const std::string& where);
// The same for MixtralForCausalLM (model_type "mixtral").
Shape shape_of_mixtral_config(const nlohmann::json& config, const std::string& where);

}  // namespace smp::llama
