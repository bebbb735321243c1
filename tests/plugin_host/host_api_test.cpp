// The host table as plugins see it: errors, tensor handles (reference counts,
// dtype/shape/strides), DLPack export/import without copies, and autograd
// through a plugin module driven only through the ABI.
#include <smp/error.h>
#include "plugin/plugin_tables.h"
#include <smp/mesh.h>
#include <smp/plugin_registry.h>
#include <smp/process_env.h>

#include "comm/process_groups.h"
#include "plugin/host_api.h"
#include "plugin/module_instance.h"

#include <smp/sdk/in_process.hpp>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <ATen/DLConvertor.h>
#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

const smp_host_api& H() { return *smp::host_api(); }

// Owns one handle reference.
// The first extension of `type` on a chain (what a plugin does; the SDK's find_extension).
const smp_extension_base* find_extension(const smp_extension_base* e, uint32_t type) {
  for (; e; e = e->next)
    if (e->type == type) return e;
  return nullptr;
}

struct Handle {
  smp_tensor* h;
  explicit Handle(smp_tensor* t) : h(t) {}
  explicit Handle(const at::Tensor& t) : h(smp::make_tensor_handle(t)) {}
  Handle(const Handle&) = delete;
  ~Handle() { if (h) H().tensor_release(h); }
  const at::Tensor& t() const { return smp::tensor_of(h); }
};

TEST(HostApi, TableDescribesTheCore) {
  const smp_host_api& h = H();
  EXPECT_EQ(h.struct_size, SMP_HOST_API_STRUCT_SIZE);
  EXPECT_EQ(h.abi_major, static_cast<uint32_t>(SMP_ABI_VERSION_MAJOR));
  EXPECT_EQ(h.abi_minor, static_cast<uint32_t>(SMP_ABI_VERSION_MINOR));
  ASSERT_NE(h.torch_version, nullptr);
  EXPECT_STRNE(h.torch_version, "");
  // Every function of ABI 2.0 is filled in (extension_start, before them, is the host's extensions).
  const void* const* first = reinterpret_cast<const void* const*>(&h.error_create);
  const void* const* end = reinterpret_cast<const void* const*>(reinterpret_cast<const char*>(&h) + h.struct_size);
  for (const void* const* f = first; f < end; ++f) EXPECT_NE(*f, nullptr) << "host function #" << (f - first);
}

// ABI 2.4: the host's first extension lists the mesh's axes, whatever their
// names: here a mesh with a dimension only the job knows ("cp") and a join.
TEST(HostApi, TheMeshExtensionEnumeratesEveryAxis) {
  using namespace std::chrono_literals;
  const auto* base = find_extension(H().extension_start, SMP_EXTENSION_MESH);
  ASSERT_NE(base, nullptr);
  ASSERT_GE(base->struct_size, SMP_MESH_EXTENSION_STRUCT_SIZE);
  EXPECT_EQ(base->version, 1u);
  const auto* ext = reinterpret_cast<const smp_mesh_extension*>(base);
  // A NULL mesh: the core's axes, one rank each.
  int32_t count = 0;
  ASSERT_EQ(smp::consume_error(ext->axis_count(nullptr, &count)), "");
  EXPECT_EQ(count, 7);
  smp::MeshOptions opts;
  opts.flatten = {{"dp_cp", {"dp", "cp"}}};
  smp::DeviceMesh mesh(1, 0, {1, 1}, {"cp", "dp"}, opts);
  auto rdv = smp::Rendezvous::connect("127.0.0.1", smp::find_free_port(), 0, 1, 10s);
  smp::ProcessGroups groups(mesh, rdv, smp::CommOptions{});
  ASSERT_EQ(smp::consume_error(ext->axis_count(groups.handle(), &count)), "");
  std::vector<std::string> names;
  std::vector<uint32_t> flags;
  for (int32_t i = 0; i < count; ++i) {
    const char* name = nullptr;
    int32_t size = 0, rank = -1;
    uint32_t f = 0;
    ASSERT_EQ(smp::consume_error(ext->axis_at(groups.handle(), i, &name, &size, &rank, &f)), "");
    names.push_back(name);
    flags.push_back(f);
    EXPECT_EQ(size, 1);
    EXPECT_EQ(rank, 0);
    // Every axis' communicator exists before anyone asks (made with the groups).
    EXPECT_EQ(groups.all().count(name), 1u) << name;
  }
  EXPECT_EQ(names, (std::vector<std::string>{"pp", "dp", "tp", "cp", "ep", "edp", "dp_cp", "mp", "world"}));
  // A job's dimension splits the model; dp splits the batch (ABI 2.8's roles).
  EXPECT_EQ(flags[3], static_cast<uint32_t>(SMP_AXIS_DIMENSION | SMP_AXIS_RULES | SMP_AXIS_SPLITS_MODEL));  // cp
  EXPECT_EQ(flags[1], static_cast<uint32_t>(SMP_AXIS_DIMENSION | SMP_AXIS_DATA | SMP_AXIS_SPLITS_BATCH));   // dp
  EXPECT_EQ(flags[4], static_cast<uint32_t>(SMP_AXIS_DATA | SMP_AXIS_RULES));                      // ep
  EXPECT_EQ(flags[6], static_cast<uint32_t>(SMP_AXIS_DATA));                                       // dp_cp
  EXPECT_NE(smp::consume_error(ext->axis_at(groups.handle(), count, nullptr, nullptr, nullptr, nullptr))
                .find("index 9 is outside [0, 9)"),
            std::string::npos);
  int32_t r = -1, n = -1;
  ASSERT_EQ(smp::consume_error(H().mesh_axis(groups.handle(), "cp", &r, &n)), "");
  EXPECT_EQ(n, 1);
  EXPECT_NE(smp::consume_error(H().mesh_axis(groups.handle(), "sp", &r, &n)).find("no axis named \"sp\""),
            std::string::npos);
  rdv->shutdown(10s);
}

