// The rules of the sequence axis (parallel.cp) for the kinds that compute on a
// share of every sample's sequence. Each keeps its kind: a kind reads the
// split from its module context (SequenceSplit) and the rule is its plugin's
// word that it can. Position-wise kinds need nothing more; attention and
// position embeddings follow the share's global positions (attention also
// takes a padding mask: every rank's share of it hides its keys); a select
// along the sequence picks its global position on the rank that holds it
// (zeros elsewhere); a loss must be a sum.
// Memory: parameters stay whole on every rank of the axis, activations split.
#pragma once

#include <smp/sdk/plugin.hpp>

#include <initializer_list>
#include <string>

namespace smp_nn::cp_rules {

using smp::sdk::Json;

// The blocks merged across ranks are not dropped (ring attention has no dropout).
inline void no_dropout(const Json& c, int cp) {
  const double p = c.value("dropout", 0.0);
  if (p > 0)
    throw smp::sdk::Error("dropout " + smp::sdk::Json(p).dump() + " under parallel.cp = " + std::to_string(cp) +
                          ": attention across the ranks of the sequence axis drops nothing (set the model's dropout "
                          "to 0)");
}

// A mean over a share of the tokens is not a share of the mean.
inline void summed_loss(const Json& c, int cp) {
  if (c.value("reduction", std::string("mean")) != "sum")
    throw smp::sdk::Error("a token-mean loss under parallel.cp = " + std::to_string(cp) +
                          ": each rank holds a share of the tokens, so the loss must be reduction = \"sum\" with its "
                          "count (GraphBuilder::loss_sum)");
}

// Every kind listed keeps its kind on "cp"; those in `dropout_checked` refuse dropout.
inline smp::sdk::PluginBuilder& add(smp::sdk::PluginBuilder& b, std::initializer_list<const char*> unchecked,
                std::initializer_list<const char*> dropout_checked, std::initializer_list<const char*> losses) {
  for (const char* k : unchecked) b.rule("cp", k, k, nullptr, 0.0, 1.0);
  for (const char* k : dropout_checked) b.rule("cp", k, k, &no_dropout, 0.0, 1.0);
  for (const char* k : losses) b.rule("cp", k, k, &summed_loss, 0.0, 1.0);
  return b;
}

}  // namespace smp_nn::cp_rules
