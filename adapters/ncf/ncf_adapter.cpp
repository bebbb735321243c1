// The NCF model adapter (He et al., 2017, "Neural Collaborative Filtering"):
// GMF (the elementwise product of a user and an item embedding) and an MLP
// over their concatenation (separate embeddings), fused by NeuMF's linear
// layer into one logit; binary cross entropy against sampled negatives. Data:
// implicit feedback, leave-one-out; validation ranks each user's held-out item
// among `eval_negatives` unseen ones and reports HR@k and NDCG@k.
//
// The graph is a real DAG: the two towers only meet in the head, so a
// pipeline can put them on different stages. Under tp the four embedding
// tables are row-sharded (sharded_embedding_table), the MLP's layers pair
// column- and row-parallel as Megatron's do.
#include "interactions.h"

#include <smp/sdk/plugin.hpp>

#include <ATen/ATen.h>

#include <memory>

namespace ncf {

using smp::sdk::Error;
using smp::sdk::Json;

class NcfAdapter : public smp::sdk::Adapter {
 public:
  NcfAdapter(const Json& cfg, const smp::sdk::AdapterContext& ctx) {
    smp::sdk::expect_model_keys(cfg, {"data", "users", "items", "interactions_per_user", "planted_rank", "popularity",
                                      "factors", "mlp_layers", "negatives", "eval_negatives", "top_k"},
                                "ncf");
    const std::string data = smp::sdk::model_get<std::string>(cfg, "data", "synthetic");
    const bool synthetic = data == "synthetic";
    for (const char* k : {"users", "items", "interactions_per_user", "planted_rank", "popularity"})
      if (!synthetic && cfg.contains(k))
        throw Error(std::string("model.") + k + ": only for data = \"synthetic\" (this job reads '" + data + "')");
    if (synthetic) {
      SyntheticSpec s;
      s.users = smp::sdk::model_positive(cfg, "users", s.users);
      s.items = smp::sdk::model_positive(cfg, "items", s.items);
      s.per_user = smp::sdk::model_positive(cfg, "interactions_per_user", s.per_user);
      s.rank = smp::sdk::model_positive(cfg, "planted_rank", s.rank);
      s.popularity = smp::sdk::model_get<double>(cfg, "popularity", s.popularity);
      s.seed = ctx.seed;
      if (s.per_user < 2 || s.per_user >= s.items)
        throw Error("model.interactions_per_user: expected 2 to items - 1 (" + std::to_string(s.items - 1) + "), got " +
                    std::to_string(s.per_user));
      data_ = std::make_unique<Interactions>(Interactions::synthetic(s));
    } else {
      data_ = std::make_unique<Interactions>(Interactions::load(data, "model.data", ctx.seed));
    }
    factors_ = smp::sdk::model_positive(cfg, "factors", 8);
    mlp_ = cfg.contains("mlp_layers") ? smp::sdk::model_get<std::vector<int64_t>>(cfg, "mlp_layers")
                                      : std::vector<int64_t>{64, 32, 16, 8};
    if (mlp_.size() < 2 || mlp_[0] % 2 != 0)
      throw Error("model.mlp_layers: expected at least two sizes, the first even (it is the concatenation of the "
                  "user and item embeddings), got " + Json(mlp_).dump());
    for (int64_t w : mlp_)
      if (w <= 0) throw Error("model.mlp_layers: sizes must be positive, got " + Json(mlp_).dump());
    negatives_ = static_cast<int>(smp::sdk::model_positive(cfg, "negatives", 4));
    eval_candidates_ = static_cast<int>(smp::sdk::model_positive(cfg, "eval_negatives", 99)) + 1;
    top_k_ = smp::sdk::model_positive(cfg, "top_k", 10);
    const auto [hr, ndcg] = data_->popularity_baseline(eval_candidates_, static_cast<int>(top_k_));
    smp::sdk::log(SMP_LOG_INFO, "ncf",
                  "data " + data + ": " + std::to_string(data_->users()) + " users, " +
                      std::to_string(data_->items()) + " items, " + std::to_string(data_->interactions()) +
                      " interactions (" + std::to_string(data_->train_positives()) +
                      " for training); popularity baseline HR@" + std::to_string(top_k_) + " " + std::to_string(hr) +
                      ", NDCG@" + std::to_string(top_k_) + " " + std::to_string(ndcg));
  }

