// The plain encoder loop (see plain_encoder.h), written the way one writes it by
// hand: zero the grads; fetch the batch; forward (token [+ segment] + position
// embeddings, layer norm; per layer LN(x + attention(x)) and LN(h + MLP(h)) with
// the padding mask; MLM head dense, GELU, LN and the tied decoder with its bias;
// BERT: tanh pooler on the first token and a 2-way classifier); backward; clip;
// AdamW with warm-up + cosine; read the loss.
#include "plain_encoder.h"

#include "corpus.h"
#include "packed_data.h"
#include "pair_data.h"
#include "plain_loop.h"

#include <smp/config.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>

#include <cmath>
#include <memory>
#include <stdexcept>

namespace bench {

namespace {

using at::Tensor;

Tensor param(Tensor t) { return t.requires_grad_(true); }
Tensor normal(at::IntArrayRef shape) { return param(at::randn(shape) * 0.02); }
Tensor zeros(int64_t n) { return param(at::zeros({n})); }
Tensor ones(int64_t n) { return param(at::ones({n})); }

struct Layer {
  Tensor q_w, q_b, k_w, k_b, v_w, v_b, o_w, o_b, ln1_w, ln1_b, fc_w, fc_b, pr_w, pr_b, ln2_w, ln2_b;
};

struct Encoder {
  int64_t h, heads;
  bool nsp;
  Tensor wte, dec_b, seg, wpe, emb_ln_w, emb_ln_b, mlm_w, mlm_b, mlm_ln_w, mlm_ln_b, pool_w, pool_b, cls_w, cls_b;
  std::vector<Layer> layers;

  Encoder(int64_t L, int64_t h_, int64_t heads_, int64_t s, int64_t V, int64_t ffn, bool nsp_)
      : h(h_), heads(heads_), nsp(nsp_) {
    wte = normal({V, h}), dec_b = zeros(V), wpe = normal({s, h});
    if (nsp) seg = normal({2, h});
    emb_ln_w = ones(h), emb_ln_b = zeros(h);
    for (int64_t i = 0; i < L; ++i) {
      Layer l;
      l.q_w = normal({h, h}), l.q_b = zeros(h), l.k_w = normal({h, h}), l.k_b = zeros(h);
      l.v_w = normal({h, h}), l.v_b = zeros(h), l.o_w = normal({h, h}), l.o_b = zeros(h);
      l.ln1_w = ones(h), l.ln1_b = zeros(h);
      l.fc_w = normal({ffn, h}), l.fc_b = zeros(ffn), l.pr_w = normal({h, ffn}), l.pr_b = zeros(h);
      l.ln2_w = ones(h), l.ln2_b = zeros(h);
      layers.push_back(l);
    }
    mlm_w = normal({h, h}), mlm_b = zeros(h), mlm_ln_w = ones(h), mlm_ln_b = zeros(h);
    if (nsp) pool_w = normal({h, h}), pool_b = zeros(h), cls_w = normal({2, h}), cls_b = zeros(2);
  }
  std::vector<Tensor> parameters() const {
    std::vector<Tensor> p{wte, dec_b, wpe, emb_ln_w, emb_ln_b, mlm_w, mlm_b, mlm_ln_w, mlm_ln_b};
    if (nsp) p.insert(p.end(), {seg, pool_w, pool_b, cls_w, cls_b});
    for (const auto& l : layers)
      p.insert(p.end(), {l.q_w, l.q_b, l.k_w, l.k_b, l.v_w, l.v_b, l.o_w, l.o_b, l.ln1_w, l.ln1_b, l.fc_w, l.fc_b,
                         l.pr_w, l.pr_b, l.ln2_w, l.ln2_b});
    return p;
  }
  Tensor ln(const Tensor& x, const Tensor& w, const Tensor& b) const { return at::layer_norm(x, {h}, w, b, 1e-12); }

  // masked: [b, 1, 1, s], true where the key is padding.
  Tensor attention(const Layer& l, const Tensor& x, const Tensor& masked) const {
    const int64_t b = x.size(0), s = x.size(1), hd = h / heads;
    auto split = [&](const Tensor& t) { return t.view({b, s, heads, hd}).transpose(1, 2); };
    Tensor q = split(at::linear(x, l.q_w, l.q_b)), k = split(at::linear(x, l.k_w, l.k_b)),
           v = split(at::linear(x, l.v_w, l.v_b));
    Tensor scores = at::matmul(q, k.transpose(-2, -1)).mul(1.0 / std::sqrt(static_cast<double>(hd)));
    Tensor probs = at::softmax(scores.masked_fill(masked, -1e9), -1);
    return at::linear(at::matmul(probs, v).transpose(1, 2).reshape({b, s, h}), l.o_w, l.o_b);
  }

