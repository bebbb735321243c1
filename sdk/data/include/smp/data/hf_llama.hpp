// Hugging Face's LlamaForCausalLM config.json as the gpt adapter's [model]
// keys: what `model.from_hf` reads and `smp-checkpoint import --format hf`
// checks. Refuses, naming the file and key, what smp's Llama cannot represent.
#pragma once

#include <smp/sdk/host.hpp>
#include <smp/sdk/input_file.hpp>

#include <nlohmann/json.hpp>

#include <cmath>
#include <string>

namespace smp::sdk {

// config.json's nesting bound: deeper than any real config.json (a
// quantization_config nests 3 levels), and shallow enough that the config kept
// in an imported checkpoint's manifest stays inside the manifest's own bound.
inline constexpr int kMaxHfConfigDepth = 32;

// config.json of a Hugging Face model folder (or the file itself), parsed under
// the reading discipline (smp/sdk/input_file.hpp): a regular file, bounded,
// nesting bounded, no key twice.
inline nlohmann::json read_hf_config(const std::string& path_or_folder) {
  std::string path = path_or_folder;
  if (path.size() < 5 || path.compare(path.size() - 5, 5, ".json") != 0)
    path += (path.empty() || path.back() == '/' ? "" : "/") + std::string("config.json");
  try {
    return input::parse_json(input::read_file(path, "config.json of a Hugging Face model", input::kMaxConfigBytes),
                             path, kMaxHfConfigDepth);
  } catch (const input::Error& e) {
    throw Error(e.what());
  }
}

// The largest counts smp takes from a config.json: far above any published
// model (Llama 3.1 405B: 126 layers, hidden 16384, vocabulary 128256;
// DeepSeek-V3: 256 experts), low enough that the tensors they imply can be
// listed and their sizes multiplied without overflow.
struct HfLimits {
  static constexpr int64_t layers = 1024, hidden = int64_t{1} << 20, ffn = int64_t{1} << 22,
                           vocab = int64_t{1} << 24, positions = int64_t{1} << 26, experts = 1024;
};

// The gpt adapter's [model] keys for the LlamaForCausalLM `c` describes:
// arch "llama", layers, hidden, heads, kv_heads, ffn, vocab, seq_len
// (max_position_embeddings, when given), rope_base, norm_eps, tie_embeddings.
// `where` (the file) starts every error. Refused: another model_type or
// architecture, hidden_act other than silu, rope_scaling, attention or MLP
// biases, sliding windows, pretraining_tp other than 1, a head_dim other than
// hidden_size / num_attention_heads, heads not a multiple of kv heads.
inline nlohmann::json hf_llama_model_keys(const nlohmann::json& c, const std::string& where) {
  auto fail = [&](const std::string& key, const std::string& why) {
    return Error(where + ": \"" + key + "\" " + why);
  };
  if (!c.is_object()) throw Error(where + ": not a JSON object");
  auto count = [&](const char* key, bool required, int64_t most) -> int64_t {
    if (!c.contains(key) || c[key].is_null()) {
      if (required) throw fail(key, "is missing");
      return 0;
    }
    if (!c[key].is_number_integer() || c[key].get<int64_t>() <= 0)
      throw fail(key, "is " + c[key].dump() + ", not a positive integer");
    if (c[key].get<int64_t>() > most)
      throw fail(key, "is " + c[key].dump() + ", more than smp reads (" + std::to_string(most) + ")");
    return c[key].get<int64_t>();
  };
  auto number = [&](const char* key, double fallback) -> double {
    if (!c.contains(key) || c[key].is_null()) return fallback;
    if (!c[key].is_number() || !(c[key].get<double>() > 0) || !std::isfinite(c[key].get<double>()))
      throw fail(key, "is " + c[key].dump() + ", not a positive number");
    return c[key].get<double>();
  };
  const std::string model_type = c.contains("model_type") && c["model_type"].is_string() ? c["model_type"].get<std::string>() : "";
  if (model_type != "llama")
    throw fail("model_type", "is \"" + model_type + "\": smp reads \"llama\" (LlamaForCausalLM) in this format");
  if (c.contains("architectures") && c["architectures"].is_array())
    for (const auto& a : c["architectures"])
      if (a != "LlamaForCausalLM") throw fail("architectures", "names " + a.dump() + ", not LlamaForCausalLM");
  const std::string act = c.contains("hidden_act") && c["hidden_act"].is_string() ? c["hidden_act"].get<std::string>() : "silu";
  if (act != "silu") throw fail("hidden_act", "is \"" + act + "\": smp's Llama MLP is SwiGLU (silu)");
  if (c.contains("rope_scaling") && !c["rope_scaling"].is_null())
    throw fail("rope_scaling", "is " + c["rope_scaling"].dump() +
                                   ": smp's rotary positions have no scaling (linear, dynamic, llama3, yarn, ...)");
  for (const char* key : {"attention_bias", "mlp_bias"})
    if (c.contains(key) && c[key] != false && !c[key].is_null())
      throw fail(key, "is " + c[key].dump() + ": smp's Llama has no biases");
  for (const char* key : {"sliding_window", "use_sliding_window"})
    if (c.contains(key) && !c[key].is_null() && c[key] != false)
      throw fail(key, "is " + c[key].dump() + ": smp's attention has no sliding window");
  if (c.contains("pretraining_tp") && !c["pretraining_tp"].is_null() && c["pretraining_tp"] != 1)
    throw fail("pretraining_tp", "is " + c["pretraining_tp"].dump() + ": only 1 (plain linear layers) is supported");
  using L = HfLimits;
  const int64_t layers = count("num_hidden_layers", true, L::layers), hidden = count("hidden_size", true, L::hidden),
                heads = count("num_attention_heads", true, L::hidden), ffn = count("intermediate_size", true, L::ffn),
                vocab = count("vocab_size", true, L::vocab);
  const int64_t kv = c.contains("num_key_value_heads") && !c["num_key_value_heads"].is_null()
                         ? count("num_key_value_heads", true, L::hidden)
                         : heads;
  if (hidden % heads != 0) throw fail("hidden_size", "is not a multiple of num_attention_heads");
  if (heads % kv != 0) throw fail("num_attention_heads", "is not a multiple of num_key_value_heads");
  if (c.contains("head_dim") && !c["head_dim"].is_null() && c["head_dim"] != hidden / heads)
    throw fail("head_dim", "is " + c["head_dim"].dump() + ", not hidden_size / num_attention_heads = " +
                               std::to_string(hidden / heads) + " (smp's heads split the hidden size)");
  nlohmann::json keys = {{"arch", "llama"},
                         {"layers", layers},
                         {"hidden", hidden},
                         {"heads", heads},
                         {"kv_heads", kv},
                         {"ffn", ffn},
                         {"vocab", vocab},
                         {"rope_base", number("rope_theta", 10000.0)},
                         {"norm_eps", number("rms_norm_eps", 1e-6)},
                         {"tie_embeddings", c.contains("tie_word_embeddings") && c["tie_word_embeddings"] == true}};
  if (const int64_t positions = count("max_position_embeddings", false, L::positions)) keys["seq_len"] = positions;
  return keys;
}

// The moe adapter's [model] keys for the MixtralForCausalLM `c` describes:
// layers, hidden, heads, kv_heads, expert_ffn, experts, top_k, vocab, seq_len,
// rope_base, and what makes the moe adapter Mixtral (every layer MoE, no
// shared experts, the renormalised top-k router, dropless). Refused besides
// what hf_llama_model_keys refuses: a tied head, router jitter, an
// rms_norm_eps other than 1e-5 (the moe adapter has no key for it yet).
inline nlohmann::json hf_mixtral_model_keys(const nlohmann::json& c, const std::string& where) {
  if (!c.is_object() || !c.contains("model_type") || c["model_type"] != "mixtral")
    throw Error(where + ": \"model_type\" is " + (c.is_object() && c.contains("model_type") ? c["model_type"].dump() : "missing") +
                ": smp reads \"mixtral\" (MixtralForCausalLM) for the moe adapter");
  nlohmann::json as_llama = c;  // Mixtral's shared keys read as a Llama's
  as_llama["model_type"] = "llama";
  as_llama.erase("architectures");
  if (c.contains("architectures") && c["architectures"].is_array())
    for (const auto& a : c["architectures"])
      if (a != "MixtralForCausalLM")
        throw Error(where + ": \"architectures\" names " + a.dump() + ", not MixtralForCausalLM");
  const nlohmann::json l = hf_llama_model_keys(as_llama, where);
  if (l["tie_embeddings"] == true) throw Error(where + ": \"tie_word_embeddings\" is true: the moe adapter's head is its own");
  if (std::fabs(l["norm_eps"].get<double>() - 1e-5) > 1e-12)
    throw Error(where + ": \"rms_norm_eps\" is " +
                (c.contains("rms_norm_eps") ? c.at("rms_norm_eps").dump() : std::string("missing (1e-6 by default)")) +
                ": the moe adapter normalises with 1e-5 (it has no key for another yet)");
  if (c.contains("router_jitter_noise") && c["router_jitter_noise"].is_number() && c["router_jitter_noise"] != 0)
    throw Error(where + ": \"router_jitter_noise\" is " + c["router_jitter_noise"].dump() +
                ": smp's router adds no noise outside training (model.router_jitter)");
  auto count = [&](const char* key) {
    if (!c.contains(key) || !c[key].is_number_integer() || c[key].get<int64_t>() <= 0)
      throw Error(where + ": \"" + key + "\" is " + (c.contains(key) ? c[key].dump() : "missing") +
                  ", not a positive integer");
    if (c[key].get<int64_t>() > HfLimits::experts)
      throw Error(where + ": \"" + key + "\" is " + c[key].dump() + ", more than smp reads (" +
                  std::to_string(HfLimits::experts) + ")");
    return c[key].get<int64_t>();
  };
  const int64_t experts = count("num_local_experts"), top_k = count("num_experts_per_tok");
  if (top_k > experts) throw Error(where + ": \"num_experts_per_tok\" is more than \"num_local_experts\"");
  nlohmann::json keys = {{"layers", l["layers"]},   {"hidden", l["hidden"]},   {"heads", l["heads"]},
                         {"kv_heads", l["kv_heads"]}, {"expert_ffn", l["ffn"]}, {"experts", experts},
                         {"top_k", top_k},          {"vocab", l["vocab"]},     {"rope_base", l["rope_base"]},
                         {"shared_experts", 0},     {"dense_layers", 0},       {"moe_every", 1},
                         {"router", "topk_softmax"}, {"capacity_factor", 0.0}};
  if (l.contains("seq_len")) keys["seq_len"] = l["seq_len"];
  return keys;
}

// [model] with the keys `from_hf(config, where)` gives merged in: a key the
// table also gives must agree (else an Error naming both). `table` has
// "from_hf" (a Hugging Face model folder) or is returned as it is.
template <class FromHf>
nlohmann::json with_from_hf(const nlohmann::json& table, FromHf from_hf) {
  if (!table.contains("from_hf")) return table;
  if (!table["from_hf"].is_string()) throw Error("model.from_hf: expected a folder name, got " + table["from_hf"].dump());
  const std::string folder = table["from_hf"].get<std::string>();
  const std::string where = "model.from_hf: " + folder + "/config.json";
  const nlohmann::json keys = from_hf(read_hf_config(folder), where);
  nlohmann::json merged = table;
  for (const auto& [key, value] : keys.items()) {
    if (table.contains(key) && table.at(key) != value)
      throw Error("model." + key + " = " + table.at(key).dump() + ", but " + where + " gives " + value.dump());
    merged[key] = value;
  }
  return merged;
}

}  // namespace smp::sdk
