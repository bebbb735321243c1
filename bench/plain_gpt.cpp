// The plain LibTorch GPT-2 training loop (see plain_gpt.h). Everything the smp job
// does per step is here, written the way one writes a LibTorch loop by hand:
//   zero the grads; fetch the batch; forward (token + position embedding, pre-LN
//   blocks with separate q/k/v projections, causal softmax attention, GELU(tanh) MLP,
//   final LN, LM head tied to the token embedding, token-mean cross entropy);
//   backward; global grad-norm clipping; AdamW (decay on dim >= 2 tensors only)
//   with linear warm-up + cosine learning rate; read the loss.
// Initialisation reproduces smp's exactly (same per-module seeds, same draw order),
// and the data sampler reproduces the gpt adapter's, so the losses can be compared
// step by step with an smp job (a check that both run the same computation).
#include "plain_gpt.h"

#include "pipeline/backward_split.h"
#include "plain_loop.h"

#include "base/seeds.h"
#include "text_dataset.h"

#include <smp/config.h>

#include <smp/sdk/init.hpp>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <stdexcept>

namespace bench {

namespace {

using at::Tensor;

// ---- data: the gpt adapter's own reader (adapters/gpt/text_dataset.cpp) ----
// ---- parameters, initialised as smp does: per module a counter-based
// smp::sdk::InitStream seeded with derive_seed(train.seed, module key)
// (core/src/base/seeds.h), the draws in smp_nn's order (smp_nn/init.hpp) ----
Tensor normal(smp::sdk::InitStream& g, at::IntArrayRef shape, double std) {
  return g.normal(shape, std).requires_grad_(true);
}
Tensor zeros(int64_t n) { return at::zeros({n}, at::kFloat).requires_grad_(true); }
Tensor ones(int64_t n) { return at::ones({n}, at::kFloat).requires_grad_(true); }

struct Block {
  Tensor ln1_w, ln1_b, q_w, q_b, k_w, k_b, v_w, v_b, o_w, o_b, ln2_w, ln2_b, fc_w, fc_b, pr_w, pr_b;
};

struct Model {
  int64_t L, h, heads, s, V, ffn;
  Tensor wte, wpe, lnf_w, lnf_b;
  std::vector<Block> blocks;
  Tensor causal;  // [s, s] true above the diagonal

  Model(int64_t L_, int64_t h_, int64_t heads_, int64_t s_, int64_t V_, int64_t ffn_, uint64_t seed)
      : L(L_), h(h_), heads(heads_), s(s_), V(V_), ffn(ffn_) {
    auto gen = [&](const std::string& key) { return smp::sdk::InitStream(smp::derive_seed(seed, key)); };
    {
      auto g = gen("wte");
      wte = normal(g, {V, h}, 0.02);
    }
    {
      auto g = gen("wpe");
      wpe = normal(g, {s, h}, 0.01);
    }
    const double out_std = 0.02 / std::sqrt(2.0 * static_cast<double>(L));
    for (int64_t i = 0; i < L; ++i) {
      auto g = gen("blocks." + std::to_string(i));
      Block b;
      b.ln1_w = ones(h), b.ln1_b = zeros(h);
      b.q_w = normal(g, {h, h}, 0.02), b.q_b = zeros(h);
      b.k_w = normal(g, {h, h}, 0.02), b.k_b = zeros(h);
      b.v_w = normal(g, {h, h}, 0.02), b.v_b = zeros(h);
      b.o_w = normal(g, {h, h}, out_std), b.o_b = zeros(h);
      b.ln2_w = ones(h), b.ln2_b = zeros(h);
      b.fc_w = normal(g, {ffn, h}, 0.02), b.fc_b = zeros(ffn);
      b.pr_w = normal(g, {h, ffn}, out_std), b.pr_b = zeros(h);
      blocks.push_back(b);
    }
    lnf_w = ones(h), lnf_b = zeros(h);
    causal = at::ones({s, s}, at::kBool).triu(1);
  }

