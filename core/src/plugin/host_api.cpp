// The host table: errors, tensor handles (DLPack and the LibTorch bridge),
// logging and collectives, as plain C functions over core objects.
#include "plugin/host_api.h"

#include <smp/error.h>
#include <smp/mesh.h>

#include <smp/common/exceptions.hpp>

#include "plugin/extension.h"

#include "base/device.h"
#include "plugin/struct_size.h"
#include "comm/comm_handle.h"
#include "comm/communicator.h"
#include "comm/event_watcher.h"
#include "comm/process_groups.h"
#include "plugin/graph_builder.h"

#include <ATen/ATen.h>
#include <ATen/DLConvertor.h>
#include <spdlog/spdlog.h>
#include <torch/version.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <vector>


struct smp_error {
  smp_error_code code;
  std::string message;
};

// A handle owns one reference to the TensorImpl (through at::Tensor) and counts
// the ABI-level references on top of it.
struct smp_tensor {
  std::atomic<int64_t> refs{1};
  at::Tensor tensor;
};

// An asynchronous collective handed to a plugin. Keeps the tensors alive until
// the operation is waited, whatever the plugin does with its own references.
struct smp_event {
  std::shared_ptr<smp::Work> work;
  std::vector<at::Tensor> keep;
  // The training thread's wait and the on-ready watcher's are one wait.
  std::mutex mu;
  bool waited = false;
  // The first wait's failure, which every later wait returns again.
  smp_error_code error_code = SMP_ERR_OK;
  std::string error;
  // An on-ready callback (SMP_EXTENSION_COMM): destroy waits until it has run.
  bool has_callback = false;
  bool callback_done = false;
  std::condition_variable callback_cv;
};

namespace smp {
namespace {

const char* code_name(smp_error_code c) {
  switch (c) {
    case SMP_ERR_OK: return "OK";
    case SMP_ERR_INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case SMP_ERR_UNSUPPORTED: return "UNSUPPORTED";
    case SMP_ERR_NOT_FOUND: return "NOT_FOUND";
    case SMP_ERR_INTERNAL: return "INTERNAL";
    case SMP_ERR_COMMUNICATION: return "COMMUNICATION";
    case SMP_ERR_TIMEOUT: return "TIMEOUT";
    case SMP_ERR_OUT_OF_MEMORY: return "OUT_OF_MEMORY";
  }
  return "UNKNOWN";
}

smp_error* make_error(smp_error_code code, const std::string& msg) { return new smp_error{code, msg}; }

smp_error* error_create(smp_error_code code, const char* message);

// A failure of the host table that carries its own ABI code; any other
// exception of the core's reaches the plugin as SMP_ERR_INTERNAL.
class CodedError : public Error {
 public:
  CodedError(smp_error_code code, const std::string& message) : Error(message), code_(code) {}
  smp_error_code code() const { return code_; }

