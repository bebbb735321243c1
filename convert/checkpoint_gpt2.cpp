#include "checkpoint_gpt2.h"

#include <smp/error.h>

#include <regex>

namespace smp::gpt2 {

namespace {

const char* const kPrefix = "transformer.";

// Per block: smp's local name -> GPT-2's, and whether the weight is a Conv1D ([in, out]).
struct Same {
  const char* smp;
  const char* gpt2;
  bool transpose;
};
const Same kBlock[] = {{"ln1.weight", "ln_1.weight", false},         {"ln1.bias", "ln_1.bias", false},
                       {"attn.out.weight", "attn.c_proj.weight", true}, {"attn.out.bias", "attn.c_proj.bias", false},
                       {"ln2.weight", "ln_2.weight", false},         {"ln2.bias", "ln_2.bias", false},
                       {"mlp.fc.weight", "mlp.c_fc.weight", true},   {"mlp.fc.bias", "mlp.c_fc.bias", false},
                       {"mlp.proj.weight", "mlp.c_proj.weight", true}, {"mlp.proj.bias", "mlp.c_proj.bias", false}};
const Same kTop[] = {{"wte.weight", "wte.weight", false},
                     {"wpe.weight", "wpe.weight", false},
                     {"ln_f.weight", "ln_f.weight", false},
                     {"ln_f.bias", "ln_f.bias", false}};

const at::Tensor& need(const Tensors& t, const std::string& name) {
  auto it = t.find(name);
  if (it == t.end()) throw Error("gpt2: no tensor '" + name + "'");
  return it->second;
}

}  // namespace

Tensors to_gpt2(const Tensors& smp) {
  Tensors out;
  static const std::regex block("blocks\\.([0-9]+)\\.(.+)");
  for (const auto& [name, t] : smp) {
    std::smatch m;
    bool placed = false;
    for (const Same& s : kTop)
      if (name == s.smp) {
        out[std::string(kPrefix) + s.gpt2] = t;
        placed = true;
      }
    if (!placed && std::regex_match(name, m, block)) {
      const std::string i = m[1].str(), local = m[2].str(), h = std::string(kPrefix) + "h." + i + ".";
      for (const Same& s : kBlock)
        if (local == s.smp) {
          out[h + s.gpt2] = s.transpose ? t.t().contiguous() : t;
          placed = true;
        }
      if (local == "attn.q.weight") {
        const std::string p = "blocks." + i + ".attn.";
        out[h + "attn.c_attn.weight"] =
            at::cat({t, need(smp, p + "k.weight"), need(smp, p + "v.weight")}, 0).t().contiguous();
        placed = true;
      } else if (local == "attn.q.bias") {
        const std::string p = "blocks." + i + ".attn.";
        out[h + "attn.c_attn.bias"] = at::cat({t, need(smp, p + "k.bias"), need(smp, p + "v.bias")}, 0);
        placed = true;
      } else if (local == "attn.k.weight" || local == "attn.v.weight" || local == "attn.k.bias" ||
                 local == "attn.v.bias") {
        placed = true;  // in c_attn
      }
    }
    if (!placed) throw Error("gpt2: parameter '" + name + "' has no place in GPT-2's layout");
  }
  return out;
}

Tensors from_gpt2(const Tensors& gpt2) {
  Tensors in;  // without the prefix
  for (const auto& [name, t] : gpt2) {
    if (name == "lm_head.weight") continue;  // tied to wte
    in[name.rfind(kPrefix, 0) == 0 ? name.substr(std::string(kPrefix).size()) : name] = t;
  }
  Tensors out;
  static const std::regex block("h\\.([0-9]+)\\.(.+)");
  for (const auto& [name, t] : in) {
    std::smatch m;
    bool placed = false;
    for (const Same& s : kTop)
      if (name == s.gpt2) {
        out[s.smp] = t;
        placed = true;
      }
    if (!placed && std::regex_match(name, m, block)) {
      const std::string p = "blocks." + m[1].str() + ".", local = m[2].str();
      for (const Same& s : kBlock)
        if (local == s.gpt2) {
          out[p + s.smp] = s.transpose ? t.t().contiguous() : t;
          placed = true;
        }
      if (local == "attn.c_attn.weight" || local == "attn.c_attn.bias") {
        const at::Tensor w = local == "attn.c_attn.weight" ? t.t() : t;  // [3h, in] or [3h]
        const auto parts = w.chunk(3, 0);
        const std::string what = local == "attn.c_attn.weight" ? "weight" : "bias";
        out[p + "attn.q." + what] = parts[0].contiguous();
        out[p + "attn.k." + what] = parts[1].contiguous();
        out[p + "attn.v." + what] = parts[2].contiguous();
        placed = true;
      }
      if (local == "attn.bias" || local == "attn.masked_bias") placed = true;  // transformers' causal-mask buffers
    }
    if (!placed) throw Error("gpt2: tensor '" + name + "' is not one of GPT-2's");
  }
  return out;
}

nlohmann::json config_json(const Tensors& gpt2, const nlohmann::json& graph) {
  const at::Tensor& wte = need(gpt2, std::string(kPrefix) + "wte.weight");
  const at::Tensor& wpe = need(gpt2, std::string(kPrefix) + "wpe.weight");
  int64_t layers = 0, heads = 0, ffn = 0;
  double eps = 1e-5;
  for (const auto& n : graph) {
    const auto& c = n["config"];
    if (c.is_object() && c.contains("heads") && c.contains("hidden")) {
      ++layers;
      heads = c["heads"].get<int64_t>();
      ffn = c.value("ffn", 4 * wte.size(1));
      eps = c.value("eps", eps);
    }
  }
  if (layers == 0) throw Error("gpt2: the checkpoint's graph has no transformer layers");
  return {{"architectures", {"GPT2LMHeadModel"}},
          {"model_type", "gpt2"},
          {"vocab_size", wte.size(0)},
          {"n_positions", wpe.size(0)},
          {"n_ctx", wpe.size(0)},
          {"n_embd", wte.size(1)},
          {"n_layer", layers},
          {"n_head", heads},
          {"n_inner", ffn},
          {"activation_function", "gelu_new"},
          {"layer_norm_epsilon", eps},
          {"resid_pdrop", 0.0},
          {"embd_pdrop", 0.0},
          {"attn_pdrop", 0.0},
          {"tie_word_embeddings", true},
          {"torch_dtype", "float32"}};
}

}  // namespace smp::gpt2
