// smp_nn's serial kinds against references written directly with ATen ops (forward and
// gradients), init determinism and order, dropout determinism, and bad-config errors
// (directly and through the plugin's C ABI).
#include <smp_nn/modules.hpp>
#include <smp_nn/moe.hpp>

#include "plugin/host_api.h"

#include <c10/core/GradMode.h>
#include <gtest/gtest.h>

#include "error_of.h"

#include <dlfcn.h>

#include <cmath>
#include <functional>
#include <map>

using at::Tensor;
using smp::sdk::Call;
using smp::sdk::Module;
using smp::sdk::ModuleContext;
using Json = nlohmann::json;

namespace {

constexpr double kAtol = 1e-5, kRtol = 1e-4;

ModuleContext ctx(uint64_t seed, const std::string& name = "net.node") {
  ModuleContext m;
  m.node_name = name;
  m.init_seed = seed;
  return m;
}
Tensor randn(at::IntArrayRef shape, uint64_t seed) {
  auto gen = smp::sdk::init_generator(seed);
  return at::empty(shape, at::kFloat).normal_(0, 1, gen);
}
Tensor randint(int64_t hi, at::IntArrayRef shape, uint64_t seed) {
  auto gen = smp::sdk::init_generator(seed);
  return at::randint(hi, shape, gen, at::TensorOptions().dtype(at::kLong));
}

::testing::AssertionResult close(const Tensor& a, const Tensor& b, double atol = kAtol, double rtol = kRtol) {
  if (!a.defined() || !b.defined()) return ::testing::AssertionFailure() << "undefined tensor";
  if (a.sizes() != b.sizes())
    return ::testing::AssertionFailure() << "shapes " << a.sizes() << " vs " << b.sizes();
  if (at::allclose(a.detach(), b.detach(), rtol, atol)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "max abs err " << (a.detach() - b.detach()).abs().max().item<double>();
}

using Params = std::map<std::string, Tensor>;
using RefFn = std::function<Tensor(Params&, std::vector<Tensor>&)>;

// Runs the module and the reference (on detached copies of the module's parameters)
// forward and backward with the same output weights; compares outputs and every gradient.
void check_against(Module& m, const std::vector<Tensor>& inputs, const RefFn& ref, const std::string& method = "forward") {
  std::vector<Tensor> min, rin;
  for (auto& x : inputs) {
    bool fp = x.is_floating_point();
    min.push_back(fp ? x.clone().requires_grad_(true) : x);
    rin.push_back(fp ? x.clone().requires_grad_(true) : x);
  }
  Params rp;
  auto params = m.parameters();
  for (auto& p : params) {
    EXPECT_EQ(p.shard_dim, -1) << p.name;
    EXPECT_FALSE(p.tp_grad_sum) << p.name;
    EXPECT_TRUE(p.tensor.requires_grad() && p.tensor.is_leaf()) << p.name;
    rp[p.name] = p.tensor.detach().clone().requires_grad_(true);
  }
  Tensor out = m.forward(Call{method, min})[0];
  Tensor rout = ref(rp, rin);
  ASSERT_TRUE(close(out, rout)) << "output";
  Tensor w = out.dim() == 0 ? at::ones({}) : randn(out.sizes(), 1234);
  (out * w).sum().backward();
  (rout * w).sum().backward();
  for (size_t i = 0; i < min.size(); ++i)
    if (min[i].is_floating_point() && (min[i].grad().defined() || rin[i].grad().defined())) {  // data inputs have none
      EXPECT_TRUE(close(min[i].grad(), rin[i].grad())) << "grad of input " << i;
    }
  for (auto& p : params) {
    Tensor want = rp[p.name].grad().defined() ? rp[p.name].grad() : at::zeros_like(p.tensor);
    EXPECT_TRUE(close(p.tensor.grad(), want)) << "grad of " << p.name;
  }
}

// ---- references, written independently of smp_nn's ops ----
Tensor ref_linear(const Tensor& x, const Tensor& w, const Tensor& b = Tensor()) {
  Tensor y = at::matmul(x, w.t());
  return b.defined() ? y + b : y;
}
Tensor ref_layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, double eps = 1e-5) {
  Tensor mu = x.mean({-1}, true);
  Tensor var = (x - mu).pow(2).mean({-1}, true);
  return (x - mu) / (var + eps).sqrt() * w + b;
}
Tensor ref_gelu_tanh(const Tensor& x) {
  return 0.5 * x * (1 + at::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x.pow(3))));
}
// Head by head, with -inf masking (rows are never fully masked in these tests).
Tensor ref_attention(Params& p, const std::string& pre, const Tensor& x, int64_t heads, bool causal, const Tensor& mask) {
  const int64_t b = x.size(0), s = x.size(1), h = x.size(2), d = h / heads;
  Tensor q = ref_linear(x, p[pre + "q.weight"], p[pre + "q.bias"]);
  Tensor k = ref_linear(x, p[pre + "k.weight"], p[pre + "k.bias"]);
  Tensor v = ref_linear(x, p[pre + "v.weight"], p[pre + "v.bias"]);
  Tensor allowed = at::ones({b, s, s}, at::kBool);
  if (causal) allowed = allowed.logical_and(at::ones({s, s}, at::kBool).tril());
  if (mask.defined()) allowed = allowed.logical_and(mask.ne(0).unsqueeze(1));
  std::vector<Tensor> outs;
  const int64_t group = heads / (k.size(2) / d);  // query heads per kv head (grouped-query attention)
  for (int64_t i = 0; i < heads; ++i) {
    Tensor qi = q.narrow(2, i * d, d), ki = k.narrow(2, i / group * d, d), vi = v.narrow(2, i / group * d, d);
    Tensor sc = at::bmm(qi, ki.transpose(1, 2)) / std::sqrt(double(d));
    sc = sc.masked_fill(allowed.logical_not(), -std::numeric_limits<float>::infinity());
    outs.push_back(at::bmm(at::softmax(sc, -1), vi));
  }
  return ref_linear(at::cat(outs, -1), p[pre + "out.weight"], p[pre + "out.bias"]);
}
Tensor ref_mlp(Params& p, const std::string& pre, const Tensor& x) {
  return ref_linear(ref_gelu_tanh(ref_linear(x, p[pre + "fc.weight"], p[pre + "fc.bias"])), p[pre + "proj.weight"],
                    p[pre + "proj.bias"]);
}

Tensor pad_mask(int64_t b, int64_t s) {
  Tensor m = at::ones({b, s}, at::kLong);
  m[b - 1][s - 1] = 0, m[b - 1][s - 2] = 0;
  return m;
}

class NnTest : public ::testing::Test {
 protected:
  void SetUp() override { smp::sdk::host_slot() = smp::host_api(); }
};

