// A third-party plugin written against the SDK alone: a serial kind and its own
// tensor-parallel version, tied together by a tp rule (the SMP paper's extension point:
// register a distributed implementation against an ordinary module type).
//
//   scaled_linear     {in, out, scale=1}: y = scale * (x W^T + b); W [out, in] ~ N(0, 0.02)
//                     from init_generator(init_seed), b = 0.
//   scaled_linear_tp  same config: W's rows split across tp (shard_dim 0), input entered
//                     with f (copy_to_region), output all-gathered along the last dim.
//   rule              scaled_linear -> scaled_linear_tp, refused when out % tp != 0.
#include <smp/sdk/plugin.hpp>

#include <ATen/ATen.h>

namespace {

using smp::sdk::Call;
using smp::sdk::Json;
using smp::sdk::ModuleContext;
using smp::sdk::Param;

struct Cfg {
  int64_t in, out;
  double scale;
  explicit Cfg(const Json& c, const std::string& node)
      : in(smp::sdk::config_get<int64_t>(c, "in", node)),
        out(smp::sdk::config_get<int64_t>(c, "out", node)),
        scale(smp::sdk::config_get<double>(c, "scale", node, 1.0)) {}
};

at::Tensor full_weight(const Cfg& c, uint64_t seed) {
  at::Generator gen = smp::sdk::init_generator(seed);
  return at::empty({c.out, c.in}, at::kFloat).normal_(0.0, 0.02, gen);
}

class ScaledLinear : public smp::sdk::Module {
 public:
  ScaledLinear(const Json& cfg, const ModuleContext& ctx) : c_(cfg, ctx.node_name) {
    w_ = full_weight(c_, ctx.init_seed).requires_grad_(true);
    b_ = at::zeros({c_.out}, at::kFloat).requires_grad_(true);
  }
  std::vector<at::Tensor> forward(const Call& call) override {
    return {at::linear(call.inputs.at(0), w_, b_).mul(c_.scale)};
  }
  std::vector<Param> parameters() override { return {{"weight", w_, -1, false}, {"bias", b_, -1, false}}; }

 private:
  Cfg c_;
  at::Tensor w_, b_;
};

class ScaledLinearTp : public smp::sdk::Module {
 public:
  ScaledLinearTp(const Json& cfg, const ModuleContext& ctx) : c_(cfg, ctx.node_name), tp_(ctx.tp) {
    const int t = tp_.size(), r = tp_.rank();
    if (c_.out % t != 0)
      throw smp::sdk::Error("node '" + ctx.node_name + "': out " + std::to_string(c_.out) + " not divisible by tp " +
                            std::to_string(t));
    const int64_t n = c_.out / t;
    w_ = full_weight(c_, ctx.init_seed).narrow(0, r * n, n).clone().requires_grad_(true);
    b_ = at::zeros({n}, at::kFloat).requires_grad_(true);
  }
  std::vector<at::Tensor> forward(const Call& call) override {
    at::Tensor x = smp::sdk::copy_to_region(call.inputs.at(0), tp_);
    at::Tensor y = at::linear(x, w_, b_).mul(c_.scale);
    return {smp::sdk::gather_from_region(y, tp_, y.dim() - 1)};
  }
  std::vector<Param> parameters() override { return {{"weight", w_, 0, false}, {"bias", b_, 0, false}}; }

 private:
  Cfg c_;
  smp::sdk::Comm tp_;
  at::Tensor w_, b_;
};

void check_scaled_linear(const Json& cfg, int tp) {
  int64_t out = smp::sdk::config_get<int64_t>(cfg, "out", "scaled_linear (tp rule)");
  if (out % tp != 0)
    throw smp::sdk::Error("scaled_linear: out " + std::to_string(out) + " not divisible by tp " + std::to_string(tp));
}

}  // namespace

SMP_PLUGIN(smp::sdk::PluginBuilder("smp_third_party_rule", "1.0.0")
               .module<ScaledLinear>("scaled_linear")
               .module<ScaledLinearTp>("scaled_linear_tp")
               .tp_rule("scaled_linear", "scaled_linear_tp", &check_scaled_linear))