// ABI 2.8: parallel.cp's dimension is listed as the one that splits the
// sequence (what SequenceShare and the kinds' SequenceSplit look for).
TEST(HostApi, TheMeshExtensionFlagsTheSequenceAxis) {
  using namespace std::chrono_literals;
  const auto* ext = reinterpret_cast<const smp_mesh_extension*>(find_extension(H().extension_start, SMP_EXTENSION_MESH));
  ASSERT_NE(ext, nullptr);
  smp::MeshOptions opts;
  opts.sequence = {"cp"};
  smp::DeviceMesh mesh(1, 0, {1, 1}, {"dp", "cp"}, opts);
  auto rdv = smp::Rendezvous::connect("127.0.0.1", smp::find_free_port(), 0, 1, 10s);
  smp::ProcessGroups groups(mesh, rdv, smp::CommOptions{});
  const char* name = nullptr;
  uint32_t f = 0;
  ASSERT_EQ(smp::consume_error(ext->axis_at(groups.handle(), 3, &name, nullptr, nullptr, &f)), "");
  EXPECT_STREQ(name, "cp");
  EXPECT_EQ(f, static_cast<uint32_t>(SMP_AXIS_DIMENSION | SMP_AXIS_RULES | SMP_AXIS_SPLITS_SEQUENCE));
  ASSERT_EQ(smp::consume_error(ext->axis_at(groups.handle(), 0, &name, nullptr, nullptr, &f)), "");
  EXPECT_EQ(f, static_cast<uint32_t>(SMP_AXIS_DIMENSION | SMP_AXIS_SPLITS_MODEL));  // pp
  rdv->shutdown(10s);
}

TEST(HostApi, ErrorsCarryCodeAndMessage) {
  smp_error* e = H().error_create(SMP_ERR_NOT_FOUND, "no such thing");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(H().error_code(e), SMP_ERR_NOT_FOUND);
  EXPECT_STREQ(H().error_message(e), "no such thing");
  EXPECT_EQ(smp::consume_error(e), "no such thing (NOT_FOUND)");  // frees e
  EXPECT_EQ(smp::consume_error(nullptr), "");
  EXPECT_NO_THROW(smp::throw_if_error(nullptr, "ctx"));
  try {
    smp::throw_if_error(H().error_create(SMP_ERR_TIMEOUT, "slow"), "allreduce");
    ADD_FAILURE();
  } catch (const smp::Error& err) {
    EXPECT_STREQ(err.what(), "allreduce: slow (TIMEOUT)");
  }
  smp_error* null_message = H().error_create(SMP_ERR_INTERNAL, nullptr);
  EXPECT_STREQ(H().error_message(null_message), "");
  H().error_destroy(null_message);
}

TEST(HostApi, HandleRetainAndReleaseCountReferences) {
  at::Tensor t = at::arange(6, at::kFloat);
  const auto base = t.use_count();
  smp_tensor* h = smp::make_tensor_handle(t);
  EXPECT_EQ(t.use_count(), base + 1);  // the handle holds the tensor once, however often retained
  H().tensor_retain(h);
  H().tensor_retain(h);
  EXPECT_EQ(t.use_count(), base + 1);
  H().tensor_release(h);
  H().tensor_release(h);
  EXPECT_EQ(t.use_count(), base + 1);
  EXPECT_EQ(smp::tensor_of(h).data_ptr(), t.data_ptr());
  H().tensor_release(h);  // the last reference
  EXPECT_EQ(t.use_count(), base);
  // Null handles are tolerated, never dereferenced.
  H().tensor_retain(nullptr);
  H().tensor_release(nullptr);
  EXPECT_EQ(H().tensor_data(nullptr), nullptr);
  EXPECT_THROW(smp::tensor_of(nullptr), smp::Error);
}