// ---- each kind against its reference ----
// smp_nn's GELU (tanh form) kernels against the formula in double, over
// arguments from -40 to 40 (both tails, where the kernel clamps) and a dense
// range around 0, forward and backward; other dtypes and non-contiguous
// tensors take at::gelu.
TEST_F(NnTest, GeluTanhKernelsMatchTheFormulaInDouble) {
  Tensor x = at::cat({at::linspace(-40, 40, 8001), at::linspace(-6, 6, 20001), randn({4096}, 3) * 3}).to(at::kFloat);
  Tensor xd = x.to(at::kDouble).requires_grad_(true);
  Tensor want = ref_gelu_tanh(xd);
  Tensor g = randn(x.sizes(), 5);
  want.backward(g.to(at::kDouble));
  Tensor xf = x.clone().requires_grad_(true);
  Tensor got = smp_nn::gelu_tanh(xf);
  got.backward(g);
  // Forward: relative error (absolute below 1e-6). Backward: the error in
  // gelu' (the gradient's over |g|), which crosses 0 near x = -0.75.
  auto err = [](const Tensor& a, const Tensor& b) {
    return ((a.to(at::kDouble) - b).abs() / (b.abs() + 1e-30)).where(b.abs() > 1e-6, (a.to(at::kDouble) - b).abs());
  };
  const double fwd = err(got.detach(), want.detach()).max().item<double>();
  const double bwd = ((xf.grad().to(at::kDouble) - xd.grad()).abs() / g.to(at::kDouble).abs()).max().item<double>();
  const double aten_fwd = err(at::gelu(x, "tanh"), want.detach()).max().item<double>();
  std::cout << "gelu_tanh error: forward " << fwd << " (at::gelu " << aten_fwd << "), gelu' " << bwd << "\n";
  // Measured 1.5e-6 and 2.0e-6: the tails, where s's relative error is |v|
  // times v's float rounding. at::gelu's is 0.066 there (1 + tanh cancels).
  EXPECT_LT(fwd, 3e-6);
  EXPECT_LT(fwd, aten_fwd);
  EXPECT_LT(bwd, 4e-6);
  // Without gradients the same forward; bf16 and a strided tensor go to at::gelu.
  EXPECT_TRUE(at::equal(smp_nn::gelu_tanh(x), got.detach()));
  Tensor t = x.view({-1, 2}).t();
  EXPECT_TRUE(at::equal(smp_nn::gelu_tanh(t), at::gelu(t, "tanh")));
  Tensor b = x.to(at::kBFloat16);
  EXPECT_TRUE(at::equal(smp_nn::gelu_tanh(b), at::gelu(b, "tanh")));
}

TEST_F(NnTest, Embedding) {
  smp_nn::Embedding m(Json{{"num", 11}, {"dim", 5}}, ctx(1));
  check_against(m, {randint(11, {2, 7}, 2)}, [](Params& p, std::vector<Tensor>& in) {
    return p["weight"].index_select(0, in[0].reshape(-1)).reshape({2, 7, 5});
  });
  smp_nn::Embedding m2(Json{{"num", 11}, {"dim", 5}}, ctx(1));
  check_against(m2, {randn({2, 7, 5}, 3)}, [](Params& p, std::vector<Tensor>& in) {
    return at::matmul(in[0], p["weight"].t());
  }, "attend");
}

TEST_F(NnTest, EmbeddingTable) {
  for (auto shape : {std::vector<int64_t>{9}, std::vector<int64_t>{3, 4}}) {
    smp_nn::EmbeddingTable m(Json{{"num", 20}, {"dim", 3}, {"init_std", 1.0}}, ctx(4));
    Tensor ids = randint(20, shape, 5);
    check_against(m, {ids}, [&](Params& p, std::vector<Tensor>& in) {
      auto out_shape = shape;
      out_shape.push_back(3);
      return p["weight"].index_select(0, in[0].reshape(-1)).reshape(out_shape);
    });
  }
}

TEST_F(NnTest, PositionEmbedding) {
  smp_nn::PositionEmbedding m(Json{{"max_len", 12}, {"dim", 4}}, ctx(6));
  check_against(m, {randn({2, 9, 4}, 7)}, [](Params& p, std::vector<Tensor>& in) {
    return in[0] + p["weight"].slice(0, 0, 9).unsqueeze(0);
  });
}

TEST_F(NnTest, LayerNorm) {
  smp_nn::LayerNorm m(Json{{"dim", 6}, {"eps", 1e-5}}, ctx(0));
  {  // make weight/bias non-trivial so their gradients mean something
    c10::NoGradGuard g;
    for (auto& p : m.parameters()) p.tensor.copy_(randn(p.tensor.sizes(), 8));
  }
  check_against(m, {randn({3, 5, 6}, 9).mul(3).add(1)}, [](Params& p, std::vector<Tensor>& in) {
    return ref_layer_norm(in[0], p["weight"], p["bias"]);
  });
}

TEST_F(NnTest, RmsNorm) {
  smp_nn::RmsNorm m(Json{{"dim", 6}, {"eps", 1e-5}}, ctx(0));
  EXPECT_EQ(m.parameters().size(), 1u);  // a weight, no bias
  {  // a non-trivial weight, so that its gradient means something
    c10::NoGradGuard g;
    for (auto& p : m.parameters()) p.tensor.copy_(randn(p.tensor.sizes(), 8));
  }
  check_against(m, {randn({3, 5, 6}, 9).mul(3).add(1)}, [](Params& p, std::vector<Tensor>& in) {
    return in[0] / (in[0].pow(2).mean({-1}, true) + 1e-5).sqrt() * p["weight"];
  });
}

TEST_F(NnTest, RmsNormUnderBf16ReturnsBf16WithinItsRounding) {
  smp_nn::RmsNorm m(Json{{"dim", 512}}, ctx(0));
  for (auto& p : m.parameters()) p.tensor.set_data(p.tensor.detach().to(at::kBFloat16));
  const Tensor x = randn({2, 512}, 3).mul(30).to(at::kBFloat16), x32 = x.to(at::kFloat);
  const Tensor want = x32 / (x32.pow(2).mean({-1}, true) + 1e-5).sqrt();
  const Tensor got = m.forward(Call{"forward", {x}})[0];
  EXPECT_EQ(got.scalar_type(), at::kBFloat16);
  // Within bf16's rounding of the fp32 result (2^-8 relative).
  EXPECT_LE(((got.to(at::kFloat) - want).abs() / want.abs().clamp_min(1e-3)).max().item<float>(), 1.0f / 256);
}

TEST_F(NnTest, Linear) {
  for (bool bias : {true, false}) {
    smp_nn::Linear m(Json{{"in", 6}, {"out", 4}, {"bias", bias}, {"init_std", 0.5}}, ctx(10));
    EXPECT_EQ(m.parameters().size(), bias ? 2u : 1u);
    check_against(m, {randn({2, 3, 6}, 11)}, [&](Params& p, std::vector<Tensor>& in) {
      return ref_linear(in[0], p["weight"], bias ? p["bias"] : Tensor());
    });
  }
}

TEST_F(NnTest, AttentionCausalWithPaddingAndBidirectional) {
  for (bool causal : {true, false}) {
    Json c{{"hidden", 16}, {"heads", 4}, {"causal", causal}, {"init_std", 0.3}};
    smp_nn::Attention m(c, ctx(12));
    Tensor mask = pad_mask(2, 6);
    std::vector<Tensor> in = causal ? std::vector<Tensor>{randn({2, 6, 16}, 13), mask}
                                    : std::vector<Tensor>{randn({2, 6, 16}, 13)};
    check_against(m, in, [&](Params& p, std::vector<Tensor>& x) {
      return ref_attention(p, "", x[0], 4, causal, causal ? mask : Tensor());
    });
  }
}

TEST_F(NnTest, AttentionBidirectionalWithPadding) {
  smp_nn::Attention m(Json{{"hidden", 8}, {"heads", 2}, {"causal", false}, {"init_std", 0.3}}, ctx(14));
  Tensor mask = pad_mask(2, 5);
  check_against(m, {randn({2, 5, 8}, 15), mask}, [&](Params& p, std::vector<Tensor>& x) {
    return ref_attention(p, "", x[0], 2, false, mask);
  });
}

// Rotary embedding by its definition: each pair (x_i, x_{i+d/2}) of a head at
// position p turned by the angle p * base^(-2i/d).
Tensor ref_rotary(const Tensor& t, int64_t heads, double base) {
  const int64_t b = t.size(0), s = t.size(1), d = t.size(2) / heads;
  Tensor out = t.clone();
  for (int64_t p = 0; p < s; ++p)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < d / 2; ++i) {
        const double a = static_cast<double>(p) * std::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(d));
        const Tensor x1 = t.select(1, p).select(1, h * d + i), x2 = t.select(1, p).select(1, h * d + i + d / 2);
        out.select(1, p).select(1, h * d + i).copy_(x1 * std::cos(a) - x2 * std::sin(a));
        out.select(1, p).select(1, h * d + i + d / 2).copy_(x2 * std::cos(a) + x1 * std::sin(a));
      }
  return out;
}

