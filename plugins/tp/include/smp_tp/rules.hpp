// Tensor-parallel rule checks: throw smp::sdk::Error naming the sizes when a node's
// config can't be split tp ways (the host prefixes the node).
#pragma once

#include <smp/sdk/module.hpp>

#include <string>

namespace smp_tp::rules {

using smp::sdk::Json;

inline int64_t get(const Json& c, const char* key, const char* kind) {
  return smp::sdk::config_get<int64_t>(c, key, std::string(kind) + " (tp rule)");
}
inline void divides(const char* kind, const char* what, int64_t n, int tp) {
  if (tp > 0 && n % tp != 0)
    throw smp::sdk::Error(std::string(kind) + ": " + what + " " + std::to_string(n) + " not divisible by tp " +
                          std::to_string(tp));
}

// smp_tp's table of the job, [tp]: sequence_parallel (boolean, default false),
// Megatron's sequence parallelism in the tensor-parallel layers.
inline void table(const Json& t) {
  for (const auto& [key, value] : t.items()) {
    if (key != "sequence_parallel")
      throw smp::sdk::Error("unknown key 'tp." + key + "' (smp_tp's [tp] table has: sequence_parallel)");
    if (!value.is_boolean())
      throw smp::sdk::Error("tp.sequence_parallel: expected a boolean (true or false), got " + value.dump());
  }
}

inline void linear(const Json& c, int tp) {
  std::string mode = smp::sdk::config_get<std::string>(c, "tp_mode", "linear (tp rule)", "column");
  if (mode == "column") divides("linear", "out", get(c, "out", "linear"), tp);
  else if (mode == "row") divides("linear", "in", get(c, "in", "linear"), tp);
  else if (mode != "none")
    throw smp::sdk::Error("linear: config key 'tp_mode' must be \"column\", \"row\" or \"none\", got \"" + mode + "\"");
}
inline void embedding(const Json& c, int tp) { divides("embedding", "vocab (num)", get(c, "num", "embedding"), tp); }
inline void embedding_table(const Json& c, int tp) {
  divides("embedding_table", "num", get(c, "num", "embedding_table"), tp);
}
inline void attention(const Json& c, int tp) { divides("attention", "heads", get(c, "heads", "attention"), tp); }
inline int64_t ffn_of(const Json& c, const char* kind) {
  return c.contains("ffn") ? get(c, "ffn", kind) : 4 * get(c, "hidden", kind);
}
inline void mlp(const Json& c, int tp) { divides("mlp", "ffn", ffn_of(c, "mlp"), tp); }
inline void swiglu_mlp(const Json& c, int tp) { divides("swiglu_mlp", "ffn", ffn_of(c, "swiglu_mlp"), tp); }
inline void transformer_layer(const Json& c, int tp) {
  divides("transformer_layer", "heads", get(c, "heads", "transformer_layer"), tp);
  divides("transformer_layer", "ffn", ffn_of(c, "transformer_layer"), tp);
}
// moe: experts split over ep; under tp with expert_tp (the default) each
// expert's ffn, and the shared experts' ffn always.
inline void moe_tp(const Json& c, int tp) {
  const int64_t ffn = ffn_of(c, "moe");
  if (smp::sdk::config_get<bool>(c, "expert_tp", "moe (tp rule)", true)) divides("moe", "ffn (expert_tp)", ffn, tp);
  const int64_t shared = smp::sdk::config_get<int64_t>(c, "shared_experts", "moe (tp rule)", 0);
  if (shared > 0) divides("moe", "shared experts' ffn", shared * ffn, tp);
}
inline void moe_ep(const Json& c, int ep) {
  const int64_t e = get(c, "experts", "moe");
  if (e % ep != 0)
    throw smp::sdk::Error("moe: experts " + std::to_string(e) + " not divisible by ep " + std::to_string(ep));
}

// cross_entropy has no rule check: logits split over the vocabulary come from a
// vocabulary-parallel producer, whose rule checks the split; whole logits (vocab
// given and matching, e.g. a replicated 2-class head) need none.

}  // namespace smp_tp::rules
