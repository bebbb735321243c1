// Device-generic test of every module kind: the kind is created through the C ABI
// (PluginRegistry + ModuleInstance, as the runtime does) on a device, in fp32 or bf16,
// and compared with the same kind on the CPU in fp32: same seed → same initial
// parameters (on the device), same outputs and gradients (inputs' and parameters'),
// within the dtype's tolerance. Dropout masks come from the call's seed, so they are
// equal across devices too.
//
// Runs on the CPU here (fp32: the device path end to end; bf16: the reduced-precision
// kernels against fp32) and on CUDA when LibTorch has it and a GPU is present;
// otherwise the CUDA cases skip, naming why.
#include <smp/plugin_registry.h>

#include "plugin/module_instance.h"
#include "plugin/plugin_tables.h"

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <c10/core/GradMode.h>
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace {

using at::Tensor;

constexpr int64_t B = 2, S = 8, H = 16, V = 32;

struct Case {
  std::string kind, config;
  std::function<std::vector<Tensor>()> inputs;  // CPU, fp32 / int64
  std::string method = "forward";
};

Tensor randn(at::IntArrayRef shape, uint64_t seed) {
  at::Generator g = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::empty(shape, at::kFloat).normal_(0, 1, g);
}
Tensor ids(at::IntArrayRef shape, int64_t hi, uint64_t seed) {
  at::Generator g = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randint(hi, shape, g, at::TensorOptions().dtype(at::kLong));
}
Tensor act() { return randn({B, S, H}, 11); }
Tensor pad_mask() {  // sample 1's last two positions are padding
  Tensor m = at::ones({B, S});
  m.select(0, 1).narrow(0, S - 2, 2).fill_(0);
  return m;
}

std::vector<Case> cases() {
  const std::string attn = R"({"hidden":16,"heads":4})";
  const std::string attn_drop = R"({"hidden":16,"heads":4,"dropout":0.1})";
  const std::string layer = R"({"hidden":16,"heads":4,"ffn":32,"dropout":0.1})";
  return {
      {"embedding", R"({"num":32,"dim":16})", [] { return std::vector<Tensor>{ids({B, S}, V, 3)}; }},
      {"embedding", R"({"num":32,"dim":16})", [] { return std::vector<Tensor>{act()}; }, "attend"},
      {"position_embedding", R"({"max_len":8,"dim":16})", [] { return std::vector<Tensor>{act()}; }},
      {"layer_norm", R"({"dim":16})", [] { return std::vector<Tensor>{act()}; }},
      {"linear", R"({"in":16,"out":12})", [] { return std::vector<Tensor>{act()}; }},
      {"attention", attn, [] { return std::vector<Tensor>{act()}; }},
      {"attention", attn_drop, [] { return std::vector<Tensor>{act()}; }},
      {"attention", attn, [] { return std::vector<Tensor>{act(), pad_mask()}; }},
      {"mlp", R"({"hidden":16,"ffn":32,"dropout":0.1})", [] { return std::vector<Tensor>{act()}; }},
      {"transformer_layer", layer, [] { return std::vector<Tensor>{act()}; }},
      {"cross_entropy", "{}", [] { return std::vector<Tensor>{randn({B, S, V}, 5), ids({B, S}, V, 6)}; }},
      {"add", "{}", [] { return std::vector<Tensor>{act(), randn({B, S, H}, 7)}; }},
      {"concat", R"({"dim":-1})", [] { return std::vector<Tensor>{act(), randn({B, S, 4}, 7)}; }},
      {"relu", "{}", [] { return std::vector<Tensor>{act()}; }},
      {"gelu", R"({"approximate":"tanh"})", [] { return std::vector<Tensor>{act()}; }},
      {"dropout", R"({"p":0.25})", [] { return std::vector<Tensor>{act()}; }},
      {"mse_loss", "{}", [] { return std::vector<Tensor>{act(), randn({B, S, H}, 8)}; }},
      {"embedding_table", R"({"num":32,"dim":16})", [] { return std::vector<Tensor>{ids({B, 5}, V, 9)}; }},
      // smp_tp's kinds on a one-rank tp group (the null mesh).
      {"tp_linear", R"({"in":16,"out":12})", [] { return std::vector<Tensor>{act()}; }},
      {"column_parallel_linear", R"({"in":16,"out":12})", [] { return std::vector<Tensor>{act()}; }},
      {"row_parallel_linear", R"({"in":16,"out":12})", [] { return std::vector<Tensor>{act()}; }},
      {"vocab_parallel_embedding", R"({"num":32,"dim":16})", [] { return std::vector<Tensor>{ids({B, S}, V, 3)}; }},
      {"vocab_parallel_embedding", R"({"num":32,"dim":16})", [] { return std::vector<Tensor>{act()}; }, "attend"},
      {"vocab_parallel_cross_entropy", "{}",
       [] { return std::vector<Tensor>{randn({B, S, V}, 5), ids({B, S}, V, 6)}; }},
      {"parallel_attention", attn_drop, [] { return std::vector<Tensor>{act()}; }},
      {"parallel_mlp", R"({"hidden":16,"ffn":32})", [] { return std::vector<Tensor>{act()}; }},
      {"parallel_transformer_layer", layer, [] { return std::vector<Tensor>{act()}; }},
      {"dist_position_embedding", R"({"max_len":8,"dim":16})", [] { return std::vector<Tensor>{act()}; }},
      {"dist_layer_norm", R"({"dim":16})", [] { return std::vector<Tensor>{act()}; }},
      {"dist_dropout", R"({"p":0.25})", [] { return std::vector<Tensor>{act()}; }},
      {"sharded_embedding_table", R"({"num":32,"dim":16})", [] { return std::vector<Tensor>{ids({B, 5}, V, 9)}; }},
  };
}

smp::PluginRegistry& registry() {
  static smp::PluginRegistry* reg = [] {
    auto* r = new smp::PluginRegistry();
    r->load(std::string(SMP_PLUGIN_DIR) + "/smp_nn.so");
    r->load(std::string(SMP_PLUGIN_DIR) + "/smp_tp.so");
    return r;
  }();
  return *reg;
}

// One forward + backward: outputs, then the inputs' and parameters' gradients, all on
// the CPU in fp32 for comparison. The loss weights are fixed per output shape.
struct Result {
  std::vector<Tensor> values;  // outputs..., input grads..., param grads...
  std::vector<std::string> names;
};

Result run(const Case& c, const c10::Device& device, at::ScalarType dtype, std::vector<std::string>* param_devices) {
  const smp_module_kind* kind = smp::PluginTables(registry()).module_kind(c.kind);
  if (!kind) throw std::runtime_error("no module kind '" + c.kind + "' in smp_nn.so / smp_tp.so");
  const std::string key = "net." + c.kind, parallel = "{}";
  smp_module_context ctx = smp::module_context(key, 1234, nullptr, parallel, device);
  smp::ModuleInstance m(kind, registry().provider("module kind", c.kind), key, c.config, ctx);
  std::vector<Tensor> params;
  {
    c10::NoGradGuard no_grad;
    for (const auto& p : m.parameters()) {
      if (param_devices) param_devices->push_back(p.name + "@" + p.tensor.device().str());
      // As MasterWeights does for bf16/fp16 training: the module computes in `dtype`.
      if (dtype != at::kFloat) p.tensor.set_data(p.tensor.to(dtype));
      params.push_back(p.tensor);
    }
  }
  std::vector<Tensor> inputs;
  for (Tensor x : c.inputs()) {
    x = x.to(device);
    if (x.is_floating_point()) x = x.to(dtype).requires_grad_(true);
    inputs.push_back(x);
  }
  std::vector<Tensor> outs = m.call(key, c.method, inputs, 1, /*training=*/true, /*rng_seed=*/99);
  Result r;
  Tensor loss = at::zeros({}, at::TensorOptions().device(device).dtype(at::kFloat));
  for (size_t i = 0; i < outs.size(); ++i) {
    r.values.push_back(outs[i].detach().to(at::kCPU, at::kFloat));
    r.names.push_back("output " + std::to_string(i));
    if (outs[i].is_floating_point() && outs[i].requires_grad())
      loss = loss + (outs[i].to(at::kFloat) * randn(outs[i].sizes(), 77 + i).to(device)).sum();
  }
  if (loss.requires_grad()) loss.backward();
  for (size_t i = 0; i < inputs.size(); ++i)
    if (inputs[i].is_floating_point()) {
      r.values.push_back(inputs[i].grad().defined() ? inputs[i].grad().to(at::kCPU, at::kFloat) : Tensor());
      r.names.push_back("grad of input " + std::to_string(i));
    }
  for (size_t i = 0; i < params.size(); ++i) {
    r.values.push_back(params[i].grad().defined() ? params[i].grad().to(at::kCPU, at::kFloat) : Tensor());
    r.names.push_back("grad of " + m.parameters()[i].name);
  }
  return r;
}

// fp32: elementwise allclose. bf16 (8 bits of mantissa): the error relative to the
// tensor's size, ||a - b|| < 3e-2 ||b|| + 1e-3, since elementwise bounds break on
// values near zero; the absolute 1e-3 admits gradients that are zero analytically
// (attention's key bias: softmax ignores a shift shared by every key), where bf16
// leaves rounding noise of ~1e-5.
::testing::AssertionResult close(const Tensor& got, const Tensor& want, at::ScalarType dtype) {
  if (got.defined() != want.defined()) return ::testing::AssertionFailure() << "defined on one side only";
  if (!got.defined()) return ::testing::AssertionSuccess();
  if (got.sizes() != want.sizes()) return ::testing::AssertionFailure() << got.sizes() << " vs " << want.sizes();
  if (dtype == at::kFloat) {
    if (at::allclose(got, want, 1e-3, 1e-5)) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "max abs error " << (got - want).abs().max().item<double>();
  }
  const double err = (got - want).norm().item<double>(), ref = want.norm().item<double>();
  if (err <= 3e-2 * ref + 1e-3) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "relative error " << err / ref << " (|ref| " << ref << ")";
}

struct Param {
  std::string device;  // "cpu" | "cuda"
  at::ScalarType dtype;
};

void PrintTo(const Param& p, std::ostream* os) { *os << p.device << " " << c10::toString(p.dtype); }

class DeviceGeneric : public ::testing::TestWithParam<Param> {};

TEST_P(DeviceGeneric, EveryKindMatchesCpuFp32) {
  const Param p = GetParam();
  if (p.device == "cuda") {
    if (!at::hasCUDA()) GTEST_SKIP() << "this LibTorch has no CUDA (build against a CUDA LibTorch, SMP_TORCH=pip)";
    if (at::getNumGPUs() == 0) GTEST_SKIP() << "no GPU on this machine";
  }
  const c10::Device device = p.device == "cuda" ? c10::Device(c10::kCUDA, 0) : c10::Device(c10::kCPU);
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.kind + " " + c.config + " method " + c.method);
    Result want = run(c, c10::Device(c10::kCPU), at::kFloat, nullptr);
    std::vector<std::string> where;
    Result got = run(c, device, p.dtype, &where);
    for (const std::string& w : where) EXPECT_NE(w.find("@" + device.str()), std::string::npos) << w;
    ASSERT_EQ(got.values.size(), want.values.size());
    for (size_t i = 0; i < got.values.size(); ++i) EXPECT_TRUE(close(got.values[i], want.values[i], p.dtype))
        << want.names[i];
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, DeviceGeneric,
                         ::testing::Values(Param{"cpu", at::kFloat}, Param{"cpu", at::kBFloat16},
                                           Param{"cuda", at::kFloat}, Param{"cuda", at::kBFloat16}),
                         [](const ::testing::TestParamInfo<Param>& i) {
                           return i.param.device + (i.param.dtype == at::kFloat ? "_fp32" : "_bf16");
                         });

}  // namespace