TEST_F(NnTest, AttentionWithRotaryEmbedding) {
  const int64_t heads = 2;
  smp_nn::Attention m(Json{{"hidden", 8}, {"heads", heads}, {"rope_base", 100.0}, {"init_std", 0.5}}, ctx(20));
  check_against(m, {randn({2, 5, 8}, 21)}, [&](Params& p, std::vector<Tensor>& in) {
    const Tensor x = in[0];
    const int64_t b = x.size(0), s = x.size(1), d = 8 / heads;
    const Tensor q = ref_rotary(ref_linear(x, p["q.weight"], p["q.bias"]), heads, 100.0);
    const Tensor k = ref_rotary(ref_linear(x, p["k.weight"], p["k.bias"]), heads, 100.0);
    const Tensor v = ref_linear(x, p["v.weight"], p["v.bias"]);
    const Tensor allowed = at::ones({s, s}, at::kBool).tril();
    std::vector<Tensor> outs;
    for (int64_t i = 0; i < heads; ++i) {
      Tensor sc = at::bmm(q.narrow(2, i * d, d), k.narrow(2, i * d, d).transpose(1, 2)) / std::sqrt(double(d));
      sc = sc.masked_fill(allowed.logical_not(), -std::numeric_limits<float>::infinity());
      outs.push_back(at::bmm(at::softmax(sc, -1), v.narrow(2, i * d, d)));
    }
    (void)b;
    return ref_linear(at::cat(outs, -1), p["out.weight"], p["out.bias"]);
  });
  // Scores see only relative positions: the same tokens shifted by one give the
  // same last-row scores (checked on q.k of the rotated projections).
  const Tensor t = randn({1, 4, 8}, 22);
  const Tensor a = ref_rotary(t, heads, 100.0), b2 = ref_rotary(at::cat({randn({1, 1, 8}, 23), t}, 1), heads, 100.0);
  EXPECT_TRUE(close((a.select(1, 3) * a.select(1, 1)).narrow(-1, 0, 4).sum(), (b2.select(1, 4) * b2.select(1, 2)).narrow(-1, 0, 4).sum()));
  EXPECT_TRUE(close(smp_nn::rotary(t, heads, 4, 100.0), a));
}

TEST_F(NnTest, Mlp) {
  smp_nn::Mlp m(Json{{"hidden", 8}, {"init_std", 0.3}}, ctx(16));  // ffn defaults to 4 * hidden
  EXPECT_EQ(m.parameters()[0].tensor.sizes(), at::IntArrayRef({32, 8}));
  check_against(m, {randn({2, 3, 8}, 17)}, [](Params& p, std::vector<Tensor>& in) { return ref_mlp(p, "", in[0]); });
}

TEST_F(NnTest, SwigluMlp) {
  for (bool bias : {false, true}) {
    smp_nn::SwigluMlp m(Json{{"hidden", 8}, {"ffn", 12}, {"bias", bias}, {"init_std", 0.3}}, ctx(18));
    EXPECT_EQ(m.parameters().size(), bias ? 6u : 3u);
    EXPECT_EQ(m.parameters()[0].name, "gate.weight");
    EXPECT_EQ(m.parameters()[0].tensor.sizes(), at::IntArrayRef({12, 8}));
    check_against(m, {randn({2, 3, 8}, 19)}, [bias](Params& p, std::vector<Tensor>& in) {
      auto lin = [&](const std::string& n, const Tensor& x) {
        return ref_linear(x, p[n + ".weight"], bias ? p[n + ".bias"] : Tensor());
      };
      const Tensor g = lin("gate", in[0]);
      return lin("down", g * at::sigmoid(g) * lin("up", in[0]));
    });
  }
}

TEST_F(NnTest, TransformerLayer) {
  Json c{{"hidden", 16}, {"heads", 4}, {"ffn", 24}, {"init_std", 0.3}, {"out_init_std", 0.1}};
  smp_nn::TransformerLayer m(c, ctx(18));
  Tensor mask = pad_mask(2, 6);
  check_against(m, {randn({2, 6, 16}, 19), mask}, [&](Params& p, std::vector<Tensor>& in) {
    Tensor h = in[0] + ref_attention(p, "attn.", ref_layer_norm(in[0], p["ln1.weight"], p["ln1.bias"]), 4, true, mask);
    return h + ref_mlp(p, "mlp.", ref_layer_norm(h, p["ln2.weight"], p["ln2.bias"]));
  });
}

std::string error_of(const std::function<void()>& f);

// The MoE layer against a per-token loop over the chosen experts: outputs,
// the loss term (Switch aux per sequence + z) and every gradient, for both
// router orders, with and without capacity dropping, and shared experts.
TEST_F(NnTest, MoeMatchesAPerTokenLoopOverItsExperts) {
  const int64_t b = 2, s = 6, h = 8, E = 4, k = 2, f = 12;
  for (const char* router : {"topk_softmax", "softmax_topk"})
    for (double cf : {0.0, 1.0}) {
      SCOPED_TRACE(std::string(router) + " capacity " + std::to_string(cf));
      Json c{{"hidden", h}, {"experts", E}, {"top_k", k}, {"ffn", f}, {"router", router}, {"capacity_factor", cf},
             {"aux_loss_weight", 0.1}, {"z_loss_weight", 0.01}, {"shared_experts", 1}, {"init_std", 0.5}};
      smp_nn::Moe m(c, ctx(30));
      auto params = m.parameters();
      Params rp;
      for (auto& p : params) rp[p.name] = p.tensor.detach().clone().requires_grad_(true);
      const Tensor x = randn({b, s, h}, 31), xr = x.clone().requires_grad_(true), xm = x.clone().requires_grad_(true);
      auto outs = m.forward(Call{"forward", {xm}, true});
      // Reference.
      const Tensor logits = at::matmul(xr, rp["router.weight"].t());  // [b, s, E]
      const Tensor probs = at::softmax(logits, -1);
      std::vector<Tensor> rows;
      const int64_t cap = static_cast<int64_t>(std::ceil(cf * s * k / E));
      int64_t dropped = 0;
      auto expert = [&](int64_t e, const Tensor& t) {
        const Tensor g = at::matmul(t, rp["experts.gate"][e].t()), u = at::matmul(t, rp["experts.up"][e].t());
        return at::matmul(g * at::sigmoid(g) * u, rp["experts.down"][e].t());
      };
      for (int64_t i = 0; i < b; ++i) {
        std::vector<int64_t> queue(E, 0);
        for (int64_t t = 0; t < s; ++t) {
          const Tensor xt = xr[i][t];
          auto [lv, li] = logits[i][t].topk(k);
          auto [pv, pi] = probs[i][t].topk(k);
          const bool first = std::string(router) == "softmax_topk";
          const Tensor gates = first ? pv : at::softmax(lv, -1);
          const Tensor idx = first ? pi : li;
          Tensor y = at::zeros({h});
          for (int64_t j = 0; j < k; ++j) {
            const int64_t e = idx[j].item<int64_t>();
            if (cf > 0 && queue[e]++ >= cap) {
              ++dropped;
              continue;
            }
            y = y + gates[j] * expert(e, xt);
          }
          const Tensor sg = at::matmul(xt, rp["shared.gate.weight"].t()), su = at::matmul(xt, rp["shared.up.weight"].t());
          rows.push_back(y + at::matmul(sg * at::sigmoid(sg) * su, rp["shared.down.weight"].t()));
        }
      }
      const Tensor yref = at::stack(rows).reshape({b, s, h});
      // Switch aux per sequence, z over tokens.
      Tensor aux = at::zeros({});
      for (int64_t i = 0; i < b; ++i) {
        const bool first = std::string(router) == "softmax_topk";
        const Tensor idx = std::get<1>((first ? probs[i] : logits[i]).topk(k, -1));  // [s, k]
        const Tensor counts = at::one_hot(idx, E).sum(at::IntArrayRef{0, 1}).to(at::kFloat);
        aux = aux + (probs[i].sum(0) * counts).sum() * (double(E) / double(s * s * k));
      }
      const Tensor z = at::logsumexp(logits, -1).pow(2).sum();
      const Tensor loss_ref = aux * (0.1 * s) + z * 0.01;
      EXPECT_TRUE(close(outs[0], yref)) << "output";
      const Tensor stats = outs[1];
      ASSERT_EQ(stats.size(0), smp_nn::kMoeStats);
      EXPECT_TRUE(close(stats[smp_nn::kMoeLoss], loss_ref)) << "loss term";
      EXPECT_NEAR(stats[smp_nn::kMoeAux].item<double>(), aux.item<double>(), 1e-5);
      EXPECT_NEAR(stats[smp_nn::kMoeZ].item<double>(), z.item<double>(), 1e-4);
      EXPECT_EQ(stats[smp_nn::kMoeDropped].item<double>(), static_cast<double>(dropped));
      EXPECT_EQ(stats[smp_nn::kMoeAssigned].item<double>(), static_cast<double>(b * s * k));
      if (cf > 0) EXPECT_GT(dropped, 0) << "capacity 1 should turn some assignments away";
      const Tensor w = randn({b, s, h}, 32);
      ((outs[0] * w).sum() + stats[smp_nn::kMoeLoss]).backward();
      ((yref * w).sum() + loss_ref).backward();
      EXPECT_TRUE(close(xm.grad(), xr.grad())) << "grad of the input";
      for (auto& p : params) EXPECT_TRUE(close(p.tensor.grad(), rp[p.name].grad())) << "grad of " << p.name;
    }
}