  void describe(smp::sdk::GraphBuilder& g) override {
    const int64_t U = data_->users(), I = data_->items(), F = factors_, E = mlp_[0] / 2;
    auto table = [&](const std::string& name, int64_t rows, int64_t dim, const std::string& ids,
                     const std::string& out) {
      g.node({name, "embedding_table", {{"num", rows}, {"dim", dim}, {"init_std", 0.01}}, {ids}, {out}, "", "", 0.0,
              4.0 * rows * dim, 4.0 * dim});
    };
    g.input("users");   // [b, n] int64: n = 1 in training, 1 + eval_negatives in validation
    g.input("items");   // [b, n] int64
    g.input("labels");  // [b, n, 1] float
    // GMF tower.
    table("gmf.user", U, F, "users", "gu");
    table("gmf.item", I, F, "items", "gi");
    g.node({"gmf.product", "mul", Json::object(), {"gu", "gi"}, {"gmf"}, "", "", F, 0.0, 4.0 * F});
    // MLP tower: Megatron pairs under tp (column then row), the last gathered.
    table("mlp.user", U, E, "users", "mu");
    table("mlp.item", I, E, "items", "mi");
    g.node({"mlp.concat", "concat", {{"dim", -1}}, {"mu", "mi"}, {"m0"}, "", "", 0.0, 0.0, 4.0 * mlp_[0]});
    std::string x = "m0";
    for (size_t l = 1; l < mlp_.size(); ++l) {
      const bool column = l % 2 == 1, last = l + 1 == mlp_.size();
      Json cfg{{"in", mlp_[l - 1]}, {"out", mlp_[l]}, {"tp_mode", column ? "column" : "row"}};
      if (column) cfg["gather_output"] = last;
      else cfg["input_is_parallel"] = true;
      const std::string fc = "mlp.fc" + std::to_string(l), y = "m" + std::to_string(l);
      g.node({fc, "linear", cfg, {x}, {y + "a"}, "", "", 2.0 * mlp_[l - 1] * mlp_[l],
              4.0 * (mlp_[l - 1] + 1) * mlp_[l], 4.0 * mlp_[l]});
      g.node({fc + ".relu", "relu", Json::object(), {y + "a"}, {y}, "", "", mlp_[l], 0.0, 4.0 * mlp_[l]});
      x = y;
    }
    // NeuMF: both towers into one logit.
    const int64_t fused = F + mlp_.back();
    g.node({"neumf.concat", "concat", {{"dim", -1}}, {"gmf", x}, {"fused"}, "", "", 0.0, 0.0, 4.0 * fused});
    g.node({"neumf.out", "linear", {{"in", fused}, {"out", 1}, {"tp_mode", "none"}}, {"fused"}, {"logits"}, "", "",
            2.0 * fused, 4.0 * (fused + 1), 4.0});
    g.node({"loss", "bce_with_logits", Json::object(), {"logits", "labels"}, {"loss"}, "", "", 4.0, 0.0, 4.0});
    g.node({"ranking", "ranking_metrics", {{"k", top_k_}}, {"logits"}, {"hits", "ndcg", "ranked_users"}, "", "", 4.0,
            0.0, 0.0});
    g.loss("loss");
    const std::string k = std::to_string(top_k_);
    g.metric("hr@" + k, "hits", "ranked_users");
    g.metric("ndcg@" + k, "ndcg", "ranked_users");
    g.throughput_unit("interactions", 1);
    double flops = 2.0 * fused;
    for (size_t l = 1; l < mlp_.size(); ++l) flops += 2.0 * mlp_[l - 1] * mlp_[l];
    g.flops_per_sample(3.0 * flops);  // forward + backward
  }

  std::vector<at::Tensor> batch(const smp::sdk::BatchRequest& r) override {
    const bool validation = r.split == SMP_SPLIT_VALIDATION;
    const int n = validation ? eval_candidates_ : 1;
    at::Tensor users = at::empty({r.num_samples, n}, at::kLong), items = at::empty({r.num_samples, n}, at::kLong);
    at::Tensor labels = at::zeros({r.num_samples, n, 1}, at::kFloat);
    int64_t* u = users.data_ptr<int64_t>();
    int64_t* it = items.data_ptr<int64_t>();
    float* y = labels.data_ptr<float>();
    for (int64_t s = 0; s < r.num_samples; ++s) {
      const int64_t g = r.step * r.global_batch + r.first_sample + s;  // the sample's global position
      if (validation) {
        const int64_t user = g % data_->users();  // every user in turn
        data_->candidates(user, n, it + s * n);
        for (int c = 0; c < n; ++c) u[s * n + c] = user;
        y[s * n] = 1.0f;
      } else {
        data_->train_instance(g, negatives_, u + s, it + s, y + s);
      }
    }
    return {users, items, labels};
  }

 private:
  std::unique_ptr<Interactions> data_;
  int64_t factors_ = 8, top_k_ = 10;
  std::vector<int64_t> mlp_;
  int negatives_ = 4, eval_candidates_ = 100;
};

}  // namespace ncf

SMP_PLUGIN(smp::sdk::PluginBuilder("ncf", "0.1.0").adapter<ncf::NcfAdapter>("ncf"))