TEST(HostApi, HandleReportsDtypeShapeStridesDeviceAndData) {
  struct Case {
    at::ScalarType aten;
    smp_dtype smp;
  };
  for (Case c : {Case{at::kFloat, SMP_DTYPE_FLOAT32}, Case{at::kDouble, SMP_DTYPE_FLOAT64},
                 Case{at::kHalf, SMP_DTYPE_FLOAT16}, Case{at::kBFloat16, SMP_DTYPE_BFLOAT16},
                 Case{at::kLong, SMP_DTYPE_INT64}, Case{at::kInt, SMP_DTYPE_INT32}, Case{at::kByte, SMP_DTYPE_UINT8},
                 Case{at::kChar, SMP_DTYPE_INT8}, Case{at::kBool, SMP_DTYPE_BOOL}}) {
    Handle h(at::zeros({2, 3}, c.aten));
    EXPECT_EQ(H().tensor_dtype(h.h), c.smp) << c.aten;
  }
  Handle complex(at::zeros({2}, at::kComplexFloat));
  EXPECT_EQ(H().tensor_dtype(complex.h), SMP_DTYPE_UNKNOWN);

  // A non-contiguous view: strides are in elements, data is the view's first element.
  at::Tensor base = at::arange(24, at::kFloat).reshape({2, 3, 4});
  at::Tensor view = base.transpose(0, 2).narrow(1, 1, 2);  // sizes {4, 2, 2}
  Handle h(view);
  ASSERT_EQ(H().tensor_ndim(h.h), 3);
  const int64_t* sizes = H().tensor_sizes(h.h);
  const int64_t* strides = H().tensor_strides(h.h);
  EXPECT_EQ(std::vector<int64_t>(sizes, sizes + 3), (std::vector<int64_t>{4, 2, 2}));
  EXPECT_EQ(std::vector<int64_t>(strides, strides + 3), (std::vector<int64_t>{1, 4, 12}));
  EXPECT_EQ(H().tensor_data(h.h), view.data_ptr());
  EXPECT_EQ(static_cast<float*>(H().tensor_data(h.h)) - base.data_ptr<float>(), 4);
  smp_device_type type = SMP_DEVICE_CUDA;
  int32_t index = -1;
  H().tensor_device(h.h, &type, &index);
  EXPECT_EQ(type, SMP_DEVICE_CPU);
  EXPECT_EQ(index, 0);

  Handle scalar(at::scalar_tensor(3.5, at::kDouble));
  EXPECT_EQ(H().tensor_ndim(scalar.h), 0);
  EXPECT_EQ(*static_cast<double*>(H().tensor_data(scalar.h)), 3.5);
}

TEST(HostApi, AnUndefinedTensorHandleIsSafeToQuery) {
  Handle h{at::Tensor()};
  EXPECT_EQ(H().tensor_dtype(h.h), SMP_DTYPE_UNKNOWN);
  EXPECT_EQ(H().tensor_ndim(h.h), 0);
  EXPECT_EQ(H().tensor_data(h.h), nullptr);
  EXPECT_EQ(H().tensor_strides(h.h), nullptr);
  DLManagedTensor* dl = nullptr;
  smp_error* err = H().tensor_to_dlpack(h.h, &dl);
  EXPECT_NE(err, nullptr);  // an error, not an exception
  smp::consume_error(err);
}

TEST(HostApi, DLPackExportIsZeroCopyAndKeepsTheStorageAlive) {
  at::Tensor base = at::arange(12, at::kFloat).reshape({3, 4});
  at::Tensor view = base.t();  // non-contiguous
  void* data = view.data_ptr();
  DLManagedTensor* dl = nullptr;
  {
    Handle h(view);
    smp::throw_if_error(H().tensor_to_dlpack(h.h, &dl), "to_dlpack");
  }  // handle released: the DLManagedTensor holds its own reference
  ASSERT_NE(dl, nullptr);
  const DLTensor& d = dl->dl_tensor;
  EXPECT_EQ(static_cast<char*>(d.data) + d.byte_offset, data);
  EXPECT_EQ(d.device.device_type, kDLCPU);
  EXPECT_EQ(d.dtype.code, kDLFloat);
  EXPECT_EQ(d.dtype.bits, 32);
  EXPECT_EQ(d.dtype.lanes, 1);
  ASSERT_EQ(d.ndim, 2);
  EXPECT_EQ(d.shape[0], 4);
  EXPECT_EQ(d.shape[1], 3);
  ASSERT_NE(d.strides, nullptr);
  EXPECT_EQ(d.strides[0], 1);
  EXPECT_EQ(d.strides[1], 4);
  // Writing through the DLPack view is seen by the tensor: same memory.
  static_cast<float*>(static_cast<void*>(static_cast<char*>(d.data) + d.byte_offset))[1] = 100.f;
  EXPECT_EQ(base[0][1].item<float>(), 100.f);  // element 1 in memory
  dl->deleter(dl);
}

// An external buffer handed to the core through DLPack: the core must use it in
// place and call the deleter exactly once, when the last handle goes.
struct ExternalBuffer {
  std::vector<float> data{1, 2, 3, 4, 5, 6};
  int64_t shape[2] = {2, 3};
  int64_t strides[2] = {3, 1};
  int deleted = 0;
  DLManagedTensor managed{};
  DLManagedTensor* export_() {
    managed.dl_tensor.data = data.data();
    managed.dl_tensor.device = {kDLCPU, 0};
    managed.dl_tensor.ndim = 2;
    managed.dl_tensor.dtype = {kDLFloat, 32, 1};
    managed.dl_tensor.shape = shape;
    managed.dl_tensor.strides = strides;
    managed.dl_tensor.byte_offset = 0;
    managed.manager_ctx = this;
    managed.deleter = [](DLManagedTensor* self) { ++static_cast<ExternalBuffer*>(self->manager_ctx)->deleted; };
    return &managed;
  }
};