// The grouped GEMM: uneven groups (one empty), forward and both gradients
// against one matmul per group; then two rounds over the weights (group g
// uses weight g mod 4, as (source, expert) segments do), where each weight's
// gradient sums its two segments.
TEST_F(NnTest, GroupedGemmMatchesOneMatmulPerGroup) {
  for (const std::vector<int64_t>& counts : {std::vector<int64_t>{3, 0, 5, 1}, std::vector<int64_t>{3, 0, 5, 1, 2, 0, 4, 1}}) {
    int64_t rows = 0;
    for (int64_t c : counts) rows += c;
    const Tensor x = randn({rows, 6}, 40).requires_grad_(true), w = randn({4, 7, 6}, 41).requires_grad_(true);
    const Tensor xr = x.detach().clone().requires_grad_(true), wr = w.detach().clone().requires_grad_(true);
    const Tensor y = smp_nn::grouped_mm(x, w, counts);
    std::vector<Tensor> parts;
    int64_t row = 0;
    for (size_t g = 0; g < counts.size(); ++g) {
      parts.push_back(at::matmul(xr.narrow(0, row, counts[g]), wr[static_cast<int64_t>(g % 4)].t()));
      row += counts[g];
    }
    const Tensor yr = at::cat(parts);
    EXPECT_TRUE(close(y, yr));
    const Tensor gy = randn({rows, 7}, 42);
    (y * gy).sum().backward();
    (yr * gy).sum().backward();
    EXPECT_TRUE(close(x.grad(), xr.grad()));
    EXPECT_TRUE(close(w.grad(), wr.grad())) << counts.size() << " groups";
    EXPECT_EQ(w.grad()[1].abs().sum().item<double>(), 0.0);  // the empty groups
  }
}


// Deferred expert weight gradients (smp_nn/deferred_grads.hpp): behind a
// chain's flush point, the deferred grouped GEMM gives the same gradients as
// the plain one, each parameter's AccumulateGrad runs once with a gradient
// (its post hooks are what data-parallel buckets count) and nothing is left
// pending; a task left over at the next chain start is an error naming the node.
namespace {
struct CountingHook : torch::autograd::FunctionPostHook {
  int* calls;
  explicit CountingHook(int* c) : calls(c) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& inputs) override {
    if (!inputs.empty() && inputs[0].defined()) ++*calls;
    return outputs;
  }
};
}  // namespace

TEST_F(NnTest, DeferredWeightGradientsArriveOnceThroughAutograd) {
  const std::vector<int64_t> counts{3, 0, 5, 1, 2, 0, 4, 1};  // two rounds over 4 weights
  const Tensor x = randn({16, 6}, 50).requires_grad_(true), w = randn({4, 7, 6}, 51).requires_grad_(true);
  const Tensor xr = x.detach().clone().requires_grad_(true), wr = w.detach().clone().requires_grad_(true);
  int calls = 0;
  auto acc = torch::autograd::impl::grad_accumulator(w);
  acc->add_post_hook(std::make_unique<CountingHook>(&calls));
  smp_nn::DeferredWeightGrads& pool = smp_nn::DeferredWeightGrads::current();
  const Tensor xin = smp_nn::start_deferral_chain(x, true, "moe0");
  EXPECT_TRUE(pool.armed);
  const Tensor y = smp_nn::detail::DeferredGroupedMm::apply(xin, w.detach(), counts, smp_nn::detail::ParamRef{w});
  const Tensor gy = randn({16, 7}, 52);
  (y * gy).sum().backward();
  (smp_nn::grouped_mm(xr, wr, counts) * gy).sum().backward();
  EXPECT_TRUE(pool.empty()) << pool.pending() << " task(s) left after the flush point";
  EXPECT_EQ(calls, 1) << "AccumulateGrad calls with a gradient";
  ASSERT_TRUE(w.grad().defined());
  EXPECT_TRUE(at::equal(w.grad(), wr.grad())) << "same GEMMs in the same order";
  EXPECT_TRUE(at::equal(x.grad(), xr.grad()));

  pool.add([] { return true; });  // a task whose backward pass never reached its flush point
  const std::string err = smp_test::error_of<std::logic_error>([&] { smp_nn::start_deferral_chain(x, true, "moe0"); });
  EXPECT_NE(err.find("node 'moe0'"), std::string::npos) << err;
  EXPECT_NE(err.find("never computed"), std::string::npos) << err;
  EXPECT_TRUE(pool.empty());
  pool.armed = false;
}

// Grouped-query attention by its definition: query head i attends with kv head
// i / (heads / kv_heads); k and v have kv_heads * head_dim rows.
TEST_F(NnTest, GroupedQueryAttention) {
  for (int64_t kv : {1, 2}) {
    smp_nn::Attention m(Json{{"hidden", 16}, {"heads", 4}, {"kv_heads", kv}, {"bias", false}, {"init_std", 0.4}},
                        ctx(24));
    auto params = m.parameters();
    ASSERT_EQ(params.size(), 4u);  // no biases
    EXPECT_EQ(params[1].name, "k.weight");
    EXPECT_EQ(params[1].tensor.sizes(), at::IntArrayRef({kv * 4, 16}));
    Tensor mask = pad_mask(2, 5);
    check_against(m, {randn({2, 5, 16}, 25), mask}, [&](Params& p, std::vector<Tensor>& x) {
      return ref_attention(p, "", x[0], 4, true, mask);
    });
  }
  EXPECT_NE(error_of([&] { smp_nn::Attention(Json{{"hidden", 16}, {"heads", 4}, {"kv_heads", 3}}, ctx(0)); })
                .find("heads 4 not divisible by kv_heads 3"),
            std::string::npos);
}