  std::vector<Tensor> parameters() const {
    std::vector<Tensor> p{wte, wpe};
    for (const auto& b : blocks)
      for (const Tensor& t : {b.ln1_w, b.ln1_b, b.q_w, b.q_b, b.k_w, b.k_b, b.v_w, b.v_b, b.o_w, b.o_b, b.ln2_w,
                              b.ln2_b, b.fc_w, b.fc_b, b.pr_w, b.pr_b})
        p.push_back(t);
    p.push_back(lnf_w);
    p.push_back(lnf_b);
    return p;
  }

  Tensor attention(const Block& p, const Tensor& x, bool mask_per_call) const {
    const int64_t b = x.size(0), hd = h / heads;
    auto split = [&](const Tensor& t) { return t.view({b, s, heads, hd}).transpose(1, 2); };
    Tensor q = split(at::linear(x, p.q_w, p.q_b)), k = split(at::linear(x, p.k_w, p.k_b)),
           v = split(at::linear(x, p.v_w, p.v_b));
    Tensor scores = at::matmul(q, k.transpose(-2, -1)).mul(1.0 / std::sqrt(static_cast<double>(hd)));
    Tensor mask = mask_per_call ? at::ones({s, s}, at::kBool).triu(1) : causal;
    Tensor probs = at::softmax(scores.masked_fill(mask, -1e9), -1);
    Tensor ctx = at::matmul(probs, v).transpose(1, 2).reshape({b, s, h});
    return at::linear(ctx, p.o_w, p.o_b);
  }

  Tensor block(const Block& p, Tensor x) const {
    x = x + attention(p, at::layer_norm(x, {h}, p.ln1_w, p.ln1_b, 1e-5), false);
    Tensor m = at::layer_norm(x, {h}, p.ln2_w, p.ln2_b, 1e-5);
    return x + at::linear(at::gelu(at::linear(m, p.fc_w, p.fc_b), "tanh"), p.pr_w, p.pr_b);
  }