TEST(HostApi, DLPackImportIsZeroCopyAndTakesOwnership) {
  ExternalBuffer buf;
  smp_tensor* h = nullptr;
  smp::throw_if_error(H().tensor_from_dlpack(buf.export_(), &h), "from_dlpack");
  ASSERT_NE(h, nullptr);
  EXPECT_EQ(H().tensor_data(h), buf.data.data());
  EXPECT_EQ(H().tensor_dtype(h), SMP_DTYPE_FLOAT32);
  ASSERT_EQ(H().tensor_ndim(h), 2);
  EXPECT_EQ(H().tensor_sizes(h)[1], 3);
  buf.data[4] = -7.f;
  EXPECT_EQ(smp::tensor_of(h)[1][1].item<float>(), -7.f);
  H().tensor_retain(h);
  H().tensor_release(h);
  EXPECT_EQ(buf.deleted, 0);
  H().tensor_release(h);
  EXPECT_EQ(buf.deleted, 1);

  smp_error* err = H().tensor_from_dlpack(nullptr, &h);
  ASSERT_NE(err, nullptr);
  EXPECT_EQ(H().error_code(err), SMP_ERR_INTERNAL);
  EXPECT_NE(std::string(H().error_message(err)).find("null"), std::string::npos);
  H().error_destroy(err);
}

TEST(HostApi, HandleToDLPackToHandleRoundTripSharesMemory) {
  at::Tensor t = at::randn({5, 4}, at::kDouble).narrow(1, 1, 2);
  Handle a(t);
  DLManagedTensor* dl = nullptr;
  smp::throw_if_error(H().tensor_to_dlpack(a.h, &dl), "to_dlpack");
  smp_tensor* raw = nullptr;
  smp::throw_if_error(H().tensor_from_dlpack(dl, &raw), "from_dlpack");  // takes dl
  Handle b(raw);
  EXPECT_EQ(H().tensor_data(b.h), t.data_ptr());
  EXPECT_EQ(H().tensor_dtype(b.h), SMP_DTYPE_FLOAT64);
  EXPECT_EQ(b.t().sizes(), t.sizes());
  EXPECT_EQ(b.t().strides(), t.strides());
  EXPECT_TRUE(at::equal(b.t(), t));
  b.t().mul_(2);
  EXPECT_TRUE(at::equal(b.t(), t));  // one memory
}

TEST(HostApi, AtenBridgeSharesStorageAndAutograd) {
  at::Tensor x = at::randn({3}).set_requires_grad(true);
  smp_tensor* h = H().tensor_from_aten(&x);
  const at::Tensor& back = *static_cast<const at::Tensor*>(H().tensor_aten(h));
  EXPECT_TRUE(back.is_same(x));
  EXPECT_TRUE(back.requires_grad());
  (back * 2).sum().backward();
  ASSERT_TRUE(x.grad().defined());
  EXPECT_TRUE(at::allclose(x.grad(), at::full({3}, 2.0)));
  H().tensor_release(h);
  EXPECT_EQ(H().tensor_from_aten(nullptr), nullptr);
}

// ---- A plugin module driven through the ABI ----------------------------------

class PluginModule : public ::testing::Test {
 protected:
  void SetUp() override {
    reg_.load(std::string(SMP_TEST_PLUGIN_DIR) + "/example_scale_intree.so");
    kind_ = smp::PluginTables(reg_).module_kind("example_scale");
    ASSERT_NE(kind_, nullptr);
  }
  void TearDown() override {
    for (smp_module* m : modules_) kind_->destroy(m);
  }

  smp_module* create(const std::string& config) {
    smp_module_context ctx{};
    ctx.struct_size = SMP_MODULE_CONTEXT_STRUCT_SIZE;
    ctx.node_name = "blocks.0.scale";
    ctx.init_seed = 1234;
    ctx.device_type = SMP_DEVICE_CPU;
    smp_module* m = nullptr;
    smp::throw_if_error(kind_->create(kind_->state, config.c_str(), &ctx, &m), "create example_scale");
    modules_.push_back(m);
    return m;
  }

  std::vector<std::pair<std::string, at::Tensor>> parameters(smp_module* m) {
    std::vector<std::pair<std::string, at::Tensor>> out;
    smp::throw_if_error(kind_->parameters(
                            m,
                            [](void* user, const smp_param_info* p) {
                              // The handle is borrowed for the call: keep the tensor, not the handle.
                              static_cast<std::vector<std::pair<std::string, at::Tensor>>*>(user)->emplace_back(
                                  p->name, smp::tensor_of(p->tensor));
                            },
                            &out),
                        "parameters");
    return out;
  }