// Llama's block: RMSNorm, attention with rotary q/k and grouped kv heads,
// SwiGLU, no biases; pre-norm residuals.
TEST_F(NnTest, LlamaTransformerLayer) {
  Json c{{"hidden", 16}, {"heads", 4}, {"kv_heads", 2}, {"ffn", 24}, {"init_std", 0.3}, {"out_init_std", 0.1},
         {"norm_type", "rms_norm"}, {"mlp", "swiglu"}, {"bias", false}, {"rope_base", 500.0}};
  smp_nn::TransformerLayer m(c, ctx(26));
  std::vector<std::string> names;
  for (auto& p : m.parameters()) names.push_back(p.name);
  EXPECT_EQ(names, (std::vector<std::string>{"ln1.weight", "attn.q.weight", "attn.k.weight", "attn.v.weight",
                                             "attn.out.weight", "ln2.weight", "mlp.gate.weight", "mlp.up.weight",
                                             "mlp.down.weight"}));
  {  // non-trivial norm weights, so that their gradients mean something
    c10::NoGradGuard g;
    for (auto& p : m.parameters())
      if (p.name.find("ln") == 0) p.tensor.copy_(randn(p.tensor.sizes(), 27).add(1));
  }
  check_against(m, {randn({2, 6, 16}, 28)}, [&](Params& p, std::vector<Tensor>& in) {
    auto rms = [&](const Tensor& x, const std::string& w) {
      return x / (x.pow(2).mean({-1}, true) + 1e-5).sqrt() * p[w];
    };
    auto attn = [&](const Tensor& x) {
      const int64_t s = x.size(1), d = 4;
      const Tensor q = ref_rotary(ref_linear(x, p["attn.q.weight"]), 4, 500.0);
      const Tensor k = ref_rotary(ref_linear(x, p["attn.k.weight"]), 2, 500.0);
      const Tensor v = ref_linear(x, p["attn.v.weight"]);
      const Tensor allowed = at::ones({s, s}, at::kBool).tril();
      std::vector<Tensor> outs;
      for (int64_t i = 0; i < 4; ++i) {
        Tensor sc = at::bmm(q.narrow(2, i * d, d), k.narrow(2, i / 2 * d, d).transpose(1, 2)) / 2.0;
        sc = sc.masked_fill(allowed.logical_not(), -std::numeric_limits<float>::infinity());
        outs.push_back(at::bmm(at::softmax(sc, -1), v.narrow(2, i / 2 * d, d)));
      }
      return ref_linear(at::cat(outs, -1), p["attn.out.weight"]);
    };
    auto mlp = [&](const Tensor& x) {
      const Tensor g = ref_linear(x, p["mlp.gate.weight"]);
      return ref_linear(g * at::sigmoid(g) * ref_linear(x, p["mlp.up.weight"]), p["mlp.down.weight"]);
    };
    const Tensor h = in[0] + attn(rms(in[0], "ln1.weight"));
    return h + mlp(rms(h, "ln2.weight"));
  });
}


TEST_F(NnTest, CrossEntropy) {
  Tensor logits = randn({2, 5, 7}, 20).mul(2);
  Tensor targets = randint(7, {2, 5}, 21);
  targets[0][1] = -100, targets[1][4] = -100;
  smp_nn::CrossEntropy m(Json::object(), ctx(0));
  check_against(m, {logits, targets}, [](Params&, std::vector<Tensor>& in) {
    return at::cross_entropy_loss(in[0].reshape({-1, 7}), in[1].reshape(-1), {}, at::Reduction::Mean, -100);
  });
  smp_nn::CrossEntropy m3(Json{{"ignore_index", 3}}, ctx(0));
  Tensor t3 = targets.clamp_min(0);
  t3[0][0] = 3;
  check_against(m3, {logits, t3}, [](Params&, std::vector<Tensor>& in) {
    return at::cross_entropy_loss(in[0].reshape({-1, 7}), in[1].reshape(-1), {}, at::Reduction::Mean, 3);
  });
  // every token ignored: 0, not NaN
  Tensor all_ignored = at::full({2, 5}, -100, at::kLong);
  EXPECT_EQ(m.forward(Call{"forward", {logits, all_ignored}})[0].item<float>(), 0.0f);
  // reduction "sum": (the sum over counted tokens, their count), for graph_set_loss_sum
  smp_nn::CrossEntropy ms(Json{{"reduction", "sum"}}, ctx(0));
  auto out = ms.forward(Call{"forward", {logits, targets}});
  ASSERT_EQ(out.size(), 2u);
  Tensor want = at::cross_entropy_loss(logits.reshape({-1, 7}), targets.reshape(-1), {}, at::Reduction::Sum, -100);
  EXPECT_NEAR(out[0].item<double>(), want.item<double>(), 1e-4);
  EXPECT_EQ(out[1].item<double>(), 8.0);  // 10 tokens, 2 ignored
  auto none = ms.forward(Call{"forward", {logits, all_ignored}});
  EXPECT_EQ(none[0].item<float>(), 0.0f);
  EXPECT_EQ(none[1].item<float>(), 0.0f);
  EXPECT_NE(error_of([] { smp_nn::CrossEntropy(Json{{"reduction", "max"}}, ctx(0, "ce")); }).find("'reduction'"),
            std::string::npos);
}

// A third input weighs each token (a loss mask, as BERT's normalisation over the
// global batch uses): mean = sum w nll / sum w over counted tokens; "sum" gives
// both sums, the count being the weights' sum.
TEST_F(NnTest, WeightedCrossEntropy) {
  Tensor logits = randn({2, 5, 7}, 25).mul(2);
  Tensor targets = randint(7, {2, 5}, 26);
  targets[0][1] = -100, targets[1][4] = -100;
  Tensor weights = at::rand({2, 5}, smp::sdk::init_generator(27)).add(0.25);
  auto nll = [](const Tensor& l, const Tensor& t) {
    return at::cross_entropy_loss(l.reshape({-1, 7}), t.reshape(-1), {}, at::Reduction::None, -100);
  };
  smp_nn::CrossEntropy m(Json::object(), ctx(0));
  check_against(m, {logits, targets, weights}, [&](Params&, std::vector<Tensor>& in) {
    Tensor w = in[2].detach().reshape(-1) * in[1].reshape(-1).ne(-100).to(at::kFloat);  // weights are data
    return (nll(in[0], in[1]) * w).sum() / w.sum();
  });
  smp_nn::CrossEntropy ms(Json{{"reduction", "sum"}}, ctx(0));
  auto out = ms.forward(Call{"forward", {logits, targets, weights}});
  Tensor w = weights.reshape(-1) * targets.reshape(-1).ne(-100).to(at::kFloat);
  EXPECT_NEAR(out[0].item<double>(), (nll(logits, targets) * w).sum().item<double>(), 1e-4);
  EXPECT_NEAR(out[1].item<double>(), w.sum().item<double>(), 1e-6);
  // Weights of one: the unweighted loss, bit for bit.
  auto ones = ms.forward(Call{"forward", {logits, targets, at::ones({2, 5})}});
  auto plain = ms.forward(Call{"forward", {logits, targets}});
  EXPECT_TRUE(at::equal(ones[0], plain[0]) && at::equal(ones[1], plain[1]));
  // Tiny weights whose sum is below 1 still normalise by that sum.
  auto tiny = m.forward(Call{"forward", {logits, targets, weights.mul(1e-3)}});
  EXPECT_NEAR(tiny[0].item<double>(), (nll(logits, targets) * w).sum().item<double>() / w.sum().item<double>(), 1e-4);
  EXPECT_NE(error_of([&] { ms.forward(Call{"forward", {logits, targets, at::ones({2, 4})}}); }).find("weights must be"),
            std::string::npos);
  EXPECT_NE(error_of([&] { ms.forward(Call{"forward", {logits, targets, targets}}); }).find("floating point"),
            std::string::npos);
}