 private:
  smp_error_code code_;
};

// Runs f; exceptions become error objects (no C++ exception crosses into a plugin).
template <class F>
smp_error* guarded(F&& f) noexcept {
  return sdk::guard_exceptions<CodedError>(&error_create, SMP_ERR_INTERNAL, "smp core", std::forward<F>(f));
}

smp_dtype to_smp(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return SMP_DTYPE_FLOAT32;
    case at::kDouble: return SMP_DTYPE_FLOAT64;
    case at::kHalf: return SMP_DTYPE_FLOAT16;
    case at::kBFloat16: return SMP_DTYPE_BFLOAT16;
    case at::kLong: return SMP_DTYPE_INT64;
    case at::kInt: return SMP_DTYPE_INT32;
    case at::kByte: return SMP_DTYPE_UINT8;
    case at::kChar: return SMP_DTYPE_INT8;
    case at::kBool: return SMP_DTYPE_BOOL;
    default: return SMP_DTYPE_UNKNOWN;
  }
}

ReduceOp to_core(smp_reduce_op op) {
  switch (op) {
    case SMP_REDUCE_SUM: return ReduceOp::Sum;
    case SMP_REDUCE_MAX: return ReduceOp::Max;
    case SMP_REDUCE_MIN: return ReduceOp::Min;
    case SMP_REDUCE_PRODUCT: return ReduceOp::Product;
  }
  throw Error("unknown reduce op " + std::to_string(static_cast<int>(op)));
}

Communicator& comm_of(const smp_comm* c) {
  if (!c || !c->comm) throw Error("null communicator handle");
  return *c->comm;
}
at::Tensor& mutable_tensor(smp_tensor* t) {
  if (!t) throw Error("null tensor handle");
  return t->tensor;
}

// ---- the C functions ----
smp_error* error_create(smp_error_code code, const char* message) {
  return make_error(code, message ? message : "");
}
smp_error_code error_code(const smp_error* e) { return e ? e->code : SMP_ERR_OK; }
const char* error_message(const smp_error* e) { return e ? e->message.c_str() : ""; }
void error_destroy(smp_error* e) { delete e; }

void log(smp_log_level level, const char* plugin, const char* message) {
  const char* p = plugin ? plugin : "plugin";
  const char* m = message ? message : "";
  switch (level) {
    case SMP_LOG_DEBUG: spdlog::debug("[{}] {}", p, m); break;
    case SMP_LOG_INFO: spdlog::info("[{}] {}", p, m); break;
    case SMP_LOG_WARN: spdlog::warn("[{}] {}", p, m); break;
    default: spdlog::error("[{}] {}", p, m); break;
  }
}

void tensor_retain(smp_tensor* t) {
  if (t) t->refs.fetch_add(1, std::memory_order_relaxed);
}
void tensor_release(smp_tensor* t) {
  if (t && t->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) delete t;
}
smp_dtype tensor_dtype(const smp_tensor* t) { return t ? to_smp(t->tensor.scalar_type()) : SMP_DTYPE_UNKNOWN; }
// An undefined at::Tensor (a plugin may hand one back) throws on strides() and
// data_ptr(): these plain C functions must not, so they answer "nothing".
bool defined(const smp_tensor* t) { return t && t->tensor.defined(); }
int64_t tensor_ndim(const smp_tensor* t) { return defined(t) ? t->tensor.dim() : 0; }
const int64_t* tensor_sizes(const smp_tensor* t) { return defined(t) ? t->tensor.sizes().data() : nullptr; }
const int64_t* tensor_strides(const smp_tensor* t) { return defined(t) ? t->tensor.strides().data() : nullptr; }
void tensor_device(const smp_tensor* t, smp_device_type* type, int32_t* index) {
  bool cuda = defined(t) && t->tensor.is_cuda();
  if (type) *type = cuda ? SMP_DEVICE_CUDA : SMP_DEVICE_CPU;
  if (index) *index = cuda ? t->tensor.get_device() : 0;
}
void* tensor_data(const smp_tensor* t) { return defined(t) ? t->tensor.data_ptr() : nullptr; }

smp_error* tensor_to_dlpack(smp_tensor* t, DLManagedTensor** out) {
  return guarded([&] {
    if (!out) throw Error("tensor_to_dlpack: null out pointer");
    if (!mutable_tensor(t).defined()) throw Error("tensor_to_dlpack: the tensor is undefined");
    *out = at::toDLPack(t->tensor);
  });
}
smp_error* tensor_from_dlpack(DLManagedTensor* dl, smp_tensor** out) {
  return guarded([&] {
    if (!dl) throw Error("tensor_from_dlpack: null DLManagedTensor");
    if (!out) throw Error("tensor_from_dlpack: null out pointer");
    at::Tensor t;
    try {
      t = at::fromDLPack(dl);
    } catch (...) {
      if (dl->deleter) dl->deleter(dl);  // we own it: release it on failure too
      throw;
    }
    *out = make_tensor_handle(t);
  });
}
smp_tensor* tensor_from_aten(const void* aten) {
  return aten ? make_tensor_handle(*static_cast<const at::Tensor*>(aten)) : nullptr;
}
const void* tensor_aten(const smp_tensor* t) { return t ? &t->tensor : nullptr; }

int32_t comm_rank(const smp_comm* c) { return c && c->comm ? c->comm->rank() : 0; }
int32_t comm_size(const smp_comm* c) { return c && c->comm ? c->comm->size() : 1; }
// Each collective is written once, as a launch returning the core's Work: the
// blocking ABI functions wait on it, the _async ones hand it out as an event.
std::shared_ptr<Work> launch_allreduce(smp_comm* c, smp_tensor* t, smp_reduce_op op) {
  return comm_of(c).allreduce(mutable_tensor(t), to_core(op));
}
std::shared_ptr<Work> launch_allgather(smp_comm* c, smp_tensor* in, smp_tensor* out) {
  return comm_of(c).allgather(mutable_tensor(in), mutable_tensor(out));
}
std::shared_ptr<Work> launch_reduce_scatter(smp_comm* c, smp_tensor* in, smp_tensor* out, smp_reduce_op op) {
  return comm_of(c).reduce_scatter(mutable_tensor(in), mutable_tensor(out), to_core(op));
}
std::shared_ptr<Work> launch_alltoall(smp_comm* c, smp_tensor* in, smp_tensor* out, const int64_t* in_splits,
                                      const int64_t* out_splits) {
  Communicator& comm = comm_of(c);
  std::vector<int64_t> is, os;
  if (in_splits) is.assign(in_splits, in_splits + comm.size());
  if (out_splits) os.assign(out_splits, out_splits + comm.size());
  return comm.alltoall(mutable_tensor(in), mutable_tensor(out), is, os);
}

smp_error* comm_allreduce(smp_comm* c, smp_tensor* t, smp_reduce_op op) {
  return guarded([&] { launch_allreduce(c, t, op)->wait(); });
}
smp_error* comm_allgather(smp_comm* c, smp_tensor* in, smp_tensor* out) {
  return guarded([&] { launch_allgather(c, in, out)->wait(); });
}
smp_error* comm_reduce_scatter(smp_comm* c, smp_tensor* in, smp_tensor* out, smp_reduce_op op) {
  return guarded([&] { launch_reduce_scatter(c, in, out, op)->wait(); });
}
smp_error* comm_alltoall(smp_comm* c, smp_tensor* in, smp_tensor* out, const int64_t* in_splits,
                         const int64_t* out_splits) {
  return guarded([&] { launch_alltoall(c, in, out, in_splits, out_splits)->wait(); });
}
smp_error* comm_broadcast(smp_comm* c, smp_tensor* t, int32_t root) {
  return guarded([&] { comm_of(c).broadcast(mutable_tensor(t), root)->wait(); });
}

// A launch, blocking when `event` is null, else handed out as a new event
// that keeps the tensors alive until it is destroyed.
void start(smp_event** event, const std::vector<smp_tensor*>& tensors,
           const std::function<std::shared_ptr<Work>()>& launch) {
  if (!event) {
    launch()->wait();
    return;
  }
  *event = nullptr;
  auto e = std::make_unique<smp_event>();
  for (auto* t : tensors) e->keep.push_back(mutable_tensor(t));
  e->work = launch();
  *event = e.release();
}

// The host table's _async functions: an event is required.
smp_error* make_event(smp_event** event, const std::vector<smp_tensor*>& tensors,
                      const std::function<std::shared_ptr<Work>()>& launch) {
  return guarded([&] {
    if (!event) throw Error("asynchronous collective: null event pointer");
    start(event, tensors, launch);
  });
}
smp_error* comm_allreduce_async(smp_comm* c, smp_tensor* t, smp_reduce_op op, smp_event** event) {
  return make_event(event, {t}, [&] { return launch_allreduce(c, t, op); });
}
smp_error* comm_allgather_async(smp_comm* c, smp_tensor* in, smp_tensor* out, smp_event** event) {
  return make_event(event, {in, out}, [&] { return launch_allgather(c, in, out); });
}
smp_error* comm_reduce_scatter_async(smp_comm* c, smp_tensor* in, smp_tensor* out, smp_reduce_op op,
                                     smp_event** event) {
  return make_event(event, {in, out}, [&] { return launch_reduce_scatter(c, in, out, op); });
}
smp_error* comm_alltoall_async(smp_comm* c, smp_tensor* in, smp_tensor* out, const int64_t* in_splits,
                               const int64_t* out_splits, smp_event** event) {
  return make_event(event, {in, out}, [&] { return launch_alltoall(c, in, out, in_splits, out_splits); });
}
int32_t event_ready(smp_event* e) {
  if (!e) return 1;
  std::lock_guard<std::mutex> lock(e->mu);
  return e->waited || e->work->ready() ? 1 : 0;
}
smp_error* event_wait(smp_event* e) {
  if (!e) return error_create(SMP_ERR_INVALID_ARGUMENT, "event_wait: null event");
  std::lock_guard<std::mutex> lock(e->mu);
  if (!e->waited) {
    e->waited = true;
    smp_error* err = guarded([&] { e->work->wait(); });
    if (!err) return nullptr;
    e->error_code = err->code;
    e->error = err->message;
    return err;
  }
  return e->error.empty() ? nullptr : error_create(e->error_code, e->error.c_str());
}
void event_destroy(smp_event* e) {
  if (!e) return;
  // The buffers must not be freed under a running collective.
  std::string err = consume_error(event_wait(e));
  if (!err.empty() && !e->has_callback)
    spdlog::warn("an asynchronous collective destroyed without a wait failed: {}", err);
  std::unique_lock<std::mutex> lock(e->mu);
  e->callback_cv.wait(lock, [&] { return !e->has_callback || e->callback_done; });
  lock.unlock();
  delete e;
}

// ---- SMP_EXTENSION_COMM ----

int32_t checked_rank(const smp_comm* c, int32_t r, const char* what) {
  const int n = comm_size(c);
  if (r < 0 || r >= n)
    throw Error(std::string(what) + " " + std::to_string(r) + " is outside the communicator's ranks [0, " +
                std::to_string(n) + ")");
  return r;
}

smp_error* ext_p2p(const smp_p2p_args* a, bool send) {
  return guarded([&] {
    const std::string op = send ? "send" : "recv";
    require_struct_size(a, SMP_P2P_ARGS_STRUCT_SIZE, "2.4", "comm extension: " + op + " args");
    const int peer = checked_rank(a->comm, a->peer, (op + ": peer").c_str());
    start(a->event, {a->tensor}, [&] {
      Communicator& c = comm_of(a->comm);
      return send ? c.send(mutable_tensor(a->tensor), peer, a->tag) : c.recv(mutable_tensor(a->tensor), peer, a->tag);
    });
  });
}
smp_error* ext_send(const smp_p2p_args* a) { return ext_p2p(a, true); }
smp_error* ext_recv(const smp_p2p_args* a) { return ext_p2p(a, false); }
smp_error* ext_broadcast(const smp_broadcast_args* a) {
  return guarded([&] {
    require_struct_size(a, SMP_BROADCAST_ARGS_STRUCT_SIZE, "2.4", "comm extension: broadcast args");
    const int root = checked_rank(a->comm, a->root, "broadcast: root");
    start(a->event, {a->inout}, [&] { return comm_of(a->comm).broadcast(mutable_tensor(a->inout), root); });
  });
}
smp_error* ext_event_wait(const smp_event_wait_args* a) {
  smp_error* shape = guarded([&] {
    require_struct_size(a, SMP_EVENT_WAIT_ARGS_STRUCT_SIZE, "2.4", "comm extension: event_wait args");
    if (a->mode != SMP_COMPLETION_DEFAULT && a->mode != SMP_COMPLETION_HOST && a->mode != SMP_COMPLETION_STREAM)
      throw Error("comm extension: event_wait: unknown completion mode " + std::to_string(static_cast<int>(a->mode)));
  });
  if (shape) return shape;
  if (smp_error* err = event_wait(a->event)) return err;
  // Host completion of a device operation: its result must be on the device first.
  if (a->mode == SMP_COMPLETION_HOST)
    return guarded([&] {
      for (const auto& t : a->event->keep)
        if (t.is_cuda()) synchronize(t.device());
    });
  return nullptr;
}
smp_error* ext_event_on_ready(const smp_event_callback_args* a) {
  return guarded([&] {
    require_struct_size(a, SMP_EVENT_CALLBACK_ARGS_STRUCT_SIZE, "2.4", "comm extension: event_on_ready args");
    smp_event* e = a->event;
    if (!e) throw Error("comm extension: event_on_ready: null event");
    if (!a->callback) throw Error("comm extension: event_on_ready: null callback");
    {
      std::lock_guard<std::mutex> lock(e->mu);
      if (e->has_callback) throw Error("comm extension: event_on_ready: the event already has a callback");
      e->has_callback = true;
    }
    const smp_event_callback callback = a->callback;
    void* user = a->user;
    watch_until_ready(e->work, [e, callback, user] {
      smp_error* err = event_wait(e);  // ready: returns at once, and records the outcome for later waits
      callback(user, err);
      if (err) error_destroy(err);
      {
        std::lock_guard<std::mutex> lock(e->mu);
        e->callback_done = true;
      }
      e->callback_cv.notify_all();
    });
  });
}

// A NULL mesh is a one-rank mesh (unit tests, the cost profiler).
smp_error* mesh_axis(const smp_mesh* m, const char* axis, int32_t* rank, int32_t* size) {
  return guarded([&] {
    if (!axis) throw Error("mesh_axis: null axis name");
    // A one-rank mesh has every axis, of size 1.
    const Axis a = m ? m->groups->mesh().axis(axis) : Axis(axis);
    const int r = m ? m->groups->mesh().coord(a) : 0, n = m ? m->groups->mesh().size(a) : 1;
    if (rank) *rank = r;
    if (size) *size = n;
  });
}
smp_error* mesh_comm(smp_mesh* m, const char* axis, smp_comm** out) {
  return guarded([&] {
    if (!axis) throw Error("mesh_comm: null axis name");
    if (!out) throw Error("mesh_comm: null out pointer");
    *out = nullptr;
    if (m) *out = m->groups->get(std::string(axis)).handle();
    else (void)Axis(std::string(axis));  // a one-rank mesh has any (validly named) axis
  });
}

smp_error* graph_add_input(smp_graph_builder* b, const char* name) {
  return guarded([&] { GraphBuilder::from(b).add_input(name ? name : ""); });
}
smp_error* graph_add_node(smp_graph_builder* b, const smp_graph_node* node) {
  return guarded([&] { GraphBuilder::from(b).add_node(node); });
}
smp_error* graph_set_loss(smp_graph_builder* b, const char* name) {
  return guarded([&] { GraphBuilder::from(b).set_loss(name ? name : ""); });
}
smp_error* graph_set_flops_per_sample(smp_graph_builder* b, double flops) {
  return guarded([&] { GraphBuilder::from(b).set_flops_per_sample(flops); });
}
smp_error* graph_set_loss_sum(smp_graph_builder* b, const char* sum, const char* count) {
  return guarded([&] { GraphBuilder::from(b).set_loss_sum(sum ? sum : "", count ? count : ""); });
}
smp_error* graph_add_metric(smp_graph_builder* b, const char* name, const char* sum, const char* count) {
  return guarded([&] { GraphBuilder::from(b).add_metric(name ? name : "", sum ? sum : "", count ? count : ""); });
}
smp_error* graph_set_throughput_unit(smp_graph_builder* b, const char* unit, double per_sample) {
  return guarded([&] { GraphBuilder::from(b).set_throughput_unit(unit ? unit : "", per_sample); });
}

}  // namespace

