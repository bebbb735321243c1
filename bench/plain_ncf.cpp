// The plain NeuMF loop (see plain_ncf.h), written the way one writes it by
// hand: four embedding tables, GMF = user * item, MLP over the concatenated
// embeddings (ReLU between linears), NeuMF's linear over both, BCE with logits;
// zero the grads, fetch the batch (the adapter's sampler), forward, backward,
// clip, AdamW with warm-up + cosine, read the loss.
#include "plain_ncf.h"

#include "interactions.h"
#include "plain_loop.h"

#include <smp/config.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>

namespace bench {

namespace {

using at::Tensor;

struct NeuMF {
  Tensor gmf_user, gmf_item, mlp_user, mlp_item, out_w, out_b;
  std::vector<Tensor> fc_w, fc_b;

  NeuMF(int64_t users, int64_t items, int64_t factors, const std::vector<int64_t>& mlp) {
    auto p = [](Tensor t) { return t.requires_grad_(true); };
    gmf_user = p(at::randn({users, factors}) * 0.01);
    gmf_item = p(at::randn({items, factors}) * 0.01);
    mlp_user = p(at::randn({users, mlp[0] / 2}) * 0.01);
    mlp_item = p(at::randn({items, mlp[0] / 2}) * 0.01);
    for (size_t l = 1; l < mlp.size(); ++l) {
      fc_w.push_back(p(at::randn({mlp[l], mlp[l - 1]}) * 0.02));
      fc_b.push_back(p(at::zeros({mlp[l]})));
    }
    out_w = p(at::randn({1, factors + mlp.back()}) * 0.02);
    out_b = p(at::zeros({1}));
  }
  std::vector<Tensor> parameters() const {
    std::vector<Tensor> all{gmf_user, gmf_item, mlp_user, mlp_item, out_w, out_b};
    for (size_t l = 0; l < fc_w.size(); ++l) all.push_back(fc_w[l]), all.push_back(fc_b[l]);
    return all;
  }
  Tensor logits(const Tensor& u, const Tensor& i) const {
    Tensor gmf = at::embedding(gmf_user, u) * at::embedding(gmf_item, i);
    Tensor x = at::cat({at::embedding(mlp_user, u), at::embedding(mlp_item, i)}, -1);
    for (size_t l = 0; l < fc_w.size(); ++l) x = at::relu(at::linear(x, fc_w[l], fc_b[l]));
    return at::linear(at::cat({gmf, x}, -1), out_w, out_b);
  }
};

}  // namespace

nlohmann::json run_plain_ncf(const PlainOptions& o) {
  smp::Config cfg = smp::Config::load(o.config, o.overrides);
  at::set_num_threads(1);
  auto model_int = [&](const char* k, int64_t fallback) {
    return cfg.has(std::string("model.") + k) ? cfg.get_int(std::string("model.") + k) : fallback;
  };
  const uint64_t seed = static_cast<uint64_t>(cfg.get_int("train.seed"));
  const std::string data = cfg.has("model.data") ? cfg.get_string("model.data") : "synthetic";
  ncf::Interactions d = [&] {
    if (data != "synthetic") return ncf::Interactions::load(data, "model.data", seed);
    ncf::SyntheticSpec s;
    s.users = model_int("users", s.users);
    s.items = model_int("items", s.items);
    s.per_user = model_int("interactions_per_user", s.per_user);
    s.rank = model_int("planted_rank", s.rank);
    if (cfg.has("model.popularity")) s.popularity = cfg.get_double("model.popularity");
    s.seed = seed;
    return ncf::Interactions::synthetic(s);
  }();
  std::vector<int64_t> mlp{64, 32, 16, 8};
  if (cfg.has("model.mlp_layers")) mlp = cfg.get_int_array("model.mlp_layers");
  const int negatives = static_cast<int>(model_int("negatives", 4));
  at::manual_seed(static_cast<int64_t>(seed));
  NeuMF model(d.users(), d.items(), model_int("factors", 8), mlp);
  std::vector<Tensor> params = model.parameters();
  AdamW opt = adamw_of(params, cfg);
  const TrainKeys t = TrainKeys::from(cfg);
  const int64_t B = t.batch, steps = t.steps;

  StepLog log;
  Tensor users = at::empty({B, 1}, at::kLong), items = at::empty({B, 1}, at::kLong), labels = at::empty({B, 1, 1});
  for (int64_t step = 0; step < steps; ++step) {
    const auto t0 = Clock::now();
    for (auto& p : params)
      if (p.grad().defined()) p.mutable_grad().zero_();
    for (int64_t s = 0; s < B; ++s)
      d.train_instance(step * B + s, negatives, users.data_ptr<int64_t>() + s, items.data_ptr<int64_t>() + s,
                       labels.data_ptr<float>() + s);
    Tensor loss = at::binary_cross_entropy_with_logits(model.logits(users, items), labels);
    loss.backward();
    const double loss_v = loss.item<double>();
    clip_grad_norm(params, t.clip);
    opt.step(lr_at(step, t.lr, t.min_lr, t.warmup, steps));
    log.add(step, steps, seconds_since(t0), loss_v);
  }
  nlohmann::json j = log.summary("interactions_per_s", static_cast<double>(B));
  return j;
}

}  // namespace bench
