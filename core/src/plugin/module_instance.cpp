#include "plugin/module_instance.h"

#include "base/seeded_device_generator.h"
#include "plugin/struct_size.h"

#include <smp/error.h>

#include "comm/process_groups.h"
#include "plugin/extension.h"
#include "plugin/host_api.h"
#include "plugin/placement_abi.h"
#include "plugin/plugin_tables.h"

#include <smp/common/init.hpp>

namespace smp {

smp_module_context module_context(const std::string& key, uint64_t init_seed, smp_mesh* mesh,
                                  const std::string& parallel_json, const c10::Device& device,
                                  const char* memory_json, const smp_extension_base* extensions) {
  smp_module_context ctx{};
  ctx.struct_size = SMP_MODULE_CONTEXT_STRUCT_SIZE;
  ctx.node_name = key.c_str();
  ctx.init_seed = init_seed;
  ctx.device_type = device.is_cuda() ? SMP_DEVICE_CUDA : SMP_DEVICE_CPU;
  ctx.device_index = device.is_cuda() ? device.index() : 0;
  ctx.mesh = mesh;
  ctx.parallel_json = parallel_json.c_str();
  ctx.memory_json = memory_json;
  ctx.extension_start = extensions;
  return ctx;
}

namespace {
const smp_module_kind* known_kind(const PluginRegistry& registry, const std::string& kind, const std::string& key) {
  const smp_module_kind* k = PluginTables(registry).module_kind(kind);
  if (!k) throw Error("node '" + key + "': no loaded plugin provides module kind '" + kind + "'");
  return k;
}
}  // namespace

bool kind_defers_init(const PluginRegistry& registry, const std::string& kind) {
  return (registry.memory_features(kind) & SMP_MEMORY_FEATURE_DEFERRED_INIT) != 0;
}
bool kind_recomputes_attention_core(const PluginRegistry& registry, const std::string& kind) {
  return (registry.memory_features(kind) & SMP_MEMORY_FEATURE_RECOMPUTE_ATTENTION_CORE) != 0;
}

bool kind_decodes(const PluginRegistry& registry, const std::string& kind, const std::string& method) {
  return (registry.inference(kind, method).flags & (SMP_INFERENCE_POSITIONWISE | SMP_INFERENCE_DECODE)) != 0;
}

// A module context and the job-tables extension it points to, alive together
// for the create call (a temporary of the delegating constructor's call).
struct ModuleInstance::SetupContext {
  smp_job_tables_extension tables;
  smp_module_context context;
  SetupContext(const std::string& key, const ModuleSetup& s)
      : tables(make_extension<smp_job_tables_extension>(SMP_EXTENSION_JOB_TABLES, SMP_JOB_TABLES_EXTENSION_STRUCT_SIZE)),
        context() {
    tables.tables_json = s.tables_json.c_str();
    context = module_context(key, s.init_seed, s.mesh, s.parallel_json, s.device, s.memory_json.c_str(),
                             s.tables_json.empty() ? nullptr : &tables.base);
  }
  SetupContext(const SetupContext&) = delete;
};

ModuleInstance::ModuleInstance(const PluginRegistry& registry, const std::string& kind, std::string key,
                               const std::string& config_json, const ModuleSetup& setup)
    : ModuleInstance(known_kind(registry, kind, key), registry.provider(kind), key, config_json,
                     SetupContext(key, setup).context) {}

std::string ModuleInstance::where(const std::string& node, const std::string& call) const {
  return "plugin '" + plugin_ + "', module kind '" + kind_name_ + "', node '" + node + "', " + call;
}

namespace {

// A checked copy of a plugin's initialiser description (ABI 2.2).
std::shared_ptr<const sdk::InitSpec> init_spec(const smp_param_init& in, const ModuleParameter& p) {
  const std::string what = "parameter '" + p.name + "': smp_param_init";
  require_struct_size(&in, SMP_PARAM_INIT_STRUCT_SIZE, "2.2", what);
  if (in.kind != SMP_PARAM_INIT_NORMAL && in.kind != SMP_PARAM_INIT_CONSTANT)
    throw Error(what + ".kind " + std::to_string(static_cast<int>(in.kind)) + " is unknown");
  if (p.tensor.storage().nbytes() != 0 || p.tensor.scalar_type() != at::kFloat)
    throw Error(what + ": the tensor must be fp32 and have no storage yet");
  auto spec = std::make_shared<sdk::InitSpec>();
  spec->kind = in.kind;
  spec->key = in.key;
  spec->value = in.value;
  spec->full.assign(in.full_shape, in.full_shape + in.full_ndim);
  spec->slice = {in.slice_dim, in.slice_begin, in.slice_length};
  const bool sliced = in.slice_dim >= 0;
  if (sliced && (static_cast<size_t>(in.slice_dim) >= in.full_ndim || in.slice_begin < 0 || in.slice_length < 0 ||
                 in.slice_begin + in.slice_length > in.full_shape[in.slice_dim]))
    throw Error(what + ": slice (dim " + std::to_string(in.slice_dim) + ", begin " + std::to_string(in.slice_begin) +
                ", length " + std::to_string(in.slice_length) + ") is outside the full shape");
  if (spec->shape() != p.tensor.sizes().vec())
    throw Error(what + ": describes shape " + c10::str(at::IntArrayRef(spec->shape())) + ", the tensor is " +
                c10::str(p.tensor.sizes()));
  return spec;
}

}  // namespace

ModuleInstance::ModuleInstance(const smp_module_kind* kind, std::string plugin, std::string key,
                               const std::string& config_json, const smp_module_context& context)
    : kind_(kind),
      plugin_(std::move(plugin)),
      key_(std::move(key)),
      kind_name_(kind->name),
      device_(context.device_type == SMP_DEVICE_CUDA
                  ? c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(context.device_index))
                  : c10::Device(c10::kCPU)) {
  throw_if_error(kind_->create(kind_->state, config_json.c_str(), &context, &module_), where(key_, "create"));
  if (!module_) throw Error(where(key_, "create") + ": returned no module");
  // The visitor is called from plugin code: it must not throw, so it notes the first problem.
  struct Collect {
    ModuleInstance* self;
    const DeviceMesh* mesh;
    std::string problem;
  } collect{this, context.mesh ? &context.mesh->groups->mesh() : nullptr, {}};
  auto visit = [](void* user, const smp_param_info* p) {
    auto* collect = static_cast<Collect*>(user);
    try {
      ModuleParameter mp;
      mp.name = collect->self->key_ + "." + (p && p->name ? p->name : "?");
      require_struct_size(p, SMP_PARAM_INFO_STRUCT_SIZE_2_0, "2.0", "parameter '" + mp.name + "': smp_param_info");
      mp.tensor = tensor_of(p->tensor);
      mp.placements = placements_from_abi(p->placements, p->n_placements, mp.tensor.dim(),
                                          "parameter '" + mp.name + "'", collect->mesh);
      if (SMP_HAS_FIELD(p, smp_param_info, init) && p->init) mp.init = init_spec(*p->init, mp);
      mp.buffer = SMP_HAS_FIELD(p, smp_param_info, flags) && (p->flags & SMP_PARAM_FLAG_BUFFER);
      // Each rank of a sequence axis computes on its share of every sample's
      // tokens: a parameter replicated there has a partial gradient.
      if (collect->mesh && !mp.buffer)
        for (const Axis& a : collect->mesh->sequence_axes())
          if (collect->mesh->size(a) > 1 && mp.placements.kind(a) == PlacementKind::Replicate)
            mp.placements = mp.placements.with_partial_grad(a);
      collect->self->params_.push_back(std::move(mp));
    } catch (const std::exception& e) {
      if (collect->problem.empty()) collect->problem = e.what();
    }
  };
  smp_error* err = kind_->parameters(module_, visit, &collect);
  if (err || !collect.problem.empty()) {
    kind_->destroy(module_);
    module_ = nullptr;
    throw_if_error(err, where(key_, "parameters"));
    throw Error(where(key_, "parameters") + ": " + collect.problem);
  }
  // Parameters live on the context's device (the SDK moves them there; a C
  // plugin must create them there): anything else would fail later, far away.
  const c10::Device device = context.device_type == SMP_DEVICE_CUDA
                                 ? c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(context.device_index))
                                 : c10::Device(c10::kCPU);
  // Refuses the module (destroyed first), naming it.
  auto fail = [this](const std::string& message) {
    kind_->destroy(module_);
    module_ = nullptr;
    params_.clear();
    throw Error(where(key_, "create") + ": " + message);
  };
  for (auto& p : params_)
    if (p.tensor.device() != device)
      fail("parameter '" + p.name + "' is on " + p.tensor.device().str() + ", but the module was created for " +
           device.str());
  for (auto& p : params_)
    if (!p.init && sdk::lacks_storage(p.tensor))
      fail("parameter '" + p.name +
           "' has no storage and no initialiser (smp_param_info.init): a deferred-init module must draw every "
           "parameter from InitStream or init_constant and keep the tensor it got");
  for (auto& p : params_)
    if (p.buffer && p.tensor.requires_grad())
      fail("buffer '" + p.name + "' requires grad: a buffer (SMP_PARAM_FLAG_BUFFER) is not trained");
    else if (p.buffer && p.init)
      fail("buffer '" + p.name + "' has a deferred initialiser: only parameters may be created without storage");
  for (auto& p : params_)
    if (!p.buffer && !p.tensor.requires_grad() && p.tensor.is_floating_point()) p.tensor.requires_grad_(true);
}