uint32_t role_flag(AxisRole role) {
  switch (role) {
    case AxisRole::SplitsBatch: return SMP_AXIS_SPLITS_BATCH;
    case AxisRole::SplitsSequence: return SMP_AXIS_SPLITS_SEQUENCE;
    case AxisRole::SplitsModel: return SMP_AXIS_SPLITS_MODEL;
    case AxisRole::Derived: break;
  }
  return 0;
}

namespace {

smp_error* graph_split_sequence(smp_graph_builder* b, int32_t dim) {
  return guarded([&] { GraphBuilder::from(b).split_sequence(dim); });
}

// SMP_EXTENSION_MESH. A NULL mesh is the one-rank mesh of the core's axes.
const DeviceMesh& mesh_of(const smp_mesh* m) {
  static const DeviceMesh one_rank(1, 0, 1, 1, 1);
  return m ? m->groups->mesh() : one_rank;
}
smp_error* mesh_axis_count(const smp_mesh* m, int32_t* count) {
  return guarded([&] {
    if (!count) throw Error("mesh extension: axis_count: null out pointer");
    *count = static_cast<int32_t>(mesh_of(m).axes().size());
  });
}
smp_error* mesh_axis_at(const smp_mesh* m, int32_t index, const char** name, int32_t* size, int32_t* rank,
                        uint32_t* flags) {
  return guarded([&] {
    const DeviceMesh& mesh = mesh_of(m);
    const auto& axes = mesh.axes();
    if (index < 0 || index >= static_cast<int32_t>(axes.size()))
      throw Error("mesh extension: axis_at: index " + std::to_string(index) + " is outside [0, " +
                  std::to_string(axes.size()) + ")");
    const Axis& a = axes[static_cast<size_t>(index)];
    if (name) *name = a.name();
    if (size) *size = mesh.size(a);
    if (rank) *rank = mesh.coord(a);
    if (flags) {
      const auto rules = mesh.rule_axes();
      const AxisRole role = mesh.role(a);
      *flags = (role != AxisRole::Derived ? SMP_AXIS_DIMENSION : 0u) | (mesh.is_data_axis(a) ? SMP_AXIS_DATA : 0u) |
               (std::find(rules.begin(), rules.end(), a) != rules.end() ? SMP_AXIS_RULES : 0u) | role_flag(role);
    }
  });
}

// The host's extensions, a chain: the mesh, communication, the graph.
const smp_extension_base* host_extensions() {
  static const smp_graph_extension graph = [] {
    auto e = make_extension<smp_graph_extension>(SMP_EXTENSION_GRAPH, SMP_GRAPH_EXTENSION_STRUCT_SIZE);
    e.split_sequence = &graph_split_sequence;
    return e;
  }();
  static const smp_comm_extension comm = [] {
    auto e = make_extension<smp_comm_extension>(SMP_EXTENSION_COMM, SMP_COMM_EXTENSION_STRUCT_SIZE, &graph.base);
    e.send = &ext_send;
    e.recv = &ext_recv;
    e.broadcast = &ext_broadcast;
    e.event_wait = &ext_event_wait;
    e.event_on_ready = &ext_event_on_ready;
    return e;
  }();
  static const smp_mesh_extension mesh = [] {
    auto e = make_extension<smp_mesh_extension>(SMP_EXTENSION_MESH, SMP_MESH_EXTENSION_STRUCT_SIZE, &comm.base);
    e.axis_count = &mesh_axis_count;
    e.axis_at = &mesh_axis_at;
    return e;
  }();
  return &mesh.base;
}

smp_host_api make_table() {
  smp_host_api h{};
  h.struct_size = SMP_HOST_API_STRUCT_SIZE;
  h.abi_major = SMP_ABI_VERSION_MAJOR;
  h.abi_minor = SMP_ABI_VERSION_MINOR;
  h.torch_version = TORCH_VERSION;  // the same macro the SDK stamps into plugins
  h.extension_start = host_extensions();
  h.error_create = &error_create;
  h.error_code = &error_code;
  h.error_message = &error_message;
  h.error_destroy = &error_destroy;
  h.log = &log;
  h.tensor_retain = &tensor_retain;
  h.tensor_release = &tensor_release;
  h.tensor_dtype = &tensor_dtype;
  h.tensor_ndim = &tensor_ndim;
  h.tensor_sizes = &tensor_sizes;
  h.tensor_strides = &tensor_strides;
  h.tensor_device = &tensor_device;
  h.tensor_data = &tensor_data;
  h.tensor_to_dlpack = &tensor_to_dlpack;
  h.tensor_from_dlpack = &tensor_from_dlpack;
  h.tensor_from_aten = &tensor_from_aten;
  h.tensor_aten = &tensor_aten;
  h.comm_rank = &comm_rank;
  h.comm_size = &comm_size;
  h.comm_allreduce = &comm_allreduce;
  h.comm_allgather = &comm_allgather;
  h.comm_reduce_scatter = &comm_reduce_scatter;
  h.comm_alltoall = &comm_alltoall;
  h.comm_broadcast = &comm_broadcast;
  h.comm_allreduce_async = &comm_allreduce_async;
  h.comm_allgather_async = &comm_allgather_async;
  h.comm_reduce_scatter_async = &comm_reduce_scatter_async;
  h.comm_alltoall_async = &comm_alltoall_async;
  h.event_ready = &event_ready;
  h.event_wait = &event_wait;
  h.event_destroy = &event_destroy;
  h.mesh_axis = &mesh_axis;
  h.mesh_comm = &mesh_comm;
  h.graph_add_input = &graph_add_input;
  h.graph_add_node = &graph_add_node;
  h.graph_set_loss = &graph_set_loss;
  h.graph_set_flops_per_sample = &graph_set_flops_per_sample;
  h.graph_set_loss_sum = &graph_set_loss_sum;
  h.graph_set_throughput_unit = &graph_set_throughput_unit;
  h.graph_add_metric = &graph_add_metric;
  return h;
}

}  // namespace

const smp_host_api* host_api() {
  static const smp_host_api table = make_table();
  return &table;
}

smp_tensor* make_tensor_handle(const at::Tensor& t) {
  auto* h = new smp_tensor;
  h->tensor = t;
  return h;
}

const at::Tensor& tensor_of(const smp_tensor* t) {
  if (!t) throw Error("null tensor handle");
  return t->tensor;
}

std::string consume_error(smp_error* err) {
  if (!err) return "";
  // A plugin's own exception names its type already (sdk::kPluginExceptionMark):
  // it is the plugin's, not an internal error of smp's.
  const std::string& m = err->message;
  const std::string mark = sdk::kPluginExceptionMark;
  const bool plugins_own = err->code == SMP_ERR_INTERNAL && m.size() >= mark.size() &&
                           m.compare(m.size() - mark.size(), mark.size(), mark) == 0;
  std::string msg = plugins_own ? m : m + " (" + code_name(err->code) + ")";
  delete err;
  return msg;
}

void throw_if_error(smp_error* err, const std::string& context) {
  if (err) throw Error(context + ": " + consume_error(err));
}

}  // namespace smp
