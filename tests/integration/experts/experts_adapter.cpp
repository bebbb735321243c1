// A small mixture-of-experts model built out of tree style (SDK only), to show
// expert parallelism end to end: a router (a replicated linear), then top-1
// experts. The serial kind `toy_experts` holds every expert; its "ep" rule
// swaps in `toy_ep_experts`, which holds E / ep experts (placement shard("ep",
// 0)), sends each token to its expert's rank with an autograd all-to-all on
// the ep communicator from its module context, and back. The core reduces the
// experts' gradients over edp and the router's over dp, from placements alone.
#include <smp/sdk/plugin.hpp>

#include <ATen/ATen.h>

namespace experts {

using at::Tensor;
using smp::sdk::Call;
using smp::sdk::Json;
using smp::sdk::ModuleContext;
using smp::sdk::Param;

struct Shape {
  int64_t experts, width, hidden;
  static Shape parse(const Json& c, const std::string& node) {
    return {smp::sdk::config_get<int64_t>(c, "experts", node), smp::sdk::config_get<int64_t>(c, "width", node),
            smp::sdk::config_get<int64_t>(c, "hidden", node)};
  }
};

// The full [E, w, h] and [E, h, w] expert weights, the same for every layout.
inline std::pair<Tensor, Tensor> init_experts(const Shape& s, uint64_t seed) {
  auto gen = smp::sdk::init_generator(seed);
  Tensor w1 = at::empty({s.experts, s.width, s.hidden}).normal_(0, 0.3, gen);
  Tensor w2 = at::empty({s.experts, s.hidden, s.width}).normal_(0, 0.3, gen);
  return {w1, w2};
}

// Rows of x whose expert is e (local index e - first) through that expert.
// An expert with no rows still runs (on none): the result then always depends
// on the weights, so every rank of an ep group calls the backward all-to-all.
inline Tensor run_experts(const Tensor& x, const Tensor& expert, const Tensor& w1, const Tensor& w2, int64_t first) {
  Tensor y = at::zeros_like(x);
  for (int64_t e = 0; e < w1.size(0); ++e) {
    Tensor rows = expert.eq(first + e).nonzero().squeeze(1);
    Tensor h = at::relu(at::matmul(x.index_select(0, rows), w1[e]));
    y = y.index_add(0, rows, at::matmul(h, w2[e]));
  }
  return y;
}

// Top-1 routing: the expert of each token and its gate probability.
inline std::pair<Tensor, Tensor> route(const Tensor& logits) {
  Tensor probs = at::softmax(logits, -1);
  Tensor expert = std::get<1>(logits.max(-1));
  return {expert, probs.gather(1, expert.unsqueeze(1))};
}

class ToyExperts : public smp::sdk::Module {
 public:
  ToyExperts(const Json& cfg, const ModuleContext& ctx) : s_(Shape::parse(cfg, ctx.node_name)) {
    std::tie(w1_, w2_) = init_experts(s_, ctx.init_seed);
    w1_.requires_grad_(true), w2_.requires_grad_(true);
  }
  std::vector<Tensor> forward(const Call& call) override {
    auto [expert, gate] = route(call.inputs.at(1));
    return {run_experts(call.inputs.at(0), expert, w1_, w2_, 0) * gate};
  }
  std::vector<Param> parameters() override { return {{"w1", w1_}, {"w2", w2_}}; }