  Tensor loss(const Tensor& tokens, const Tensor& targets, bool smp_ce, bool mask_per_call) const {
    Tensor x = at::embedding(wte, tokens) + wpe.narrow(0, 0, tokens.size(1));
    for (const auto& p : blocks) {
      x = x + attention(p, at::layer_norm(x, {h}, p.ln1_w, p.ln1_b, 1e-5), mask_per_call);
      Tensor m = at::layer_norm(x, {h}, p.ln2_w, p.ln2_b, 1e-5);
      x = x + at::linear(at::gelu(at::linear(m, p.fc_w, p.fc_b), "tanh"), p.pr_w, p.pr_b);
    }
    Tensor logits = at::linear(at::layer_norm(x, {h}, lnf_w, lnf_b, 1e-5), wte);
    if (!smp_ce) return at::cross_entropy_loss(logits.view({-1, V}), targets.view({-1}));
    // smp_nn::cross_entropy, for the "ce" ablation.
    Tensor lsm = at::log_softmax(logits, -1);
    Tensor valid = targets.ne(-100);
    Tensor idx = targets.masked_fill(valid.logical_not(), 0).unsqueeze(-1);
    Tensor nll = lsm.gather(-1, idx).squeeze(-1).neg().mul(valid.to(logits.scalar_type()));
    return nll.sum().div(valid.sum().clamp_min(1).to(logits.scalar_type()));
  }
};


}  // namespace

nlohmann::json run_plain_gpt(const PlainOptions& o) {
  smp::Config cfg = smp::Config::load(o.config, o.overrides);
  auto has = [&](const char* m) { return std::find(o.mimic.begin(), o.mimic.end(), m) != o.mimic.end(); };
  const bool smp_norm = has("norm"), smp_ce = has("ce"), mask_per_call = has("mask");
  at::set_num_threads(1);

  const int64_t L = cfg.get_int("model.layers"), h = cfg.get_int("model.hidden"), heads = cfg.get_int("model.heads"),
                s = cfg.get_int("model.seq_len"), V = cfg.get_int("model.vocab");
  const int64_t ffn = cfg.has("model.ffn") ? cfg.get_int("model.ffn") : 4 * h;
  const int64_t B = cfg.get_int("train.batch_size"), steps = cfg.get_int("train.steps");
  const uint64_t seed = static_cast<uint64_t>(cfg.get_int("train.seed"));
  const double lr = cfg.get_double("train.lr"), min_lr = cfg.get_double("train.min_lr"),
               clip = cfg.get_double("train.grad_clip");
  const int64_t warmup = cfg.get_int("train.warmup_steps");
  if (cfg.has("model.dropout") && cfg.get_double("model.dropout") > 0)
    throw std::runtime_error("plain-run: model.dropout must be 0 (the reference has no dropout)");

  gpt::TextDataset data(cfg.get_string("model.data"), cfg.has("model.val_fraction") ? cfg.get_double("model.val_fraction") : 0.1,
             s, seed);
  Model model(L, h, heads, s, V, ffn, seed);
  std::vector<Tensor> params = model.parameters();
  AdamW opt(params, cfg.get_double("train.beta1"), cfg.get_double("train.beta2"), cfg.get_double("train.eps"),
            cfg.get_double("train.weight_decay"));
  int64_t n_params = 0;
  for (auto& p : params) n_params += p.numel();

  StepLog log;
  double ph_fwd = 0, ph_bwd = 0, ph_clip = 0, ph_opt = 0;
  Tensor tokens = at::empty({B, s}, at::kLong), targets = at::empty({B, s}, at::kLong);
  for (int64_t step = 0; step < steps; ++step) {
    const auto t0 = Clock::now();
    for (auto& p : params)
      if (p.grad().defined()) p.mutable_grad().zero_();
    data.fill(false, step, B, 0, B, tokens.data_ptr<int64_t>(), targets.data_ptr<int64_t>());
    Tensor loss = model.loss(tokens, targets, smp_ce, mask_per_call);
    const auto t1 = Clock::now();
    loss.backward();
    const double loss_v = loss.item<double>();
    const auto t2 = Clock::now();
    double norm = 0;
    {
      c10::NoGradGuard ng;
      if (smp_norm) {
        for (auto& p : params) norm += p.grad().to(at::kDouble).pow(2).sum().item<double>();
        norm = std::sqrt(norm);
      } else {
        std::vector<Tensor> norms;
        norms.reserve(params.size());
        for (auto& p : params) norms.push_back(at::norm(p.grad()));
        norm = at::stack(norms).norm().item<double>();
      }
      if (clip > 0 && norm > clip) {
        const double scale = clip / (norm + 1e-6);
        for (auto& p : params) p.mutable_grad().mul_(scale);
      }
    }
    const auto t3 = Clock::now();
    opt.step(lr_at(step, lr, min_lr, warmup, steps));
    if (log.add(step, steps, seconds_since(t0), loss_v)) {
      ph_fwd += std::chrono::duration<double>(t1 - t0).count();
      ph_bwd += std::chrono::duration<double>(t2 - t1).count();
      ph_clip += std::chrono::duration<double>(t3 - t2).count();
      ph_opt += seconds_since(t3);
    }
  }
  const int64_t n_timed = log.n_timed;
  const double flops = 72.0 * static_cast<double>(B * s * L) * h * h *
                       (1.0 + static_cast<double>(s) / (6.0 * h) + static_cast<double>(V) / (12.0 * L * h));
  nlohmann::json j = log.summary("tokens_per_s", static_cast<double>(B * s));
  j["model_flops_per_step"] = flops;
  j["parameters"] = n_params;
  j["parameter_bytes"] = n_params * 4;
  j["mimic"] = o.mimic;
  if (n_timed)
    j["phase_seconds"] = {{"zero_data_forward", ph_fwd / n_timed}, {"backward_and_loss_item", ph_bwd / n_timed},
                          {"grad_norm_clip", ph_clip / n_timed}, {"adamw", ph_opt / n_timed}};
  return j;
}

nlohmann::json run_zb_probe(int64_t micro_batch, int64_t layers_in_stage, int reps) {
  at::set_num_threads(1);
  Model model(std::max<int64_t>(layers_in_stage, 1), 256, 4, 128, 256, 1024, 1234);
  std::vector<Tensor> params;
  for (const auto& b : model.blocks)
    for (const Tensor& t : {b.ln1_w, b.ln1_b, b.q_w, b.q_b, b.k_w, b.k_b, b.v_w, b.v_b, b.o_w, b.o_b, b.ln2_w,
                            b.ln2_b, b.fc_w, b.fc_b, b.pr_w, b.pr_b})
      params.push_back(t);
  Tensor x0 = at::randn({micro_batch, model.s, model.h});
  Tensor gy = at::randn({micro_batch, model.s, model.h});
  auto forward = [&](Tensor& leaf) {
    leaf = x0.clone().requires_grad_(true);
    Tensor y = leaf;
    for (const auto& b : model.blocks) y = model.block(b, y);
    return y;
  };
  double t_f = 1e9, t_b = 1e9, t_bi = 1e9, t_bw = 1e9, t_ideal_bi = 1e9, t_sbi = 1e9, t_sbw = 1e9;
  for (int r = 0; r < reps; ++r) {
    Tensor leaf;
    auto t0 = Clock::now();
    Tensor y = forward(leaf);
    t_f = std::min(t_f, seconds_since(t0));
    t0 = Clock::now();
    torch::autograd::backward({y}, {gy}, false);  // Op::Backward: input + weight grads in one pass
    t_b = std::min(t_b, seconds_since(t0));
    y = forward(leaf);
    t0 = Clock::now();  // Op::BackwardInput, as core/src/pipeline/executor.cpp does it
    auto gi = torch::autograd::grad({y}, {leaf}, {gy}, /*retain_graph=*/true, false, /*allow_unused=*/true);
    t_bi = std::min(t_bi, seconds_since(t0));
    t0 = Clock::now();  // Op::BackwardWeight: backward again from the root, inputs = parameters
    torch::autograd::backward({y}, {gy}, false, false, params);
    t_bw = std::min(t_bw, seconds_since(t0));
    // The executor's split (core/src/pipeline/backward_split.cpp):
    // the weight pass starts where the input pass left the weight sides.
    for (auto& p : params) p.mutable_grad() = Tensor();
    y = forward(leaf);
    {
      smp::BackwardSplit split;
      t0 = Clock::now();
      split.input_pass({y}, {gy}, {leaf});
      t_sbi = std::min(t_sbi, seconds_since(t0));
      t0 = Clock::now();
      split.weight_pass();
      t_sbw = std::min(t_sbw, seconds_since(t0));
    }
    // The input-gradient chain alone (parameters frozen): what BI needs to cost.
    for (auto& p : params) p.requires_grad_(false);
    y = forward(leaf);
    t0 = Clock::now();
    torch::autograd::grad({y}, {leaf}, {gy}, false, false, true);
    t_ideal_bi = std::min(t_ideal_bi, seconds_since(t0));
    for (auto& p : params) p.requires_grad_(true);
  }
  return {{"micro_batch", micro_batch},         {"layers", layers_in_stage},
          {"forward_s", t_f},                  {"backward_full_s", t_b},
          {"backward_input_s", t_bi},          {"backward_weight_s", t_bw},
          {"input_grad_chain_only_s", t_ideal_bi},
          {"bi_plus_bw_over_b", (t_bi + t_bw) / t_b}, {"b_over_f", t_b / t_f},
          {"split_backward_input_s", t_sbi},  {"split_backward_weight_s", t_sbw},
          {"split_bi_plus_bw_over_b", (t_sbi + t_sbw) / t_b}};
}

}  // namespace bench