  // The hidden states, then the MLM logits and (BERT) the NSP logits.
  std::pair<Tensor, Tensor> forward(const Tensor& tokens, const Tensor& segments, const Tensor& pad) const {
    Tensor x = at::embedding(wte, tokens) + wpe.narrow(0, 0, tokens.size(1));
    if (nsp) x = x + at::embedding(seg, segments);
    x = ln(x, emb_ln_w, emb_ln_b);
    const Tensor masked = pad.eq(0).view({pad.size(0), 1, 1, pad.size(1)});
    for (const auto& l : layers) {
      x = ln(x + attention(l, x, masked), l.ln1_w, l.ln1_b);
      x = ln(x + at::linear(at::gelu(at::linear(x, l.fc_w, l.fc_b), "tanh"), l.pr_w, l.pr_b), l.ln2_w, l.ln2_b);
    }
    Tensor mlm = at::linear(ln(at::gelu(at::linear(x, mlm_w, mlm_b)), mlm_ln_w, mlm_ln_b), wte, dec_b);
    Tensor cls;
    if (nsp) cls = at::linear(at::tanh(at::linear(x.select(1, 0), pool_w, pool_b)), cls_w, cls_b);
    return {mlm, cls};
  }
};

}  // namespace

nlohmann::json run_plain_encoder(const PlainOptions& o, const std::string& model) {
  if (model != "bert" && model != "roberta")
    throw std::runtime_error("plain-encoder: --model must be bert or roberta, got '" + model + "'");
  const bool bert = model == "bert";
  smp::Config cfg = smp::Config::load(o.config, o.overrides);
  at::set_num_threads(1);
  auto get_int = [&](const char* k) { return cfg.get_int(std::string("model.") + k); };
  // The bench configs spell out the shape (no presets here).
  const int64_t L = get_int("layers"), h = get_int("hidden"), heads = get_int("heads"), s = get_int("seq_len");
  const int64_t ffn = cfg.has("model.ffn") ? get_int("ffn") : 4 * h;
  const int64_t V = encoder::kByteVocab;
  if (cfg.has("model.dropout") && cfg.get_double("model.dropout") > 0)
    throw std::runtime_error("plain-encoder: model.dropout must be 0 (the reference has no dropout)");
  const double mask_prob = cfg.has("model.mask_prob") ? cfg.get_double("model.mask_prob") : 0.15;
  const uint64_t seed = static_cast<uint64_t>(cfg.get_int("train.seed"));
  encoder::SentenceCorpus corpus(cfg.get_string("model.data"),
                                 cfg.has("model.val_fraction") ? cfg.get_double("model.val_fraction") : 0.1);
  std::unique_ptr<encoder::PairData> pairs;
  std::unique_ptr<encoder::PackedData> packed;
  if (bert) pairs = std::make_unique<encoder::PairData>(corpus, s, mask_prob, seed);
  else packed = std::make_unique<encoder::PackedData>(corpus, s, mask_prob, seed);

  at::manual_seed(static_cast<int64_t>(seed));
  Encoder net(L, h, heads, s, V, ffn, bert);
  std::vector<Tensor> params = net.parameters();
  AdamW opt = adamw_of(params, cfg);
  const TrainKeys t = TrainKeys::from(cfg);
  const int64_t B = t.batch, steps = t.steps;

  StepLog log;
  Tensor tokens = at::empty({B, s}, at::kLong), segments = at::zeros({B, s}, at::kLong),
         pad = at::empty({B, s}, at::kLong), targets = at::empty({B, s}, at::kLong),
         labels = at::empty({B}, at::kLong);
  std::vector<int64_t> tok, tgt;
  for (int64_t step = 0; step < steps; ++step) {
    const auto t0 = Clock::now();
    for (auto& p : params)
      if (p.grad().defined()) p.mutable_grad().zero_();
    for (int64_t i = 0; i < B; ++i) {
      if (bert) {
        const encoder::PairSample x = pairs->sample(false, step, i);
        std::copy(x.tokens.begin(), x.tokens.end(), tokens[i].data_ptr<int64_t>());
        std::copy(x.segments.begin(), x.segments.end(), segments[i].data_ptr<int64_t>());
        std::copy(x.targets.begin(), x.targets.end(), targets[i].data_ptr<int64_t>());
        labels[i] = x.random_next;
      } else {
        packed->sample(false, step * B + i, tok, tgt);
        std::copy(tok.begin(), tok.end(), tokens[i].data_ptr<int64_t>());
        std::copy(tgt.begin(), tgt.end(), targets[i].data_ptr<int64_t>());
      }
    }
    pad.copy_(tokens.ne(corpus.vocab().pad()));
    auto [mlm, cls] = net.forward(tokens, segments, pad);
    Tensor loss = at::cross_entropy_loss(mlm.view({-1, V}), targets.view({-1}));  // mean over masked tokens
    if (bert) loss = loss + at::cross_entropy_loss(cls, labels);
    loss.backward();
    const double loss_v = loss.item<double>();
    clip_grad_norm(params, t.clip);
    opt.step(lr_at(step, t.lr, t.min_lr, t.warmup, steps));
    log.add(step, steps, seconds_since(t0), loss_v);
  }
  nlohmann::json j = log.summary("tokens_per_s", static_cast<double>(B * s));
  return j;
}

}  // namespace bench