 private:
  Shape s_;
  Tensor w1_, w2_;
};

class ToyEpExperts : public smp::sdk::Module {
 public:
  ToyEpExperts(const Json& cfg, const ModuleContext& ctx)
      : s_(Shape::parse(cfg, ctx.node_name)), ep_(ctx.comm("ep")), rank_(ctx.axis_rank("ep")) {
    const int n = ctx.axis_size("ep");
    if (ep_.size() != n || ep_.rank() != rank_)
      throw smp::sdk::Error("node '" + ctx.node_name + "': the ep communicator disagrees with the mesh");
    if (s_.experts % n != 0)
      throw smp::sdk::Error("node '" + ctx.node_name + "': experts " + std::to_string(s_.experts) +
                            " not divisible by ep " + std::to_string(n));
    local_ = s_.experts / n;
    auto [w1, w2] = init_experts(s_, ctx.init_seed);
    w1_ = w1.narrow(0, rank_ * local_, local_).clone().requires_grad_(true);
    w2_ = w2.narrow(0, rank_ * local_, local_).clone().requires_grad_(true);
  }
  std::vector<Tensor> forward(const Call& call) override {
    const Tensor& x = call.inputs.at(0);
    auto [expert, gate] = route(call.inputs.at(1));
    const int n = ep_.size();
    // Tokens sorted by the rank that holds their expert.
    Tensor order = std::get<1>(expert.sort(/*stable=*/true, 0, false));
    Tensor dest = expert.index_select(0, order).div(local_, "floor");
    Tensor send = at::bincount(dest, {}, n);
    std::vector<int64_t> send_counts(send.data_ptr<int64_t>(), send.data_ptr<int64_t>() + n);
    // How many come back from each rank: an asynchronous all-to-all of the counts.
    Tensor recv;
    std::vector<int64_t> ones(static_cast<size_t>(n), 1);
    smp::sdk::Event counts = ep_.alltoall_async(send, recv, ones, ones);
    Tensor xs = x.index_select(0, order);  // overlaps the counts exchange
    counts.wait();
    std::vector<int64_t> recv_counts(recv.data_ptr<int64_t>(), recv.data_ptr<int64_t>() + n);
    Tensor ids = ep_.alltoall(expert.index_select(0, order), send_counts, recv_counts);
    Tensor xr = smp::sdk::all_to_all(xs, ep_, send_counts, recv_counts);
    Tensor yr = run_experts(xr, ids, w1_, w2_, rank_ * local_);
    Tensor ys = smp::sdk::all_to_all(yr, ep_, recv_counts, send_counts);
    Tensor inverse = at::empty_like(order);
    inverse.scatter_(0, order, at::arange(order.numel()));
    return {ys.index_select(0, inverse) * gate};
  }
  std::vector<Param> parameters() override {
    Param a{"w1", w1_}, b{"w2", w2_};
    a.placements = b.placements = {smp::sdk::Placement::shard("ep", 0)};
    return {a, b};
  }

 private:
  Shape s_;
  smp::sdk::Comm ep_;
  int rank_ = 0;
  int64_t local_ = 0;
  Tensor w1_, w2_;
};

inline void check_ep(const Json& cfg, int ep) {
  int64_t e = smp::sdk::config_get<int64_t>(cfg, "experts", "toy_experts (ep rule)");
  if (e % ep != 0)
    throw smp::sdk::Error("toy_experts: experts " + std::to_string(e) + " not divisible by ep " + std::to_string(ep));
}

class ExpertsAdapter : public smp::sdk::Adapter {
 public:
  ExpertsAdapter(const Json& cfg, uint64_t seed) : seed_(seed) {
    width_ = cfg.value("width", 8);
    hidden_ = cfg.value("hidden", 16);
    experts_ = cfg.value("experts", 4);
  }
  void describe(smp::sdk::GraphBuilder& g) override {
    g.input("x");
    g.input("y");
    g.node({"router", "linear", {{"in", width_}, {"out", experts_}}, {"x"}, {"logits"}});
    g.node({"experts", "toy_experts", {{"experts", experts_}, {"width", width_}, {"hidden", hidden_}},
            {"x", "logits"}, {"h"}});
    g.node({"head", "linear", {{"in", width_}, {"out", 1}}, {"h"}, {"pred"}});
    g.node({"loss", "mse_loss", Json::object(), {"pred", "y"}, {"loss"}});
    g.loss("loss");
  }
  std::vector<Tensor> batch(const smp::sdk::BatchRequest& r) override {
    std::vector<Tensor> xs;
    for (int64_t i = 0; i < r.num_samples; ++i) {
      uint64_t s = seed_ * 1000003ULL + static_cast<uint64_t>(r.step) * 7919ULL + static_cast<uint64_t>(r.first_sample + i) +
                   (r.split == SMP_SPLIT_VALIDATION ? 555555ULL : 0ULL);
      xs.push_back(at::randn({width_}, smp::sdk::init_generator(s)));
    }
    Tensor x = at::stack(xs);
    return {x, x.cos().sum(-1, true).contiguous()};
  }

 private:
  uint64_t seed_;
  int64_t width_, hidden_, experts_;
};

}  // namespace experts

SMP_PLUGIN(smp::sdk::PluginBuilder("toy_experts", "0.1.0")
               .adapter<experts::ExpertsAdapter>("toy_experts")
               .module<experts::ToyExperts>("toy_experts")
               .module<experts::ToyEpExperts>("toy_ep_experts")
               .rule("ep", "toy_experts", "toy_ep_experts", &experts::check_ep))
