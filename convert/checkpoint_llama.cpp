#include "checkpoint_llama.h"

#include <smp/error.h>
#include <smp/data/hf_llama.hpp>

#include <cmath>
#include <iterator>
#include <regex>
#include <vector>

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
// The moe adapter's layers (norm, attention, experts as nodes of their own).
const Same kMoeBlock[] = {{"ln1.weight", "input_layernorm.weight"},
                          {"attn.q.weight", "self_attn.q_proj.weight"},
                          {"attn.k.weight", "self_attn.k_proj.weight"},
                          {"attn.v.weight", "self_attn.v_proj.weight"},
                          {"attn.out.weight", "self_attn.o_proj.weight"},
                          {"ln2.weight", "post_attention_layernorm.weight"},
                          {"moe.router.weight", "block_sparse_moe.gate.weight"}};
// smp's stacked experts [E, f, h] / [E, h, f] -> Mixtral's per expert: w1 the
// gate, w3 the up projection, w2 the down one.
struct Expert {
  const char* smp;
  const char* hf;
};
const Expert kExperts[] = {{"moe.experts.gate", "w1.weight"}, {"moe.experts.up", "w3.weight"},
                           {"moe.experts.down", "w2.weight"}};
const Same kTop[] = {{"wte.weight", "model.embed_tokens.weight"},
                     {"norm_f.weight", "model.norm.weight"},
                     {"lm_head.weight", "lm_head.weight"}};

// A layer's one-to-one names: a Llama block's, or a Mixtral layer's (its experts apart).
std::vector<Same> block_names(const Shape& shape) {
  if (shape.experts > 0) return {std::begin(kMoeBlock), std::end(kMoeBlock)};
  return {std::begin(kBlock), std::end(kBlock)};
}

bool vocab_rows(const std::string& smp_name) { return smp_name == "wte.weight" || smp_name == "lm_head.weight"; }

std::string dims(const at::Tensor& t) {
  std::string s;
  for (int64_t d : t.sizes()) s += (s.empty() ? "" : ", ") + std::to_string(d);
  return "[" + s + "]";
}

// "12" -> 12 where it is how transformers writes a count below `limit`
// (decimal, no sign, no leading zero); else -1.
int64_t index_below(const std::string& digits, int64_t limit) {
  if (digits.empty() || digits.size() > 9 || (digits.size() > 1 && digits[0] == '0')) return -1;
  int64_t v = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return -1;
    v = v * 10 + (c - '0');
  }
  return v < limit ? v : -1;
}

}  // namespace

std::optional<std::vector<int64_t>> hf_shape_of(const std::string& name, const Shape& s) {
  using Dims = std::vector<int64_t>;
  const int64_t hd = s.hidden / s.heads, q = s.heads * hd, kv = s.kv_heads * hd;
  if (name == "model.embed_tokens.weight" || name == "lm_head.weight") return Dims{s.vocab, s.hidden};
  if (name == "model.norm.weight") return Dims{s.hidden};
  static const std::string prefix = "model.layers.";
  if (name.compare(0, prefix.size(), prefix) != 0) return std::nullopt;
  const size_t dot = name.find('.', prefix.size());
  if (dot == std::string::npos || index_below(name.substr(prefix.size(), dot - prefix.size()), s.layers) < 0)
    return std::nullopt;
  const std::string local = name.substr(dot + 1);
  const std::map<std::string, Dims> common = {{"input_layernorm.weight", {s.hidden}},
                                              {"post_attention_layernorm.weight", {s.hidden}},
                                              {"self_attn.q_proj.weight", {q, s.hidden}},
                                              {"self_attn.k_proj.weight", {kv, s.hidden}},
                                              {"self_attn.v_proj.weight", {kv, s.hidden}},
                                              {"self_attn.o_proj.weight", {s.hidden, q}},
                                              {"self_attn.rotary_emb.inv_freq", {hd / 2}}};
  if (auto it = common.find(local); it != common.end()) return it->second;
  if (s.experts == 0) {
    const std::map<std::string, Dims> mlp = {{"mlp.gate_proj.weight", {s.ffn, s.hidden}},
                                             {"mlp.up_proj.weight", {s.ffn, s.hidden}},
                                             {"mlp.down_proj.weight", {s.hidden, s.ffn}}};
    if (auto it = mlp.find(local); it != mlp.end()) return it->second;
    return std::nullopt;
  }
  if (local == "block_sparse_moe.gate.weight") return Dims{s.experts, s.hidden};
  static const std::string experts = "block_sparse_moe.experts.";
  if (local.compare(0, experts.size(), experts) != 0) return std::nullopt;
  const size_t edot = local.find('.', experts.size());
  if (edot == std::string::npos || index_below(local.substr(experts.size(), edot - experts.size()), s.experts) < 0)
    return std::nullopt;
  const std::string w = local.substr(edot + 1);
  if (w == "w1.weight" || w == "w3.weight") return Dims{s.ffn, s.hidden};
  if (w == "w2.weight") return Dims{s.hidden, s.ffn};
  return std::nullopt;
}