// BERT's pieces: the tied decoder's bias (embedding attend_bias), the pooled
// first token (select) and the pooler's tanh.
TEST_F(NnTest, AttendBiasSelectAndTanh) {
  smp_nn::Embedding e(Json{{"num", 6}, {"dim", 4}, {"attend_bias", true}}, ctx(3));
  auto params = e.parameters();
  ASSERT_EQ(params.size(), 2u);
  EXPECT_EQ(params[1].name, "attend_bias");
  EXPECT_TRUE(at::equal(params[1].tensor, at::zeros({6})));
  params[1].tensor.data().uniform_();
  Tensor x = randn({2, 3, 4}, 28);
  Tensor y = e.forward(Call{"attend", {x}})[0];
  EXPECT_TRUE(at::allclose(y, at::linear(x, params[0].tensor, params[1].tensor)));
  EXPECT_EQ(smp_nn::Embedding(Json{{"num", 6}, {"dim", 4}}, ctx(3)).parameters().size(), 1u);
  EXPECT_NE(error_of([] { smp_nn::EmbeddingTable(Json{{"num", 6}, {"dim", 4}, {"attend_bias", true}}, ctx(0, "t")); })
                .find("attend_bias"),
            std::string::npos);

  smp_nn::Select first(Json{{"dim", 1}}, ctx(0));
  check_against(first, {x}, [](Params&, std::vector<Tensor>& in) { return in[0].select(1, 0); });
  smp_nn::Select last(Json{{"dim", -2}, {"index", -1}}, ctx(0));
  EXPECT_TRUE(at::equal(last.forward(Call{"forward", {x}})[0], x.select(1, 2)));
  EXPECT_NE(error_of([&] { smp_nn::Select(Json{{"dim", 1}, {"index", 3}}, ctx(0, "sel")).forward(Call{"forward", {x}}); })
                .find("cannot select index 3"),
            std::string::npos);
  EXPECT_NE(error_of([] { smp_nn::Select(Json::object(), ctx(0, "sel")); }).find("'dim'"), std::string::npos);
  smp_nn::Tanh tanh(Json::object(), ctx(0));
  check_against(tanh, {x}, [](Params&, std::vector<Tensor>& in) { return at::tanh(in[0]); });
}

TEST_F(NnTest, Utilities) {
  Tensor a = randn({3, 4}, 22), b = randn({3, 4}, 23), c = randn({3, 2}, 24);
  smp_nn::Add add(Json::object(), ctx(0));
  check_against(add, {a, b, b}, [](Params&, std::vector<Tensor>& in) { return in[0] + in[1] + in[2]; });
  smp_nn::Concat cat(Json{{"dim", 1}}, ctx(0));
  check_against(cat, {a, c}, [](Params&, std::vector<Tensor>& in) { return at::cat({in[0], in[1]}, 1); });
  smp_nn::Relu relu(Json::object(), ctx(0));
  check_against(relu, {a}, [](Params&, std::vector<Tensor>& in) { return in[0].clamp_min(0); });
  smp_nn::Gelu gelu(Json::object(), ctx(0));
  check_against(gelu, {a}, [](Params&, std::vector<Tensor>& in) {
    return 0.5 * in[0] * (1 + at::erf(in[0] / std::sqrt(2.0)));
  });
  smp_nn::Gelu gelu_t(Json{{"approximate", "tanh"}}, ctx(0));
  check_against(gelu_t, {a}, [](Params&, std::vector<Tensor>& in) { return ref_gelu_tanh(in[0]); });
  smp_nn::MseLoss mse(Json::object(), ctx(0));
  check_against(mse, {a, b}, [](Params&, std::vector<Tensor>& in) { return (in[0] - in[1]).pow(2).mean(); });
  smp_nn::Dropout off(Json{{"p", 0.5}}, ctx(0));  // not training: identity
  check_against(off, {a}, [](Params&, std::vector<Tensor>& in) { return in[0] * 1; });
}

// ---- dropout determinism ----
TEST_F(NnTest, DropoutMasksFollowTheSeed) {
  smp_nn::Dropout d(Json{{"p", 0.25}}, ctx(0));
  Tensor x = at::ones({64, 64});
  Tensor y1 = d.forward(Call{"forward", {x}, true, 7})[0];
  Tensor y2 = d.forward(Call{"forward", {x}, true, 7})[0];
  Tensor y3 = d.forward(Call{"forward", {x}, true, 8})[0];
  EXPECT_TRUE(at::equal(y1, y2));
  EXPECT_FALSE(at::equal(y1, y3));
  double kept = y1.ne(0).to(at::kFloat).mean().item<double>();
  EXPECT_NEAR(kept, 0.75, 0.03);
  EXPECT_TRUE(close(y1.masked_select(y1.ne(0)), at::full({y1.ne(0).sum().item<int64_t>()}, 1.0 / 0.75)));

  Json c{{"hidden", 8}, {"heads", 2}, {"dropout", 0.3}};
  smp_nn::TransformerLayer l(c, ctx(30));
  Tensor in = randn({2, 4, 8}, 31);
  Tensor t1 = l.forward(Call{"forward", {in}, true, 5})[0];
  EXPECT_TRUE(at::equal(t1, l.forward(Call{"forward", {in}, true, 5})[0]));
  EXPECT_FALSE(at::equal(t1, l.forward(Call{"forward", {in}, true, 6})[0]));
  // eval mode = the same layer without dropout
  c["dropout"] = 0.0;
  smp_nn::TransformerLayer l0(c, ctx(30));
  EXPECT_TRUE(at::equal(l.forward(Call{"forward", {in}, false, 5})[0], l0.forward(Call{"forward", {in}, true, 5})[0]));
}

// ---- init ----
std::map<std::string, Tensor> params_of(Module& m) {
  std::map<std::string, Tensor> out;
  for (auto& p : m.parameters()) out[p.name] = p.tensor.detach();
  return out;
}

TEST_F(NnTest, InitIsDeterministicPerSeed) {
  Json c{{"hidden", 8}, {"heads", 2}, {"ffn", 16}};
  smp_nn::TransformerLayer a(c, ctx(40)), b(c, ctx(40)), other(c, ctx(41));
  auto pa = params_of(a), pb = params_of(b), po = params_of(other);
  ASSERT_EQ(pa.size(), 16u);
  for (auto& [n, t] : pa) {
    EXPECT_TRUE(at::equal(t, pb[n])) << n;
    if (n.find("weight") != std::string::npos && n.find("ln") == std::string::npos) {
      EXPECT_FALSE(at::equal(t, po[n])) << n;
    }
  }
  EXPECT_TRUE(at::equal(pa["ln1.weight"], at::ones({8})));
  EXPECT_TRUE(at::equal(pa["ln1.bias"], at::zeros({8})));
  EXPECT_TRUE(at::equal(pa["attn.q.bias"], at::zeros({8})));
  EXPECT_TRUE(at::equal(pa["mlp.proj.bias"], at::zeros({8})));

  smp_nn::Embedding e(Json{{"num", 200}, {"dim", 50}, {"init_std", 0.02}}, ctx(42));
  double std = params_of(e)["weight"].std().item<double>();
  EXPECT_NEAR(std, 0.02, 0.001);
}

TEST_F(NnTest, InitOrderIsTheDocumentedOne) {
  // transformer_layer draws ln1 (nothing), attention (q, k, v, out), ln2, mlp (fc, proj)
  // from one generator: a standalone attention with the same seed and stds has the same
  // weights, and the mlp continues the same stream.
  Json c{{"hidden", 8}, {"heads", 2}, {"ffn", 16}, {"init_std", 0.3}, {"out_init_std", 0.1}};
  smp_nn::TransformerLayer l(c, ctx(50));
  Json attn = c;
  attn.erase("ffn");  // a standalone attention takes no ffn
  smp_nn::Attention a(attn, ctx(50));
  auto pl = params_of(l), pa = params_of(a);
  for (const char* n : {"q.weight", "k.weight", "v.weight", "out.weight"})
    EXPECT_TRUE(at::equal(pl[std::string("attn.") + n], pa[n])) << n;
  smp::sdk::InitStream gen(50);
  for (int i = 0; i < 3; ++i) gen.normal({8, 8}, 0.3);
  gen.normal({8, 8}, 0.1);
  EXPECT_TRUE(at::equal(pl["mlp.fc.weight"], gen.normal({16, 8}, 0.3)));
  EXPECT_TRUE(at::equal(pl["mlp.proj.weight"], gen.normal({8, 16}, 0.1)));
}

