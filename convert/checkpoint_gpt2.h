// Hugging Face's GPT-2 layout for smp's `gpt` adapter (arch gpt2): the tensor
// names and orientation of transformers' GPT2LMHeadModel (Conv1D weights are
// [in, out]; q, k and v are one c_attn), and its config.json.
#pragma once

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <map>
#include <string>

namespace smp::gpt2 {

// smp parameter name -> tensor (global, "wte.weight", "blocks.0.attn.q.weight", ...)
using Tensors = std::map<std::string, at::Tensor>;

// smp's parameters in GPT-2's names and shapes. Throws naming a parameter
// that has no place in GPT-2 (another architecture).
Tensors to_gpt2(const Tensors& smp);
// Back: GPT-2's names (with or without the "transformer." prefix) to smp's.
Tensors from_gpt2(const Tensors& gpt2);
// config.json for the exported tensors; `graph` is a manifest's node list.
nlohmann::json config_json(const Tensors& gpt2, const nlohmann::json& graph);

}  // namespace smp::gpt2