bool hf_required(const std::string& name, const Shape& s) {
  if (name == "lm_head.weight") return !s.tied;
  const std::string buffer = ".self_attn.rotary_emb.inv_freq";
  return !(name.size() > buffer.size() && name.compare(name.size() - buffer.size(), buffer.size(), buffer) == 0);
}

int64_t hf_required_count(const Shape& s) {
  const int64_t per_layer = s.experts > 0 ? 7 + 3 * s.experts : 9;
  return 2 + (s.tied ? 0 : 1) + per_layer * s.layers;
}

std::vector<std::string> hf_missing(const std::set<std::string>& present, const Shape& s, size_t most) {
  std::vector<std::string> missing;
  auto want = [&](const std::string& n) {
    if (missing.size() < most && !present.count(n)) missing.push_back(n);
  };
  want("model.embed_tokens.weight");
  want("model.norm.weight");
  if (!s.tied) want("lm_head.weight");
  for (int64_t i = 0; i < s.layers && missing.size() < most; ++i) {
    const std::string layer = "model.layers." + std::to_string(i) + ".";
    for (const Same& b : block_names(s)) want(layer + b.hf);
    for (int64_t x = 0; x < s.experts && missing.size() < most; ++x)
      for (const char* w : {"w1.weight", "w2.weight", "w3.weight"})
        want(layer + "block_sparse_moe.experts." + std::to_string(x) + "." + w);
  }
  return missing;
}

nlohmann::json llama_config_json(const Shape& s, const std::string& torch_dtype);

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
    } else if (kind == "attention") {  // the moe adapter's layers: attention, then experts
      if (c.value("bias", true)) throw Error("node '" + name + "' has biases: Mixtral's attention has none");
      s.hidden = c.at("hidden").get<int64_t>();
      s.heads = c.at("heads").get<int64_t>();
      s.kv_heads = c.value("kv_heads", s.heads);
      s.rope_theta = c.value("rope_base", 0.0);
    } else if (kind == "rms_norm") {
      s.eps = c.value("eps", 1e-5);
    } else if (kind == "moe") {
      if (c.value("shared_experts", int64_t{0}) > 0)
        throw Error("node '" + name + "' has shared experts: MixtralForCausalLM cannot express them");
      if (c.value("router", std::string("topk_softmax")) != "topk_softmax")
        throw Error("node '" + name + "' routes \"" + c.value("router", std::string()) +
                    "\" (top-k of the softmax, not renormalised): Mixtral renormalises the top k (\"topk_softmax\")");
      if (c.value("capacity_factor", 0.0) > 0)
        throw Error("node '" + name + "' drops tokens past capacity_factor " + c["capacity_factor"].dump() +
                    ": Mixtral is dropless");
      if (c.value("mlp", std::string("swiglu")) != "swiglu")
        throw Error("node '" + name + "' has " + c["mlp"].dump() + " experts: Mixtral's are SwiGLU");
      ++s.layers;
      s.experts = c.at("experts").get<int64_t>();
      s.top_k = c.at("top_k").get<int64_t>();
      s.ffn = c.at("ffn").get<int64_t>();
    }
  }
  if (s.experts > 0 && llama_blocks)
    throw Error("the checkpoint has dense layers beside its mixture-of-experts layers: Mixtral's are all MoE");
  const std::string what = s.experts > 0 ? "Mixtral" : "Llama";
  if (s.experts == 0 && !llama_blocks)
    throw Error("the checkpoint's graph has no Llama blocks (adapter gpt with model.arch = \"llama\")");
  if (s.rope_theta <= 0)
    throw Error("the checkpoint's " + std::string(s.experts > 0 ? "attention has" : "blocks have") +
                " no rotary positions (rope_base): not a " + what);
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
    if (!placed && std::regex_match(name, m, block)) {
      if (index_below(m[1].str(), shape.layers) < 0)
        throw Error("parameter '" + name + "': the checkpoint's graph has " + std::to_string(shape.layers) + " layers");
      const std::string layer = "model.layers." + m[1].str() + ".", local = m[2].str();
      for (const Same& s : block_names(shape))
        if (local == s.smp) {
          out[layer + s.hf] = t;
          placed = true;
        }
      // Mixtral: the experts' stacked [E, ...] tensors, one tensor per expert.
      for (const Expert& e : kExperts)
        if (shape.experts > 0 && local == e.smp) {
          for (int64_t x = 0; x < t.size(0); ++x)
            out[layer + "block_sparse_moe.experts." + std::to_string(x) + "." + e.hf] = t[x].contiguous();
          placed = true;
        }
    }
    if (!placed)
      throw Error("parameter '" + name + "' has no place in " +
                  (shape.experts > 0 ? "MixtralForCausalLM's" : "LlamaForCausalLM's") + " layout");
  }
  return out;
}