// Delayed initialisation: any slice along any dimension is generated alone and
// equals that slice of the full draw, bit for bit; the values are N(0, std).
TEST_F(NnTest, InitStreamSlicesEqualTheFullDraw) {
  const std::vector<int64_t> full = {6, 4, 10};
  at::Tensor whole = smp::sdk::InitStream(7).normal(full, 0.5);
  for (int64_t dim = 0; dim < 3; ++dim)
    for (int rank = 0; rank < 2; ++rank) {
      auto slice = smp::sdk::Slice::part(dim, full[dim], rank, 2);
      at::Tensor part = smp::sdk::InitStream(7).normal(full, 0.5, slice);
      EXPECT_TRUE(at::equal(part, whole.narrow(dim, slice.begin, slice.length))) << "dim " << dim << " rank " << rank;
    }
  smp::sdk::InitStream s(3);
  at::Tensor a = s.normal({100000}, 2.0), b = s.normal({100000}, 2.0);
  EXPECT_FALSE(at::equal(a, b)) << "each draw is its own stream";
  EXPECT_NEAR(a.mean().item<double>(), 0.0, 0.03);
  EXPECT_NEAR(a.std().item<double>(), 2.0, 0.03);
}

// Deferred init (ABI 2.2): under a DeferredInitScope a layer's parameters come
// without storage, each with its initialiser; filling any range of a tensor
// from it gives exactly those elements of the tensor made without deferring
// (a tp slice included), so a rank can generate only its ZeRO-3 shard.
TEST_F(NnTest, DeferredInitDescribesEveryParameterExactly) {
  const Json cfg = {{"hidden", 8}, {"heads", 2}, {"ffn", 16}, {"dropout", 0.0}};
  smp_nn::TransformerLayer made(cfg, ctx(50, "blocks.0"));
  smp::sdk::DeferredInit record;
  std::unique_ptr<smp_nn::TransformerLayer> deferred;
  {
    smp::sdk::DeferredInitScope scope(&record);
    deferred = std::make_unique<smp_nn::TransformerLayer>(cfg, ctx(50, "blocks.0"));
  }
  auto want = params_of(made);
  std::map<std::string, Tensor> got;  // the module's own tensors (detach() would make new ones)
  for (auto& p : deferred->parameters()) got[p.name] = p.tensor;
  ASSERT_EQ(want.size(), got.size());
  for (const auto& [name, t] : got) {
    EXPECT_EQ(t.storage().nbytes(), 0u) << name;
    EXPECT_EQ(t.sizes(), want[name].sizes()) << name;
    const smp::sdk::InitSpec* spec = record.find(t);
    ASSERT_NE(spec, nullptr) << name;
    // The whole tensor, and an odd range of it (a shard boundary falls anywhere).
    EXPECT_TRUE(at::equal(smp::sdk::materialise_init(*spec), want[name].detach())) << name;
    const int64_t n = t.numel(), first = n / 3, count = std::max<int64_t>(1, n / 2 - 1);
    at::Tensor part = at::empty({count}, at::kFloat);
    smp::sdk::fill_init(*spec, first, count, part.data_ptr<float>());
    EXPECT_TRUE(at::equal(part, want[name].detach().reshape(-1).narrow(0, first, count))) << name;
  }
  // A column-split (dim 1) slice of a draw, filled by ranges, equals that slice.
  smp::sdk::InitSpec col;
  col.kind = SMP_PARAM_INIT_NORMAL;
  col.key = 99;
  col.value = 0.5;
  col.full = {6, 10};
  col.slice = smp::sdk::Slice::part(1, 10, 1, 2);
  smp::sdk::InitSpec whole = col;
  whole.slice = smp::sdk::Slice::all();
  at::Tensor expected = smp::sdk::materialise_init(whole).narrow(1, 5, 5).contiguous().reshape(-1);
  at::Tensor filled = at::empty({30}, at::kFloat);
  smp::sdk::fill_init(col, 0, 7, filled.data_ptr<float>());
  smp::sdk::fill_init(col, 7, 23, filled.data_ptr<float>() + 7);
  EXPECT_TRUE(at::equal(filled, expected));
}

// NCF's kinds and the padded vocabulary: ranking_metrics counts a tie as ahead
// of the held-out item; cross_entropy with real_vocab equals the loss over the
// real classes only (the padded logits weigh nothing, even when large).
TEST_F(NnTest, RankingMetricsMulBceAndPaddedCrossEntropy) {
  const Tensor scores = at::tensor({5.f, 1.f, 2.f, 0.f, 3.f, 1.f, 2.f, 2.f, 1.f}).view({3, 3, 1});
  for (int64_t k : {1, 2}) {
    smp_nn::RankingMetrics m(Json{{"k", k}}, ctx(0, "rank"));
    auto out = m.forward({"forward", {scores}});
    // Ranks of the held-out item: 0, 2, 1 (the tie in row 2 counts ahead).
    EXPECT_DOUBLE_EQ(out[0].item<double>(), k == 1 ? 1.0 : 2.0) << k;
    EXPECT_NEAR(out[1].item<double>(), k == 1 ? 1.0 : 1.0 + 1.0 / std::log2(3.0), 1e-12) << k;
    EXPECT_DOUBLE_EQ(out[2].item<double>(), 3.0);
  }
  smp_nn::Mul mul(Json::object(), ctx(0, "mul"));
  const Tensor a = at::randn({2, 3}), b = at::randn({2, 3});
  EXPECT_TRUE(at::equal(mul.forward({"forward", {a, b}})[0], a * b));
  smp_nn::BceWithLogits bce(Json::object(), ctx(0, "bce"));
  const Tensor y = at::tensor({1.f, 0.f, 0.f, 1.f, 0.f, 1.f}).view({2, 3});
  EXPECT_TRUE(at::allclose(bce.forward({"forward", {a, y}})[0], at::binary_cross_entropy_with_logits(a, y)));
  smp_nn::CrossEntropy padded(Json{{"vocab", 4}, {"real_vocab", 3}}, ctx(0, "loss"));
  const Tensor logits = at::randn({2, 5, 4}), targets = at::randint(0, 3, {2, 5}, at::kLong);
  Tensor big = logits.clone();
  big.select(-1, 3).fill_(50.f);  // a padded class's logit, large: it must not count
  EXPECT_TRUE(at::allclose(padded.forward({"forward", {big, targets}})[0],
                           at::cross_entropy_loss(logits.narrow(-1, 0, 3).reshape({-1, 3}), targets.reshape({-1}))));
}

// norm = "post" (BERT): the layer ends in its second layer norm, so at init
// (weight 1, bias 0) every token comes out with mean 0 and variance 1; pre-LN's does not.
TEST_F(NnTest, PostNormLayerEndsInALayerNorm) {
  Json c{{"hidden", 16}, {"heads", 4}, {"ffn", 32}, {"causal", false}};
  smp_nn::TransformerLayer pre(c, ctx(60, "blk"));
  c["norm"] = "post";
  smp_nn::TransformerLayer post(c, ctx(60, "blk"));
  const Tensor x = at::randn({2, 5, 16}) * 3 + 1;
  const Tensor y = post.forward({"forward", {x}})[0], z = pre.forward({"forward", {x}})[0];
  EXPECT_TRUE(at::allclose(y.mean(-1), at::zeros({2, 5}), 1e-5, 1e-5));
  EXPECT_TRUE(at::allclose(y.var(-1, /*unbiased=*/false), at::ones({2, 5}), 1e-3, 1e-3));
  EXPECT_FALSE(at::allclose(z.mean(-1), at::zeros({2, 5}), 1e-3, 1e-3));
  EXPECT_NE(error_of([] { smp_nn::TransformerLayer(Json{{"hidden", 8}, {"heads", 2}, {"norm", "mid"}}, ctx(0, "b")); })
                .find("config key 'norm' must be \"pre\" or \"post\", got \"mid\""),
            std::string::npos);
}

// ---- bad configs and inputs name the node and the key ----
std::string error_of(const std::function<void()>& f) { return smp_test::error_of<smp::sdk::Error>(f); }

