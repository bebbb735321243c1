#include "plain_decode.h"

#include "checkpoint/safetensors.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <stdexcept>

namespace bench {

namespace {

using at::Tensor;

// Every tensor of the folder (one file, or the files its index names), fp32.
std::map<std::string, Tensor> read_weights(const std::string& dir) {
  std::set<std::string> files;
  std::ifstream index(dir + "/model.safetensors.index.json");
  if (index) {
    for (const auto& [name, file] : nlohmann::json::parse(index)["weight_map"].items()) files.insert(file.get<std::string>());
  } else {
    files.insert("model.safetensors");
  }
  std::map<std::string, Tensor> out;
  for (const auto& f : files) {
    const smp::SafetensorsFile file(dir + "/" + f);
    for (const auto& [name, t] : file.tensors()) {
      Tensor v = at::empty(t.shape, at::TensorOptions().dtype(t.dtype));
      file.read(name, 0, t.end - t.begin, v.data_ptr());
      out[name] = v.to(at::kFloat);
    }
  }
  return out;
}

struct Llama {
  int64_t layers, heads, kv_heads, head_dim;
  double eps, theta;
  std::map<std::string, Tensor> w;
  const Tensor& at(const std::string& name) const {
    auto it = w.find(name);
    if (it == w.end()) throw std::runtime_error("plain decode: no tensor '" + name + "'");
    return it->second;
  }
  std::string layer(int64_t l, const std::string& name) const { return "model.layers." + std::to_string(l) + "." + name; }
};

Tensor rms(const Tensor& x, const Tensor& weight, double eps) {
  return x * at::rsqrt(x.pow(2).mean(-1, true) + eps) * weight;
}

// x [b, s, n, d] turned at positions first..first+s-1 (rotate-half).
Tensor rope(const Tensor& x, int64_t first, double theta) {
  const int64_t s = x.size(1), d = x.size(3), half = d / 2;
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  const Tensor inv = at::pow(theta, at::arange(0, half, f64).mul(-2.0 / static_cast<double>(d)));
  const Tensor angles = at::outer(at::arange(first, first + s, f64), inv);
  const Tensor cos = at::cat({angles.cos(), angles.cos()}, -1).to(at::kFloat).view({1, s, 1, d});
  const Tensor sin = at::cat({angles.sin(), angles.sin()}, -1).to(at::kFloat).view({1, s, 1, d});
  const Tensor rotated = at::cat({x.narrow(-1, half, half).neg(), x.narrow(-1, 0, half)}, -1);
  return x * cos + rotated * sin;
}

}  // namespace

PlainDecodeResult plain_greedy_decode(const std::string& hf_dir, const std::vector<std::vector<int64_t>>& prompts,
                                      int64_t new_tokens) {
  c10::NoGradGuard no_grad;
  std::ifstream config_file(hf_dir + "/config.json");
  const nlohmann::json config = nlohmann::json::parse(config_file);
  Llama m;
  m.layers = config["num_hidden_layers"];
  m.heads = config["num_attention_heads"];
  m.kv_heads = config.value("num_key_value_heads", m.heads);
  m.head_dim = config["hidden_size"].get<int64_t>() / m.heads;
  m.eps = config["rms_norm_eps"];
  m.theta = config.value("rope_theta", 10000.0);
  m.w = read_weights(hf_dir);
  const Tensor& head = m.w.count("lm_head.weight") ? m.at("lm_head.weight") : m.at("model.embed_tokens.weight");
  const int64_t b = static_cast<int64_t>(prompts.size()), p = static_cast<int64_t>(prompts.front().size());
  for (const auto& prompt : prompts)
    if (static_cast<int64_t>(prompt.size()) != p) throw std::runtime_error("plain decode: prompts of one length only");
  const int64_t capacity = p + new_tokens, group = m.heads / m.kv_heads;
  std::vector<Tensor> cache_k, cache_v;  // per layer [b, capacity, kv_heads, head_dim]
  for (int64_t l = 0; l < m.layers; ++l) {
    cache_k.push_back(at::zeros({b, capacity, m.kv_heads, m.head_dim}));
    cache_v.push_back(at::zeros({b, capacity, m.kv_heads, m.head_dim}));
  }
  // The last position's logits of tokens [b, s] fed at positions first..first+s-1.
  auto step = [&](const Tensor& tokens, int64_t first) {
    const int64_t s = tokens.size(1), len = first + s;
    Tensor x = at::embedding(m.at("model.embed_tokens.weight"), tokens);
    Tensor mask;  // causal within this call's positions
    if (s > 1)
      mask = at::ones({s, len}, at::kBool).triu(first + 1).view({1, 1, s, len});
    for (int64_t l = 0; l < m.layers; ++l) {
      const Tensor h = rms(x, m.at(m.layer(l, "input_layernorm.weight")), m.eps);
      const Tensor q = rope(at::linear(h, m.at(m.layer(l, "self_attn.q_proj.weight"))).view({b, s, m.heads, m.head_dim}),
                            first, m.theta);
      const Tensor k = rope(at::linear(h, m.at(m.layer(l, "self_attn.k_proj.weight"))).view({b, s, m.kv_heads, m.head_dim}),
                            first, m.theta);
      const Tensor v = at::linear(h, m.at(m.layer(l, "self_attn.v_proj.weight"))).view({b, s, m.kv_heads, m.head_dim});
      cache_k[l].narrow(1, first, s).copy_(k);
      cache_v[l].narrow(1, first, s).copy_(v);
      const Tensor keys = cache_k[l].narrow(1, 0, len).repeat_interleave(group, 2).permute({0, 2, 3, 1});  // [b, n, d, L]
      const Tensor values = cache_v[l].narrow(1, 0, len).repeat_interleave(group, 2).transpose(1, 2);     // [b, n, L, d]
      Tensor scores = at::matmul(q.transpose(1, 2), keys).div(std::sqrt(static_cast<double>(m.head_dim)));
      if (mask.defined()) scores = scores.masked_fill(mask, -INFINITY);
      const Tensor ctx = at::matmul(at::softmax(scores, -1), values).transpose(1, 2).reshape({b, s, m.heads * m.head_dim});
      x = x + at::linear(ctx, m.at(m.layer(l, "self_attn.o_proj.weight")));
      const Tensor g = rms(x, m.at(m.layer(l, "post_attention_layernorm.weight")), m.eps);
      x = x + at::linear(at::silu(at::linear(g, m.at(m.layer(l, "mlp.gate_proj.weight")))) *
                             at::linear(g, m.at(m.layer(l, "mlp.up_proj.weight"))),
                         m.at(m.layer(l, "mlp.down_proj.weight")));
    }
    return at::linear(rms(x.select(1, s - 1), m.at("model.norm.weight"), m.eps), head);  // [b, vocab]
  };
  PlainDecodeResult r;
  r.ids.resize(prompts.size());
  r.logprobs.resize(prompts.size());
  Tensor tokens = at::empty({b, p}, at::kLong);
  for (int64_t i = 0; i < b; ++i)
    for (int64_t j = 0; j < p; ++j) tokens[i][j] = prompts[static_cast<size_t>(i)][static_cast<size_t>(j)];
  const auto t0 = std::chrono::steady_clock::now();
  Tensor logits = step(tokens, 0);
  for (int64_t t = 0; t < new_tokens; ++t) {
    const Tensor next = logits.argmax(-1);
    const Tensor logprob = at::log_softmax(logits.to(at::kDouble), -1).gather(1, next.view({b, 1}));
    for (int64_t i = 0; i < b; ++i) {
      r.ids[static_cast<size_t>(i)].push_back(next[i].item<int64_t>());
      r.logprobs[static_cast<size_t>(i)].push_back(logprob[i][0].item<double>());
    }
    if (t + 1 < new_tokens) logits = step(next.view({b, 1}), p + t);
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.generated = b * new_tokens;
  return r;
}

}  // namespace bench
