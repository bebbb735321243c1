#include "plan/job_shape.h"

#include <smp/error.h>
#include <smp/runtime.h>

#include <nlohmann/json.hpp>

#include <algorithm>

namespace smp::plan {

namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

void attention_of(const nlohmann::json& c, Shape& s) {
  s.hidden = c.at("hidden"), s.heads = c.at("heads");
  s.kv_heads = c.value("kv_heads", int64_t{0});
}

}  // namespace

Shape shape_of_job(const Config& config, int world, const std::string& plugin) {
  const nlohmann::json model = Runtime::describe_model(config, world, {plugin});
  Shape s;
  s.recompute_kinds.clear();
  const auto recomputed = [&](const std::string& kind) {
    if (std::find(s.recompute_kinds.begin(), s.recompute_kinds.end(), kind) == s.recompute_kinds.end())
      s.recompute_kinds.push_back(kind);
  };
  for (const nlohmann::json& n : model["nodes"]) {
    const std::string kind = n["kind"];
    const nlohmann::json& c = n["config"];
    if (ends_with(kind, "transformer_layer")) {  // attention and a dense MLP
      ++s.layers;
      recomputed("transformer_layer");  // the job's kind: a parallel rule may have renamed the graph's
      attention_of(c, s);
      s.ffn = c.value("ffn", int64_t{0});
      s.gated_mlp = c.value("mlp", std::string()) == "swiglu";
    } else if (ends_with(kind, "attention")) {  // a layer spelled out: its MLP or moe node follows
      ++s.layers;
      recomputed("attention");
      attention_of(c, s);
    } else if (ends_with(kind, "moe")) {
      ++s.moe_layers;
      recomputed("moe");
      s.experts = c.at("experts"), s.top_k = c.at("top_k"), s.expert_ffn = c.at("ffn");
      s.shared_experts = c.value("shared_experts", int64_t{0});
    } else if (ends_with(kind, "embedding") && s.vocab == 0) {
      s.vocab = c.at("num");
    }
  }
  if (s.layers == 0)
    throw Error(config.origin() + ": the model has no transformer_layer or attention nodes: smp-plan's model is "
                "for decoders (the gpt and moe adapters)");
  if (s.moe_layers > s.layers)
    throw Error(config.origin() + ": more moe nodes than attention nodes: not a decoder smp-plan can model");
  if (model["throughput_unit"] != "tokens")
    throw Error(config.origin() + ": the model counts " + model["throughput_unit"].get<std::string>() +
                ", not tokens: smp-plan needs its sequence length");
  s.seq = static_cast<int64_t>(model["throughput_per_sample"].get<double>());
  s.batch = config.get_int("train.batch_size");
  s.dtype = config.has("train.precision") ? config.get_string("train.precision") : "fp32";
  return s;
}

}  // namespace smp::plan