TEST_F(NnTest, BadConfigsNameNodeAndKey) {
  auto msg = error_of([] { smp_nn::Attention(Json{{"hidden", 16}}, ctx(0, "blocks.3.attn")); });
  EXPECT_NE(msg.find("blocks.3.attn"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'heads'"), std::string::npos) << msg;
  msg = error_of([] { smp_nn::Attention(Json{{"hidden", 10}, {"heads", 4}}, ctx(0, "a")); });
  EXPECT_NE(msg.find("hidden 10 not divisible by heads 4"), std::string::npos) << msg;
  msg = error_of([] { smp_nn::Linear(Json{{"in", "eight"}, {"out", 4}}, ctx(0, "head")); });
  EXPECT_NE(msg.find("node 'head'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'in' has the wrong type"), std::string::npos) << msg;
  msg = error_of([] { smp_nn::Linear(Json{{"in", 0}, {"out", 4}}, ctx(0, "head")); });
  EXPECT_NE(msg.find("'in' must be > 0"), std::string::npos) << msg;
  msg = error_of([] { smp_nn::Dropout(Json{{"p", 1.5}}, ctx(0, "drop")); });
  EXPECT_NE(msg.find("'p' must be in [0, 1)"), std::string::npos) << msg;
  msg = error_of([] { smp_nn::Mlp(Json{{"hidden", 8}, {"dropout", -0.1}}, ctx(0, "mlp")); });
  EXPECT_NE(msg.find("'dropout'"), std::string::npos) << msg;
  msg = error_of([] { smp_nn::Gelu(Json{{"approximate", "fast"}}, ctx(0, "g")); });
  EXPECT_NE(msg.find("'approximate'"), std::string::npos) << msg;
  // No key is accepted and then ignored: a misspelt or foreign key is refused by name.
  msg = error_of([] { smp_nn::Linear(Json{{"in", 8}, {"out", 4}, {"biass", false}}, ctx(0, "head")); });
  EXPECT_NE(msg.find("node 'head': unknown config key 'biass' (known: in, out, bias, init_std"), std::string::npos)
      << msg;
  msg = error_of([] { smp_nn::TransformerLayer(Json{{"hidden", 8}, {"heads", 2}, {"droput", 0.1}}, ctx(0, "b")); });
  EXPECT_NE(msg.find("unknown config key 'droput'"), std::string::npos) << msg;
  msg = error_of([] { smp_nn::Relu(Json{{"inplace", true}}, ctx(0, "act")); });
  EXPECT_NE(msg.find("node 'act': unknown config key 'inplace' (known: none)"), std::string::npos) << msg;
}

TEST_F(NnTest, BadInputsNameTheNode) {
  smp_nn::Embedding e(Json{{"num", 10}, {"dim", 4}}, ctx(0, "wte"));
  auto msg = error_of([&] { e.forward(Call{"forward", {at::full({2, 3}, 10, at::kLong)}}); });
  EXPECT_NE(msg.find("node 'wte': ids must be in [0, 10)"), std::string::npos) << msg;
  msg = error_of([&] { e.forward(Call{"forward", {at::zeros({2, 3})}}); });
  EXPECT_NE(msg.find("ids must be int64"), std::string::npos) << msg;
  msg = error_of([&] { e.forward(Call{"project", {at::zeros({2, 3})}}); });
  EXPECT_NE(msg.find("unknown method 'project'"), std::string::npos) << msg;
  smp_nn::PositionEmbedding p(Json{{"max_len", 4}, {"dim", 2}}, ctx(0, "wpe"));
  msg = error_of([&] { p.forward(Call{"forward", {at::zeros({1, 5, 2})}}); });
  EXPECT_NE(msg.find("sequence length 5 exceeds max_len 4"), std::string::npos) << msg;
  smp_nn::TransformerLayer l(Json{{"hidden", 8}, {"heads", 2}}, ctx(0, "h.0"));
  msg = error_of([&] { l.forward(Call{"forward", {at::zeros({1, 3, 8}), at::ones({1, 4})}}); });
  EXPECT_NE(msg.find("padding mask"), std::string::npos) << msg;
  smp_nn::CrossEntropy ce(Json::object(), ctx(0, "loss"));
  msg = error_of([&] { ce.forward(Call{"forward", {at::zeros({2, 3, 5}), at::zeros({2, 4}, at::kLong)}}); });
  EXPECT_NE(msg.find("node 'loss'"), std::string::npos) << msg;
}

// ---- through the plugin's C ABI ----
class NnPlugin : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    smp::sdk::host_slot() = smp::host_api();
    lib_ = ::dlopen((std::string(SMP_PLUGIN_DIR) + "/smp_nn.so").c_str(), RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(lib_, nullptr) << ::dlerror();
    auto entry = reinterpret_cast<smp_plugin_entry_fn>(::dlsym(lib_, SMP_PLUGIN_ENTRY_SYMBOL));
    ASSERT_NE(entry, nullptr);
    smp_error* err = nullptr;
    desc_ = entry(smp::host_api(), &err);
    ASSERT_NE(desc_, nullptr) << smp::consume_error(err);
  }
  const smp_module_kind* kind(const std::string& name) {
    for (size_t i = 0; i < desc_->n_module_kinds; ++i)
      if (name == desc_->module_kinds[i]->name) return desc_->module_kinds[i];
    return nullptr;
  }
  static void* lib_;
  static const smp_plugin_descriptor* desc_;
};
void* NnPlugin::lib_ = nullptr;
const smp_plugin_descriptor* NnPlugin::desc_ = nullptr;

TEST_F(NnPlugin, RegistersEveryKind) {
  EXPECT_EQ(std::string(desc_->name), "smp_nn");
  // Its only rules are the sequence axis' (parallel.cp): each keeps its kind.
  EXPECT_EQ(desc_->n_rules, 18u);  // select (BERT's [CLS] under cp) among them
  for (size_t i = 0; i < desc_->n_rules; ++i) {
    EXPECT_EQ(std::string(desc_->rules[i]->axis), "cp");
    EXPECT_EQ(std::string(desc_->rules[i]->dist_kind), desc_->rules[i]->kind);
  }
  for (const char* k : {"embedding", "position_embedding", "layer_norm", "rms_norm", "linear", "attention", "mlp", "swiglu_mlp",
                        "transformer_layer", "cross_entropy", "add", "concat", "relu", "gelu", "dropout", "mse_loss",
                        "embedding_table", "mul", "bce_with_logits", "ranking_metrics", "select", "tanh", "moe",
                        "moe_loss"})
    EXPECT_NE(kind(k), nullptr) << k;
  EXPECT_EQ(desc_->n_module_kinds, 24u);
}

TEST_F(NnPlugin, CreateForwardAndErrorsThroughTheAbi) {
  const smp_module_kind* k = kind("linear");
  ASSERT_NE(k, nullptr);
  smp_module_context c{};
  c.struct_size = SMP_MODULE_CONTEXT_STRUCT_SIZE;
  c.node_name = "model.head";
  c.init_seed = 77;
  smp_module* m = nullptr;
  std::string msg = smp::consume_error(k->create(k->state, R"({"in": 4})", &c, &m));
  EXPECT_NE(msg.find("model.head"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'out' is missing"), std::string::npos) << msg;

  ASSERT_EQ(smp::consume_error(k->create(k->state, R"({"in": 4, "out": 3})", &c, &m)), "");
  Tensor x = randn({2, 4}, 78);
  smp_tensor* in = smp::make_tensor_handle(x);
  smp_tensor* out = nullptr;
  smp_forward_args a{};
  a.struct_size = SMP_FORWARD_ARGS_STRUCT_SIZE;
  a.inputs = &in;
  a.n_inputs = 1;
  a.outputs = &out;
  a.n_outputs = 1;
  ASSERT_EQ(smp::consume_error(k->forward(m, &a)), "");
  smp_nn::Linear direct(Json{{"in", 4}, {"out", 3}}, ctx(77));
  EXPECT_TRUE(close(smp::tensor_of(out), direct.forward(Call{"forward", {x}})[0], 0, 0));
  smp::host_api()->tensor_release(out);

  a.method = "attend";
  msg = smp::consume_error(k->forward(m, &a));
  EXPECT_NE(msg.find("unknown method 'attend'"), std::string::npos) << msg;
  smp::host_api()->tensor_release(in);
  k->destroy(m);
}

}  // namespace
