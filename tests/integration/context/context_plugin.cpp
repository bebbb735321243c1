// A third party's context parallelism, for an axis the core has never heard
// of: the job declares parallel.axes.tok and loads this plugin, built with the
// SDK alone. The serial kind `token_linear` maps each token of a [rows,
// tokens, width] sequence through a linear layer and a tanh; its "tok" rule
// swaps in `tok_token_linear`, which computes only its tok rank's share of the
// tokens (scatter along the token dimension on the tok communicator from its
// module context) and gathers the rest. Each tok rank's weight gradient then
// covers its own tokens: the parameters declare a partial gradient on "tok",
// and the core sums it over the axis, from the placement alone.
#include <smp/sdk/plugin.hpp>

#include <ATen/ATen.h>

namespace context {

using at::Tensor;
using smp::sdk::Call;
using smp::sdk::Json;
using smp::sdk::ModuleContext;
using smp::sdk::Param;

struct Shape {
  int64_t in, out, tokens;
  static Shape parse(const Json& c, const std::string& node) {
    return {smp::sdk::config_get<int64_t>(c, "in", node), smp::sdk::config_get<int64_t>(c, "out", node),
            smp::sdk::config_get<int64_t>(c, "tokens", node)};
  }
};

// The same full weights in every layout: they are keyed by the node's seed.
inline std::pair<Tensor, Tensor> init_weights(const Shape& s, uint64_t seed) {
  auto gen = smp::sdk::init_generator(seed);
  Tensor w = at::empty({s.out, s.in}).normal_(0, 0.4, gen);
  Tensor b = at::empty({s.out}).normal_(0, 0.1, gen);
  return {w.requires_grad_(true), b.requires_grad_(true)};
}

inline Tensor token_map(const Tensor& x, const Tensor& w, const Tensor& b) { return at::tanh(at::linear(x, w, b)); }

class TokenLinear : public smp::sdk::Module {
 public:
  TokenLinear(const Json& cfg, const ModuleContext& ctx) : s_(Shape::parse(cfg, ctx.node_name)) {
    std::tie(w_, b_) = init_weights(s_, ctx.init_seed);
  }
  std::vector<Tensor> forward(const Call& call) override { return {token_map(call.inputs.at(0), w_, b_)}; }
  std::vector<Param> parameters() override { return {{"weight", w_}, {"bias", b_}}; }

 protected:
  Shape s_;
  Tensor w_, b_;
};

class TokTokenLinear : public TokenLinear {
 public:
  TokTokenLinear(const Json& cfg, const ModuleContext& ctx) : TokenLinear(cfg, ctx), tok_(ctx.comm("tok")) {
    if (tok_.size() != ctx.axis_size("tok") || tok_.rank() != ctx.axis_rank("tok"))
      throw smp::sdk::Error("node '" + ctx.node_name + "': the tok communicator disagrees with the mesh");
    // The host lists the axis among the mesh's (ABI 2.4's mesh extension), as
    // one rules apply on (a null mesh, the cost profiler's, is one rank).
    bool listed = !ctx.mesh;
    for (const auto& a : ctx.axes())
      listed = listed || (a.name == "tok" && a.size == tok_.size() && (a.flags & SMP_AXIS_RULES) != 0);
    if (!listed) throw smp::sdk::Error("node '" + ctx.node_name + "': the mesh extension does not list \"tok\"");
  }
  std::vector<Tensor> forward(const Call& call) override {
    Tensor mine = smp::sdk::scatter_to_region(call.inputs.at(0), tok_, 1);  // this rank's tokens
    return {smp::sdk::gather_from_region(token_map(mine, w_, b_), tok_, 1)};
  }
  std::vector<Param> parameters() override {
    Param w{"weight", w_}, b{"bias", b_};
    w.placements = b.placements = {smp::sdk::Placement::partial_grad("tok")};
    return {w, b};
  }

 private:
  smp::sdk::Comm tok_;
};

// The mean over the tokens: [rows, tokens, width] -> [rows, width].
class TokenMean : public smp::sdk::Module {
 public:
  TokenMean(const Json&, const ModuleContext&) {}
  std::vector<Tensor> forward(const Call& call) override { return {call.inputs.at(0).mean(1)}; }
  std::vector<Param> parameters() override { return {}; }
};

inline void check_tok(const Json& cfg, int tok) {
  const int64_t tokens = smp::sdk::config_get<int64_t>(cfg, "tokens", "token_linear (tok rule)");
  if (tokens % tok != 0)
    throw smp::sdk::Error("token_linear: tokens " + std::to_string(tokens) + " not divisible by tok " +
                          std::to_string(tok));
}

class ContextAdapter : public smp::sdk::Adapter {
 public:
  ContextAdapter(const Json& cfg, uint64_t seed) : seed_(seed) {
    width_ = cfg.value("width", 6);
    hidden_ = cfg.value("hidden", 12);
    tokens_ = cfg.value("tokens", 8);
  }
  void describe(smp::sdk::GraphBuilder& g) override {
    g.input("x");
    g.input("y");
    g.node({"mix1", "token_linear", {{"in", width_}, {"out", hidden_}, {"tokens", tokens_}}, {"x"}, {"h1"}});
    g.node({"mix2", "token_linear", {{"in", hidden_}, {"out", width_}, {"tokens", tokens_}}, {"h1"}, {"h2"}});
    g.node({"pool", "token_mean", Json::object(), {"h2"}, {"pooled"}});
    g.node({"head", "linear", {{"in", width_}, {"out", 1}}, {"pooled"}, {"pred"}});
    g.node({"loss", "mse_loss", Json::object(), {"pred", "y"}, {"loss"}});
    g.loss("loss");
  }
  std::vector<Tensor> batch(const smp::sdk::BatchRequest& r) override {
    std::vector<Tensor> xs;
    for (int64_t i = 0; i < r.num_samples; ++i) {
      uint64_t s = seed_ * 1000003ULL + static_cast<uint64_t>(r.step) * 7919ULL + static_cast<uint64_t>(r.first_sample + i) +
                   (r.split == SMP_SPLIT_VALIDATION ? 555555ULL : 0ULL);
      xs.push_back(at::randn({tokens_, width_}, smp::sdk::init_generator(s)));
    }
    Tensor x = at::stack(xs);
    return {x, x.sin().mean(1).sum(-1, true).contiguous()};
  }

 private:
  uint64_t seed_;
  int64_t width_, hidden_, tokens_;
};

}  // namespace context

SMP_PLUGIN(smp::sdk::PluginBuilder("toy_context", "0.1.0")
               .adapter<context::ContextAdapter>("toy_context")
               .module<context::TokenLinear>("token_linear")
               .module<context::TokTokenLinear>("tok_token_linear")
               .module<context::TokenMean>("token_mean")
               .rule("tok", "token_linear", "tok_token_linear", &context::check_tok))