  // One forward through the ABI: handles in, handles out.
  std::vector<at::Tensor> forward(smp_module* m, const std::vector<at::Tensor>& inputs, size_t n_outputs = 1,
                                  const char* method = nullptr) {
    std::vector<smp_tensor*> in;
    for (const auto& t : inputs) in.push_back(smp::make_tensor_handle(t));
    std::vector<smp_tensor*> out(n_outputs, nullptr);
    smp_forward_args args{};
    args.struct_size = SMP_FORWARD_ARGS_STRUCT_SIZE;
    args.method = method;
    args.inputs = in.data();
    args.n_inputs = in.size();
    args.outputs = out.data();
    args.n_outputs = out.size();
    args.training = 1;
    smp_error* err = kind_->forward(m, &args);
    for (smp_tensor* h : in) H().tensor_release(h);
    smp::throw_if_error(err, "forward");
    std::vector<at::Tensor> result;
    for (smp_tensor* h : out) {
      result.push_back(smp::tensor_of(h));
      H().tensor_release(h);
    }
    return result;
  }

  smp::PluginRegistry reg_;
  const smp_module_kind* kind_ = nullptr;
  std::vector<smp_module*> modules_;
};

TEST_F(PluginModule, ExposesItsLearnableParameter) {
  auto params = parameters(create(R"({"factor": 2.5})"));
  ASSERT_EQ(params.size(), 1u);
  EXPECT_EQ(params[0].first, "weight");
  EXPECT_TRUE(params[0].second.requires_grad());
  EXPECT_TRUE(params[0].second.is_leaf());
  EXPECT_FLOAT_EQ(params[0].second.item<float>(), 2.5f);
}

TEST_F(PluginModule, BackwardFromTheCoreReachesPluginParametersAndInputs) {
  smp_module* m = create(R"({"factor": 3.0})");
  at::Tensor w = parameters(m).at(0).second;
  at::Tensor x = at::randn({4, 5}).set_requires_grad(true);
  at::Tensor g = at::randn({4, 5});

  auto y = forward(m, {x});
  ASSERT_EQ(y.size(), 1u);
  EXPECT_TRUE(at::allclose(y[0], x * 3.0));
  EXPECT_TRUE(y[0].requires_grad());
  ASSERT_NE(y[0].grad_fn(), nullptr);  // the plugin's ops are on the core's autograd tape

  (y[0] * g).sum().backward();
  ASSERT_TRUE(x.grad().defined());
  ASSERT_TRUE(w.grad().defined());
  EXPECT_TRUE(at::allclose(x.grad(), g * 3.0));
  EXPECT_NEAR(w.grad().item<double>(), (x * g).sum().item<double>(), 1e-4);

  // A second step accumulates into the same parameter.
  auto y2 = forward(m, {x.detach()});
  (y2[0] * g).sum().backward();
  EXPECT_NEAR(w.grad().item<double>(), 2 * (x * g).sum().item<double>(), 1e-4);

  // An optimizer step on the core side changes what the plugin computes.
  {
    c10::NoGradGuard no_grad;
    w.sub_(w.grad() * 0.0 + 1.0);  // w = 2
  }
  EXPECT_TRUE(at::allclose(forward(m, {x.detach()})[0], x.detach() * 2.0));
}

TEST_F(PluginModule, DLPackInputsFlowThroughAutogradZeroCopy) {
  smp_module* m = create(R"({"factor": -2.0})");
  at::Tensor w = parameters(m).at(0).second;
  ExternalBuffer buf;  // an external framework's memory, imported without a copy
  smp_tensor* raw = nullptr;
  smp::throw_if_error(H().tensor_from_dlpack(buf.export_(), &raw), "from_dlpack");
  Handle in(raw);
  at::Tensor x = in.t();
  ASSERT_EQ(x.data_ptr(), buf.data.data());
  x.set_requires_grad(true);

  at::Tensor y = forward(m, {x}).at(0);
  // Export the output through DLPack: the same memory as the output tensor.
  Handle out(y);
  DLManagedTensor* dl = nullptr;
  smp::throw_if_error(H().tensor_to_dlpack(out.h, &dl), "to_dlpack");
  EXPECT_EQ(dl->dl_tensor.data, y.data_ptr());
  const float* yd = static_cast<const float*>(dl->dl_tensor.data);
  for (size_t i = 0; i < buf.data.size(); ++i) EXPECT_FLOAT_EQ(yd[i], -2.f * buf.data[i]);
  dl->deleter(dl);

  y.sum().backward();
  EXPECT_TRUE(at::allclose(x.grad(), at::full({2, 3}, -2.0)));
  EXPECT_FLOAT_EQ(w.grad().item<float>(), 21.f);  // 1+2+...+6
  EXPECT_EQ(buf.deleted, 0);
}

