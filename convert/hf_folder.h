// A Hugging Face model folder (LlamaForCausalLM or MixtralForCausalLM) read
// for `smp-checkpoint import --format hf`: config.json, and model.safetensors
// or the files model.safetensors.index.json maps each tensor to. Everything is
// read under the one reading discipline (smp/sdk/input_file.hpp) and checked
// before a byte of tensor data is read: every tensor's name, shape and dtype
// against what config.json implies, every required tensor present, the
// index's map against the files' headers.
#pragma once

#include "checkpoint_llama.h"

#include <nlohmann/json.hpp>

#include <string>

namespace smp::llama {

struct HfFolder {
  nlohmann::json config;  // config.json as read (nesting within sdk::kMaxHfConfigDepth)
  Shape shape;            // what it describes
  Tensors params;         // smp's names, fp32, the vocabulary padded (from_hf)
};

// Throws naming the file and the key or tensor at fault. Names resolve inside
// `folder`; links only within it or, for a hub cache snapshot
// (<repo>/snapshots/<rev>), into <repo>/blobs.
HfFolder read_hf_folder(const std::string& folder);

}  // namespace smp::llama