ModuleInstance::~ModuleInstance() {
  params_.clear();
  if (module_) kind_->destroy(module_);
}

std::vector<at::Tensor> ModuleInstance::call(const std::string& node_name, const std::string& method,
                                             const std::vector<at::Tensor>& inputs, size_t n_outputs,
                                             bool training, uint64_t rng_seed,
                                             const DecodePositions* decode) {
  std::vector<smp_tensor*> in;
  in.reserve(inputs.size());
  for (const auto& t : inputs) in.push_back(make_tensor_handle(t));
  std::vector<smp_tensor*> out(n_outputs, nullptr);
  smp_forward_args args{};
  args.struct_size = SMP_FORWARD_ARGS_STRUCT_SIZE;
  args.method = method.c_str();
  args.inputs = in.data();
  args.n_inputs = in.size();
  args.outputs = out.data();
  args.n_outputs = out.size();
  args.training = training ? 1 : 0;
  args.rng_seed = rng_seed;
  // A decoding call says where its inputs lie in each sample (SMP_EXTENSION_DECODE).
  auto positions = make_extension<smp_decode_extension>(SMP_EXTENSION_DECODE, SMP_DECODE_EXTENSION_STRUCT_SIZE);
  if (decode) {
    positions.start = decode->start.data();
    positions.n_samples = decode->start.size();
    positions.capacity = decode->capacity;
    args.extension_start = &positions.base;
  }
  // On a GPU the device's generator is seeded with the call's seed too (the
  // SDK's torch modules seed the CPU's): dropout is the same in every layout
  // and in a checkpointed node's recomputation.
  SeededDeviceGenerator seeded(device_, rng_seed);
  smp_error* err = kind_->forward(module_, &args);
  const smp_host_api* host = host_api();
  for (auto* h : in) host->tensor_release(h);
  std::vector<at::Tensor> result;
  result.reserve(n_outputs);
  for (auto* h : out) {
    if (h) {
      result.push_back(tensor_of(h));
      host->tensor_release(h);
    }
  }
  throw_if_error(err, where(node_name, method));
  if (result.size() != n_outputs)
    throw Error(where(node_name, method) + ": returned " + std::to_string(result.size()) + " of " +
                std::to_string(n_outputs) + " outputs");
  return result;
}

}  // namespace smp
