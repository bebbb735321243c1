// smp-bench generate's peer: a plain LibTorch greedy loop with a KV cache over
// a Llama in Hugging Face's layout (what `smp-checkpoint export --format hf`
// writes), after transformers' LlamaForCausalLM: RMSNorm, rotate-half RoPE,
// grouped-query attention, SwiGLU. Only the safetensors reader is smp's.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace bench {

struct PlainDecodeResult {
  std::vector<std::vector<int64_t>> ids;  // the new tokens of each prompt
  std::vector<std::vector<double>> logprobs;  // the log-probability of each where it was chosen
  double seconds = 0;                      // prompts in, every new token out (the weights loaded before)
  int64_t generated = 0;
};

// Greedy decoding of prompts of one length, `new_tokens` each, on this thread's
// intra-op threads (the caller sets them).
PlainDecodeResult plain_greedy_decode(const std::string& hf_dir, const std::vector<std::vector<int64_t>>& prompts,
                                      int64_t new_tokens);

}  // namespace bench