Tensors from_hf(const Tensors& hf, const Shape& shape) {
  Tensors out;
  std::map<std::string, std::map<int64_t, at::Tensor>> experts;  // Mixtral: stacked after the loop
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
      if (index_below(m[1].str(), shape.layers) < 0)
        throw Error("tensor '" + name + "': config.json has " + std::to_string(shape.layers) + " layers");
      for (const Same& s : block_names(shape))
        if (m[2].str() == s.hf) {
          out["blocks." + m[1].str() + "." + s.smp] = t;
          placed = true;
        }
      static const std::regex expert("block_sparse_moe\\.experts\\.([0-9]+)\\.(w[123]\\.weight)");
      std::smatch e;
      const std::string local = m[2].str();
      if (shape.experts > 0 && std::regex_match(local, e, expert)) {
        const int64_t x = index_below(e[1].str(), shape.experts);
        if (x < 0)
          throw Error("tensor '" + name + "': config.json has " + std::to_string(shape.experts) + " experts");
        for (const Expert& k : kExperts)
          if (e[2].str() == k.hf) experts["blocks." + m[1].str() + "." + k.smp][x] = t;
        placed = true;
      }
      if (m[2].str() == "self_attn.rotary_emb.inv_freq") placed = true;  // a buffer older transformers saved
    }
    if (!placed) throw Error("tensor '" + name + "' is not one of LlamaForCausalLM's");
  }
  for (auto& [smp_name, by_expert] : experts) {
    if (static_cast<int64_t>(by_expert.size()) != shape.experts)
      throw Error("the files hold " + std::to_string(by_expert.size()) + " of the " + std::to_string(shape.experts) +
                  " experts of '" + smp_name + "'");
    std::vector<at::Tensor> stack;
    for (auto& [x, t] : by_expert) stack.push_back(t);
    out[smp_name] = at::stack(stack);
  }
  const size_t per_layer = shape.experts > 0 ? std::size(kMoeBlock) + std::size(kExperts) : std::size(kBlock);
  const size_t expected = 2 + (shape.tied ? 0 : 1) + per_layer * static_cast<size_t>(shape.layers);
  if (out.size() != expected) {
    std::set<std::string> present;
    for (const auto& [name, t] : hf) present.insert(name);
    std::string missing;
    for (const auto& n : hf_missing(present, shape, 8)) missing += (missing.empty() ? "" : ", ") + n;
    throw Error("the files lack " + std::to_string(expected - out.size()) + " of " +
                (shape.experts > 0 ? "MixtralForCausalLM's" : "LlamaForCausalLM's") + " tensors (" + missing +
                (expected - out.size() > 8 ? ", ..." : "") + ")");
  }
  return out;
}

nlohmann::json config_json(const Shape& s, const std::string& torch_dtype) {
  nlohmann::json c = llama_config_json(s, torch_dtype);
  if (s.experts == 0) return c;
  c["architectures"] = {"MixtralForCausalLM"};
  c["model_type"] = "mixtral";
  c["num_local_experts"] = s.experts;
  c["num_experts_per_tok"] = s.top_k;
  c["sliding_window"] = nullptr;
  c["output_router_logits"] = false;
  c["router_aux_loss_coef"] = 0.0;
  for (const char* k : {"pretraining_tp", "mlp_bias", "attention_bias", "head_dim"}) c.erase(k);
  return c;
}

nlohmann::json llama_config_json(const Shape& s, const std::string& torch_dtype) {
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

Shape shape_of_mixtral_config(const nlohmann::json& c, const std::string& where) {
  const nlohmann::json keys = smp::sdk::hf_mixtral_model_keys(c, where);
  Shape s;
  s.layers = keys["layers"].get<int64_t>();
  s.hidden = keys["hidden"].get<int64_t>();
  s.heads = keys["heads"].get<int64_t>();
  s.kv_heads = keys["kv_heads"].get<int64_t>();
  s.ffn = keys["expert_ffn"].get<int64_t>();
  s.experts = keys["experts"].get<int64_t>();
  s.top_k = keys["top_k"].get<int64_t>();
  s.vocab = s.padded_vocab = keys["vocab"].get<int64_t>();
  s.seq_len = keys.value("seq_len", int64_t{0});
  s.rope_theta = keys["rope_base"].get<double>();
  return s;
}

}  // namespace smp::llama
