#include "checkpoint_llama.h"

#include <smp/error.h>
#include <smp/sdk/hf_llama.hpp>

#include <cmath>
#include <regex>

namespace smp::llama {

namespace {

// Per block: smp's local name -> Hugging Face's, under "model.layers.N.".
struct Same {
  const char* smp;
  const char* hf;
};
const Same kBlock[] = {{"ln1.weight", "input_layernorm.weight"},
                       {"attn.q.weight", "self_attn.q_proj.weight"},
                       {"attn.k.weight", "self_attn.k_proj.weight"},
                       {"attn.v.weight", "self_attn.v_proj.weight"},
                       {"attn.out.weight", "self_attn.o_proj.weight"},
                       {"ln2.weight", "post_attention_layernorm.weight"},
                       {"mlp.gate.weight", "mlp.gate_proj.weight"},
                       {"mlp.up.weight", "mlp.up_proj.weight"},
                       {"mlp.down.weight", "mlp.down_proj.weight"}};
const Same kTop[] = {{"wte.weight", "model.embed_tokens.weight"},
                     {"norm_f.weight", "model.norm.weight"},
                     {"lm_head.weight", "lm_head.weight"}};

bool vocab_rows(const std::string& smp_name) { return smp_name == "wte.weight" || smp_name == "lm_head.weight"; }

std::string dims(const at::Tensor& t) {
  std::string s;
  for (int64_t d : t.sizes()) s += (s.empty() ? "" : ", ") + std::to_string(d);
  return "[" + s + "]";
}

}  // namespace

Shape shape_of_manifest(const nlohmann::json& manifest) {
  Shape s;
  const nlohmann::json& graph = manifest.value("graph", nlohmann::json::array());
  bool llama_blocks = false;
  for (const auto& n : graph) {
    const std::string name = n.value("name", ""), kind = n.value("kind", "");
    const nlohmann::json& c = n.contains("config") ? n["config"] : nlohmann::json::object();
    if (kind == "transformer_layer") {
      if (c.value("norm_type", "") != "rms_norm" || c.value("mlp", "") != "swiglu" || c.value("bias", true))
        throw Error("node '" + name + "' is not a Llama block (rms_norm, swiglu, no bias): export it with --format gpt2 "
                    "or smp");
      llama_blocks = true;
      ++s.layers;
      s.hidden = c.at("hidden").get<int64_t>();
      s.heads = c.at("heads").get<int64_t>();
      s.kv_heads = c.value("kv_heads", s.heads);
      s.ffn = c.at("ffn").get<int64_t>();
      s.rope_theta = c.value("rope_base", 0.0);
      s.eps = c.value("eps", 1e-5);
    } else if (kind == "cross_entropy") {
      s.padded_vocab = c.at("vocab").get<int64_t>();
      s.vocab = c.value("real_vocab", s.padded_vocab);
    } else if (kind == "moe_layer" || kind.find("moe") != std::string::npos) {
      throw Error("node '" + name + "' (" + kind + ") is a mixture of experts: LlamaForCausalLM has none");
    }
  }
  if (!llama_blocks) throw Error("the checkpoint's graph has no Llama blocks (adapter gpt with model.arch = \"llama\")");
  if (s.rope_theta <= 0) throw Error("the checkpoint's blocks have no rotary positions (rope_base): not a Llama");
  if (s.padded_vocab <= 0) throw Error("the checkpoint's graph has no cross_entropy node to read the vocabulary from");
  s.tied = !manifest.at("tensors").contains("model/lm_head.weight");
  const nlohmann::json& model = manifest.value("model", nlohmann::json::object());
  if (model.is_object() && model.contains("seq_len") && model["seq_len"].is_number_integer())
    s.seq_len = model["seq_len"].get<int64_t>();
  return s;
}

Tensors to_hf(const Tensors& smp, const Shape& shape) {
  Tensors out;
  static const std::regex block("blocks\\.([0-9]+)\\.(.+)");
  for (const auto& [name, t] : smp) {
    bool placed = false;
    for (const Same& s : kTop)
      if (name == s.smp) {
        if (vocab_rows(name) && t.size(0) < shape.vocab)
          throw Error("parameter '" + name + "' " + dims(t) + " has fewer rows than the vocabulary's " +
                      std::to_string(shape.vocab));
        out[s.hf] = vocab_rows(name) ? t.narrow(0, 0, shape.vocab).contiguous() : t;
        placed = true;
      }
    std::smatch m;
    if (!placed && std::regex_match(name, m, block))
      for (const Same& s : kBlock)
        if (m[2].str() == s.smp) {
          out["model.layers." + m[1].str() + "." + s.hf] = t;
          placed = true;
        }
    if (!placed) throw Error("parameter '" + name + "' has no place in LlamaForCausalLM's layout");
  }
  return out;
}

Tensors from_hf(const Tensors& hf, const Shape& shape) {
  Tensors out;
  static const std::regex block("model\\.layers\\.([0-9]+)\\.(.+)");
  for (const auto& [name, t] : hf) {
    bool placed = false;
    for (const Same& s : kTop)
      if (name == s.hf) {
        if (shape.tied && std::string(s.smp) == "lm_head.weight") {
          placed = true;  // the embedding's copy: transformers writes it for tied models too
          continue;
        }
        if (vocab_rows(s.smp) && t.size(0) != shape.vocab)
          throw Error("tensor '" + name + "' " + dims(t) + ": config.json's vocab_size is " + std::to_string(shape.vocab));
        out[s.smp] = vocab_rows(s.smp) && shape.padded_vocab > shape.vocab
                         ? at::cat({t, at::zeros({shape.padded_vocab - shape.vocab, t.size(1)}, t.options())}, 0)
                         : t;
        placed = true;
      }
    std::smatch m;
    if (!placed && std::regex_match(name, m, block)) {
      if (std::stoll(m[1].str()) >= shape.layers)
        throw Error("tensor '" + name + "': config.json has " + std::to_string(shape.layers) + " layers");
      for (const Same& s : kBlock)
        if (m[2].str() == s.hf) {
          out["blocks." + m[1].str() + "." + s.smp] = t;
          placed = true;
        }
      if (m[2].str() == "self_attn.rotary_emb.inv_freq") placed = true;  // a buffer older transformers saved
    }
    if (!placed) throw Error("tensor '" + name + "' is not one of LlamaForCausalLM's");
  }
  const size_t expected = 2 + (shape.tied ? 0 : 1) + 9 * static_cast<size_t>(shape.layers);
  if (out.size() != expected) {
    std::string missing;
    auto want = [&](const std::string& n) {
      if (!out.count(n)) missing += (missing.empty() ? "" : ", ") + n;
    };
    for (const Same& s : kTop)
      if (!(shape.tied && std::string(s.smp) == "lm_head.weight")) want(s.smp);
    for (int64_t i = 0; i < shape.layers; ++i)
      for (const Same& s : kBlock) want("blocks." + std::to_string(i) + "." + s.smp);
    throw Error("the files lack " + std::to_string(expected - out.size()) + " of LlamaForCausalLM's tensors (" +
                missing + ")");
  }
  return out;
}

nlohmann::json config_json(const Shape& s, const std::string& torch_dtype) {
  return {{"architectures", {"LlamaForCausalLM"}},
          {"model_type", "llama"},
          {"hidden_size", s.hidden},
          {"intermediate_size", s.ffn},
          {"num_hidden_layers", s.layers},
          {"num_attention_heads", s.heads},
          {"num_key_value_heads", s.kv_heads},
          {"head_dim", s.hidden / s.heads},
          {"hidden_act", "silu"},
          {"max_position_embeddings", s.seq_len},
          {"rms_norm_eps", s.eps},
          {"rope_theta", s.rope_theta},
          {"rope_scaling", nullptr},
          {"attention_bias", false},
          {"attention_dropout", 0.0},
          {"mlp_bias", false},
          {"tie_word_embeddings", s.tied},
          {"vocab_size", s.vocab},
          {"initializer_range", 0.02},
          {"torch_dtype", torch_dtype},
          {"use_cache", true}};
}

Shape shape_of_config(const nlohmann::json& c, const std::string& where) {
  const nlohmann::json keys = smp::sdk::hf_llama_model_keys(c, where);
  Shape s;
  s.layers = keys["layers"].get<int64_t>();
  s.hidden = keys["hidden"].get<int64_t>();
  s.heads = keys["heads"].get<int64_t>();
  s.kv_heads = keys["kv_heads"].get<int64_t>();
  s.ffn = keys["ffn"].get<int64_t>();
  s.vocab = s.padded_vocab = keys["vocab"].get<int64_t>();
  s.seq_len = keys.value("seq_len", int64_t{0});
  s.rope_theta = keys["rope_base"].get<double>();
  s.eps = keys["norm_eps"].get<double>();
  s.tied = keys["tie_embeddings"].get<bool>();
  return s;
}

}  // namespace smp::llama