TEST_F(PluginModule, PluginErrorsComeBackAsErrorsNotCrashes) {
  smp_module* m = create("{}");
  EXPECT_FLOAT_EQ(parameters(m).at(0).second.item<float>(), 1.f);  // factor defaults to 1
  try {
    forward(m, {at::ones({2}), at::ones({2})});
    ADD_FAILURE();
  } catch (const smp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("takes 1 input, got 2"), std::string::npos) << e.what();
  }
  try {
    forward(m, {at::ones({2})}, 1, "attend");
    ADD_FAILURE();
  } catch (const smp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("no method 'attend'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("UNSUPPORTED"), std::string::npos) << e.what();
  }
  try {
    forward(m, {at::ones({2})}, 2);
    ADD_FAILURE();
  } catch (const smp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("expects 2"), std::string::npos) << e.what();
  }
  try {
    create(R"({"factor": "big"})");
    ADD_FAILURE();
  } catch (const smp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("'factor'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("blocks.0.scale"), std::string::npos) << e.what();
  }
  try {
    create("{not json");
    ADD_FAILURE();
  } catch (const smp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("parse"), std::string::npos) << e.what();
  }
}

// A module whose forward fails the way its config says: LibTorch's own
// exception, the program's own, a deliberate smp::sdk::Error, or a host
// function's failure passed on.
struct Failing : smp::sdk::Module {
  std::string how;
  Failing(const smp::sdk::Json& config, const smp::sdk::ModuleContext&) : how(config.value("how", "")) {}
  std::vector<at::Tensor> forward(const smp::sdk::Call& call) override {
    const at::Tensor& x = call.inputs.at(0);
    if (how == "libtorch") return {at::nll_loss(at::log_softmax(x, 1), at::full({x.size(0)}, 7, at::kLong))};
    if (how == "own") throw std::runtime_error("the program's own failure");
    if (how == "sdk") throw smp::sdk::Error(SMP_ERR_UNSUPPORTED, "a deliberate refusal");
    smp_tensor* h = nullptr;
    smp::sdk::check(smp::sdk::host().tensor_from_dlpack(nullptr, &h));  // the host's own failure
    return {x};
  }
};

// Issue 54: a plugin's own exception (a program's in-process module above all)
// reaches the program with its message and its type, as the plugin's; INTERNAL
// stays for failures inside smp, and a deliberate error keeps its code.
TEST(HostApi, APluginsOwnExceptionKeepsItsMessageAndTypeNotInternal) {
  smp::PluginRegistry reg;
  reg.load_source(smp::sdk::InProcessPlugin(
      std::move(smp::sdk::PluginBuilder("mine", "1.0").module<Failing>("mine_failing"))));
  auto message = [&](const std::string& how) -> std::string {
    const std::string key = "head", config = R"({"how": ")" + how + R"("})";
    smp::ModuleInstance m(smp::PluginTables(reg).module_kind("mine_failing"), "mine", key, config, smp::module_context(key, 1, nullptr, "{}"));
    try {
      m.call("loss", "forward", {at::randn({2, 3})}, 1, false, 0);
    } catch (const smp::Error& e) {
      return e.what();
    }
    return "no error";
  };
  const std::string libtorch = message("libtorch");
  EXPECT_NE(libtorch.find("plugin 'mine'"), std::string::npos) << libtorch;
  EXPECT_NE(libtorch.find("node 'loss', forward: Target 7 is out of bounds. (c10::IndexError, thrown by plugin code)"),
            std::string::npos) << libtorch;
  EXPECT_EQ(libtorch.find("INTERNAL"), std::string::npos) << libtorch;
  const std::string own = message("own");
  EXPECT_NE(own.find("forward: the program's own failure (std::runtime_error, thrown by plugin code)"),
            std::string::npos) << own;
  EXPECT_EQ(own.find("INTERNAL"), std::string::npos) << own;
  const std::string sdk = message("sdk");
  EXPECT_NE(sdk.find("a deliberate refusal (UNSUPPORTED)"), std::string::npos) << sdk;
  const std::string host = message("host");
  EXPECT_NE(host.find("(INTERNAL)"), std::string::npos) << host;
  EXPECT_EQ(host.find("thrown by plugin code"), std::string::npos) << host;
}

TEST(HostApi, MeshAxesAndCommunicatorsThroughTheTable) {
  using namespace std::chrono_literals;
  // A NULL mesh is one rank: every axis is rank 0 of 1 and has no communicator.
  int32_t r = -1, n = -1;
  ASSERT_EQ(smp::consume_error(H().mesh_axis(nullptr, "ep", &r, &n)), "");
  EXPECT_EQ(r, 0);
  EXPECT_EQ(n, 1);
  smp_comm* none = reinterpret_cast<smp_comm*>(0x1);
  ASSERT_EQ(smp::consume_error(H().mesh_comm(nullptr, "tp", &none)), "");
  EXPECT_EQ(none, nullptr);
  // Any axis a job may declare ("cp") is one rank of one there (ABI 2.4); a name no axis can have is an error.
  ASSERT_EQ(smp::consume_error(H().mesh_axis(nullptr, "cp", &r, &n)), "");
  EXPECT_EQ(n, 1);
  EXPECT_NE(smp::consume_error(H().mesh_axis(nullptr, "X P", &r, &n)).find("invalid axis name \"X P\""),
            std::string::npos);

  // A one-rank job's mesh: the communicator is made on first use, then the same.
  auto rdv = smp::Rendezvous::connect("127.0.0.1", smp::find_free_port(), 0, 1, 10s);
  smp::DeviceMesh mesh(1, 0, 1, 1, 1);
  smp::ProcessGroups groups(mesh, rdv, smp::CommOptions{});
  smp_comm* ep = nullptr;
  ASSERT_EQ(smp::consume_error(H().mesh_comm(groups.handle(), "ep", &ep)), "");
  ASSERT_NE(ep, nullptr);
  smp_comm* again = nullptr;
  ASSERT_EQ(smp::consume_error(H().mesh_comm(groups.handle(), "ep", &again)), "");
  EXPECT_EQ(ep, again);
  EXPECT_EQ(groups.all().count("ep"), 1u);
  EXPECT_EQ(H().comm_size(ep), 1);

  // Events: an asynchronous all-to-all, waited; one destroyed without a wait.
  Handle in(smp::make_tensor_handle(at::arange(4, at::kFloat)));
  Handle out(smp::make_tensor_handle(at::zeros({4})));
  const int64_t splits[1] = {4};
  smp_event* e = nullptr;
  ASSERT_EQ(smp::consume_error(H().comm_alltoall_async(ep, in.h, out.h, splits, splits, &e)), "");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(smp::consume_error(H().event_wait(e)), "");
  EXPECT_EQ(H().event_ready(e), 1);
  EXPECT_EQ(smp::consume_error(H().event_wait(e)), "");  // again: no error
  H().event_destroy(e);
  EXPECT_TRUE(at::equal(out.t(), at::arange(4, at::kFloat)));
  smp_event* e2 = nullptr;
  ASSERT_EQ(smp::consume_error(H().comm_allreduce_async(ep, out.h, SMP_REDUCE_SUM, &e2)), "");
  H().event_destroy(e2);  // waits first
  EXPECT_NE(smp::consume_error(H().comm_allreduce_async(ep, out.h, SMP_REDUCE_SUM, nullptr)).find("null event"),
            std::string::npos);
  rdv->shutdown(10s);
}

// A failed collective's event returns its error on every wait, not only the
// first: rank 1 of a 2-rank group never joins rank 0's all-reduce, which
// times out (Gloo, 1 s); rank 0 then waits twice and gets the same error.
const smp_comm_extension& comm_ext() {
  const auto* e = find_extension(H().extension_start, SMP_EXTENSION_COMM);
  if (!e) throw std::runtime_error("the host has no SMP_EXTENSION_COMM");
  return *reinterpret_cast<const smp_comm_extension*>(e);
}

TEST(HostApi, AFailedEventReturnsItsErrorOnEveryWait) {
  using namespace std::chrono_literals;
  const int port = smp::find_free_port();
  std::string first, second, from_callback;
  std::atomic<bool> done{false};
  auto rank = [&](int r) {
    struct Done {  // rank 1 waits for this, whichever way rank 0 leaves
      std::atomic<bool>* flag;
      ~Done() {
        if (flag) *flag = true;
      }
    } release{r == 0 ? &done : nullptr};
    auto rdv = smp::Rendezvous::connect("127.0.0.1", port, r, 2, 30s);
    smp::DeviceMesh mesh(2, r, 1, 2, 1);
    smp::CommOptions opts;
    opts.timeout = 1s;
    opts.shm_slot_bytes = 0;  // through Gloo, whose timeout applies per operation
    smp::ProcessGroups groups(mesh, rdv, opts);
    smp_comm* dp = nullptr;
    ASSERT_EQ(smp::consume_error(H().mesh_comm(groups.handle(), "dp", &dp)), "");
    if (r == 0) {
      Handle t(smp::make_tensor_handle(at::ones({4})));
      smp_event* e = nullptr;
      ASSERT_EQ(smp::consume_error(H().comm_allreduce_async(dp, t.h, SMP_REDUCE_SUM, &e)), "");
      // ABI 2.4: an on-ready callback gets the same error.
      smp_event_callback_args cb{};
      cb.struct_size = SMP_EVENT_CALLBACK_ARGS_STRUCT_SIZE;
      cb.event = e;
      cb.callback = [](void* user, const smp_error* err) {
        *static_cast<std::string*>(user) = err ? H().error_message(err) : "(none)";
      };
      cb.user = &from_callback;
      ASSERT_EQ(smp::consume_error(comm_ext().event_on_ready(&cb)), "");
      first = smp::consume_error(H().event_wait(e));
      second = smp::consume_error(H().event_wait(e));
      H().event_destroy(e);  // after the callback has run
    } else {
      while (!done) std::this_thread::sleep_for(10ms);
    }
  };
  std::thread r1(rank, 1);
  rank(0);
  r1.join();
  EXPECT_FALSE(first.empty()) << "the all-reduce without its peer did not fail";
  EXPECT_EQ(second, first);
  EXPECT_NE(first.find(from_callback), std::string::npos) << from_callback;  // message, without the code
  EXPECT_FALSE(from_callback.empty());
}

// ABI 2.4's communication extension between two ranks: send/recv (blocking
// and as events), an asynchronous broadcast whose on-ready callback runs on
// another thread before event_destroy returns, completion modes, and its
// argument checks.
TEST(HostApi, TheCommExtensionSendsReceivesBroadcastsAndCallsBack) {
  using namespace std::chrono_literals;
  const int port = smp::find_free_port();
  std::vector<std::string> problems(2);
  std::vector<at::Tensor> got(2), cast(2);
  std::atomic<int> callbacks{0};
  std::atomic<bool> callback_on_caller{false};
  auto rank = [&](int r) {
    auto fail = [&](const std::string& m) { problems[static_cast<size_t>(r)] += m + "; "; };
    auto rdv = smp::Rendezvous::connect("127.0.0.1", port, r, 2, 30s);
    smp::DeviceMesh mesh(2, r, 1, 2, 1);
    smp::CommOptions opts;
    opts.timeout = 30s;
    smp::ProcessGroups groups(mesh, rdv, opts);
    smp_comm* dp = nullptr;
    if (!smp::consume_error(H().mesh_comm(groups.handle(), "dp", &dp)).empty()) return fail("no dp");
    const smp_comm_extension& ext = comm_ext();
    // rank 0 -> rank 1: an event waited host-blocking; rank 1 a blocking recv.
    Handle msg(smp::make_tensor_handle(r == 0 ? at::arange(4, at::kFloat) : at::zeros({4})));
    smp_event* e = nullptr;
    smp_p2p_args p{};
    p.struct_size = SMP_P2P_ARGS_STRUCT_SIZE;
    p.comm = dp;
    p.tensor = msg.h;
    p.peer = 1 - r;
    p.tag = 7;
    p.event = r == 0 ? &e : nullptr;
    std::string err = smp::consume_error(r == 0 ? ext.send(&p) : ext.recv(&p));
    if (!err.empty()) return fail(err);
    if (r == 0) {
      smp_event_wait_args w{};
      w.struct_size = SMP_EVENT_WAIT_ARGS_STRUCT_SIZE;
      w.event = e;
      w.mode = SMP_COMPLETION_HOST;
      if (!(err = smp::consume_error(ext.event_wait(&w))).empty()) fail(err);
      H().event_destroy(e);
    }
    got[static_cast<size_t>(r)] = msg.t().clone();
    // Rank 1's value to both, asynchronously, with a callback.
    Handle b(smp::make_tensor_handle(r == 1 ? at::full({3}, 5.0f) : at::zeros({3})));
    smp_broadcast_args ba{};
    ba.struct_size = SMP_BROADCAST_ARGS_STRUCT_SIZE;
    ba.comm = dp;
    ba.inout = b.h;
    ba.root = 1;
    ba.event = &e;
    if (!(err = smp::consume_error(ext.broadcast(&ba))).empty()) return fail(err);
    struct Seen {
      std::atomic<int>* count;
      std::atomic<bool>* on_caller;
      std::thread::id caller;
    } seen{&callbacks, &callback_on_caller, std::this_thread::get_id()};
    smp_event_callback_args cb{};
    cb.struct_size = SMP_EVENT_CALLBACK_ARGS_STRUCT_SIZE;
    cb.event = e;
    cb.callback = [](void* user, const smp_error* error) {
      auto* s = static_cast<Seen*>(user);
      if (std::this_thread::get_id() == s->caller) *s->on_caller = true;
      if (!error) ++*s->count;
    };
    cb.user = &seen;
    if (!(err = smp::consume_error(ext.event_on_ready(&cb))).empty()) fail(err);
    if (smp::consume_error(ext.event_on_ready(&cb)).find("already has a callback") == std::string::npos)
      fail("a second callback was accepted");
    smp_event_wait_args w{};
    w.struct_size = SMP_EVENT_WAIT_ARGS_STRUCT_SIZE;
    w.event = e;
    w.mode = SMP_COMPLETION_STREAM;
    if (!(err = smp::consume_error(ext.event_wait(&w))).empty()) fail(err);
    H().event_destroy(e);  // returns after the callback
    cast[static_cast<size_t>(r)] = b.t().clone();
    // Argument checks.
    smp_p2p_args small = p;
    small.struct_size = 8;
    if (smp::consume_error(ext.send(&small)).find("smaller than ABI 2.4's") == std::string::npos)
      fail("a short args struct was accepted");
    smp_p2p_args far = p;
    far.peer = 5;
    if (smp::consume_error(ext.send(&far)).find("peer 5 is outside") == std::string::npos) fail("peer 5 accepted");
    w.mode = static_cast<smp_completion_mode>(9);
    if (smp::consume_error(ext.event_wait(&w)).find("unknown completion mode 9") == std::string::npos)
      fail("mode 9 accepted");
    groups.get(smp::Axis::World).barrier();
    rdv->shutdown(30s);
  };
  std::thread r1(rank, 1);
  rank(0);
  r1.join();
  EXPECT_EQ(problems[0], "");
  EXPECT_EQ(problems[1], "");
  EXPECT_TRUE(at::equal(got[1], at::arange(4, at::kFloat))) << got[1];
  EXPECT_TRUE(at::equal(cast[0], at::full({3}, 5.0f))) << cast[0];
  EXPECT_EQ(callbacks.load(), 2);
  EXPECT_FALSE(callback_on_caller.load()) << "a callback ran on the training thread";
}

}  // namespace
