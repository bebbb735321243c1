#include <smp/error.h>
#include <smp/job_config.h>

#include <ATen/Context.h>
#include <torch/version.h>

#include <nlohmann/json.hpp>

#include <thread>

namespace smp {

namespace {

DeviceKind resolve_device(DeviceKind device, const std::string& origin) {
  const bool have_cuda = at::hasCUDA();
  if (device == DeviceKind::Cpu) return DeviceKind::Cpu;
  if (device == DeviceKind::Cuda) {
    if (!have_cuda)
      throw Error(origin + ": run.device = \"cuda\", but this smp build has no usable CUDA (LibTorch without "
                           "CUDA, or no GPU): use \"cpu\" or \"auto\"");
    return DeviceKind::Cuda;
  }
  return have_cuda ? DeviceKind::Cuda : DeviceKind::Cpu;  // "auto"
}

Precision precision_of(const std::string& s) {
  if (s == "bf16") return Precision::Bf16;
  if (s == "fp16") return Precision::Fp16;
  return Precision::Fp32;
}

}  // namespace

const char* to_string(Precision p) {
  switch (p) {
    case Precision::Fp32: return "fp32";
    case Precision::Bf16: return "bf16";
    case Precision::Fp16: return "fp16";
  }
  return "?";
}

const char* to_string(DeviceKind d) {
  switch (d) {
    case DeviceKind::Auto: return "auto";
    case DeviceKind::Cpu: return "cpu";
    case DeviceKind::Cuda: return "cuda";
  }
  return "?";
}

namespace {

using nlohmann::json;

// One schema value (checked by Config) into its typed field; null (a Derived
// key not given) leaves the field's default.
template <class T>
void read_value(const json& v, T& out) {
  out = v.get<T>();
}
void read_value(const json& v, Precision& out) { out = precision_of(v.get<std::string>()); }
void read_value(const json& v, DeviceKind& out) {
  const std::string s = v.get<std::string>();
  out = s == "cpu" ? DeviceKind::Cpu : s == "cuda" ? DeviceKind::Cuda : DeviceKind::Auto;
}
void read_value(const json& v, AxisSizes& out) {
  out.clear();
  for (const auto& [name, size] : v.items()) out.emplace_back(name, size.get<int>());
}
void read_value(const json& v, AxisJoins& out) {
  out.clear();
  for (const auto& [name, dims] : v.items()) out.emplace_back(name, dims.get<std::vector<std::string>>());
}

template <class T>
void read_key(const json& all, const char* key, T& out) {
  const std::string k(key);
  const size_t dot = k.find('.');
  const json& v = all.at(k.substr(0, dot)).at(k.substr(dot + 1));
  if (!v.is_null()) read_value(v, out);
}

// Every typed field from the resolved configuration, by the key lists.
void read_fields(const Config& c, JobConfig& j) {
  const json all = c.to_json();
#define SMP_READ_FIELD(field, key, type, check, def, presence, doc) read_key(all, key, group.field);
#define SMP_READ_TABLE(name, list)  \
  {                                 \
    auto& group = j.name;           \
    list(SMP_READ_FIELD)            \
  }
  SMP_CONFIG_TABLES(SMP_READ_TABLE)
#undef SMP_READ_TABLE
#undef SMP_READ_FIELD
}

// The checks between keys (each key's own were made by Config).
void check_memory(const Config& c, MemoryConfig& m) {
  if (c.has("memory.shard")) {
    const std::string& shard = m.shard;
    const int named = shard == "optimizer" ? 1 : shard == "gradients" ? 2 : shard == "parameters" ? 3 : 0;
    if (c.has("parallel.zero") && named != m.zero)
      throw Error(c.origin_of_any({"memory.shard", "parallel.zero"}) + ": memory.shard = \"" + shard +
                  "\" (ZeRO stage " + std::to_string(named) + ") contradicts parallel.zero = " +
                  std::to_string(m.zero) + ": give one of the two");
    m.zero = named;
  }
  if (c.has("memory.checkpoint_every") && m.checkpoint.empty())
    throw Error(c.origin_of_any({"memory.checkpoint_every", "memory.checkpoint"}) +
                ": memory.checkpoint_every is set but memory.checkpoint lists no nodes");
  if (c.has("memory.offload_horizon") && !m.offload)
    throw Error(c.origin_of_any({"memory.offload_horizon", "memory.offload"}) +
                ": memory.offload_horizon is set but memory.offload is not true");
}

void check_train(const Config& c, const TrainConfig& t) {
  if (t.grad_reduce_dtype != Precision::Fp32 && t.grad_reduce_dtype != t.precision)
    throw Error(c.origin_of_any({"train.grad_reduce_dtype", "train.precision"}) + ": train.grad_reduce_dtype = \"" +
                to_string(t.grad_reduce_dtype) +
                "\": gradients are reduced in fp32 or in the compute dtype (train.precision = \"" +
                to_string(t.precision) + "\")");
  for (const char* key : {"train.initial_loss_scale", "train.loss_scale_window", "train.min_loss_scale"})
    if (c.has(key) && t.precision != Precision::Fp16)
      throw Error(c.origin_of_any({key, "train.precision"}) + ": " + key +
                  " is only used with train.precision = \"fp16\" (this job: \"" + to_string(t.precision) + "\")");
  if (t.min_loss_scale > t.initial_loss_scale)
    throw Error(c.origin_of_any({"train.min_loss_scale", "train.initial_loss_scale"}) + ": train.min_loss_scale (" +
                std::to_string(t.min_loss_scale) + ") is above train.initial_loss_scale (" +
                std::to_string(t.initial_loss_scale) + ")");
}

void check_run(const Config& c, RunConfig& r, const TrainConfig& t) {
  r.device = resolve_device(r.device, c.origin_of("run.device"));
  if (!r.devices.empty() && r.device != DeviceKind::Cuda)
    throw Error(c.origin_of_any({"run.devices", "run.device"}) +
                ": run.devices is set but the job runs on the CPU (run.device = \"" + c.get_string("run.device") +
                "\")");
#if TORCH_VERSION_MAJOR < 2
  // LibTorch 1.x has no fp16 GEMM on the CPU ("addmm_impl_cpu_" not implemented
  // for 'Half'): refuse before any rank starts rather than fail in the first step.
  if (t.precision == Precision::Fp16 && r.device == DeviceKind::Cpu)
    throw Error(c.origin_of_any({"train.precision", "run.device"}) +
                ": train.precision = \"fp16\" on the CPU needs LibTorch 2 or later (this is " + TORCH_VERSION +
                ", without fp16 matrix multiplies on the CPU): use \"bf16\", or a CUDA device");
#else
  (void)t;
#endif
  // Threads past the cores make no progress worth having (100,000 threads per
  // rank: none at all); more than the machine has only when asked for.
  const unsigned cores = std::thread::hardware_concurrency();  // 0: unknown, nothing to compare with
  if (cores > 0 && r.threads > static_cast<int64_t>(cores) && !r.threads_oversubscribe)
    throw Error(c.origin_of("run.threads") + ": run.threads = " + std::to_string(r.threads) +
                " is more than this machine's " + std::to_string(cores) +
                " cores: give at most that, or set run.threads_oversubscribe = true to run so many threads anyway");
  if (c.has("run.threads_oversubscribe") && r.threads_oversubscribe && r.threads == 0)
    throw Error(c.origin_of_any({"run.threads_oversubscribe", "run.threads"}) +
                ": run.threads_oversubscribe is set but run.threads is not (0: OMP_NUM_THREADS or LibTorch's)");
  const Ints& window = r.trace_steps;
  if (window.size() != 2 || window[0] < 1 || window[1] < window[0])
    throw Error(c.origin_of("run.trace_steps") +
                ": run.trace_steps: expected [from, to] with 1 <= from <= to (training steps, 1-based), got " +
                nlohmann::json(window).dump());
  if (c.has("run.trace_steps") && !r.trace && !r.profile_ops)
    throw Error(c.origin_of_any({"run.trace_steps", "run.trace", "run.profile_ops"}) +
                ": run.trace_steps is set but neither run.trace nor run.profile_ops is true");
  if (c.has("run.trace_merge") && !r.trace)
    throw Error(c.origin_of_any({"run.trace_merge", "run.trace"}) +
                ": run.trace_merge is set but run.trace is not true");
}

// [optimizer], and AdamW's three train.* keys: given in one place each, and
// never to another optimizer (no key is accepted and then ignored).
nlohmann::json optimizer_config(const Config& c, const std::string& optimizer) {
  nlohmann::json o = c.section_json("optimizer");
  for (const char* key : {"beta1", "beta2", "eps"}) {
    const std::string train_key = std::string("train.") + key;
    if (optimizer != "adamw") {
      if (c.has(train_key))
        throw Error(c.origin_of_any({train_key, "train.optimizer"}) + ": " + train_key +
                    " is AdamW's, but train.optimizer = \"" + optimizer + "\" (give its settings in [optimizer])");
      continue;
    }
    if (o.contains(key) && c.has(train_key))
      throw Error(c.origin_of_any({train_key, "optimizer." + std::string(key)}) + ": " + train_key + " and optimizer." +
                  key + " both set: give one of the two");
    if (!o.contains(key)) o[key] = c.get_double(train_key);
  }
  return o;
}

}  // namespace

JobConfig JobConfig::from(const Config& c) {
  JobConfig j;
  j.origin = c.origin();
  j.source = c;
  read_fields(c, j);
  check_memory(c, j.memory);
  check_train(c, j.train);
  check_run(c, j.run, j.train);
  // train.bucket_mb by device unless given: on a GPU a 4 MiB bucket is a
  // latency-bound all-reduce (hundreds a step); 25 MiB is PyTorch DDP's default.
  if (!c.has("train.bucket_mb")) j.train.bucket_mb = j.run.device == DeviceKind::Cuda ? 25.0 : 4.0;
  const MemoryConfig& m = j.memory;
  const RunConfig& r = j.run;
  if (m.offload) {
    if (r.device != DeviceKind::Cuda)
      throw Error(c.origin_of_any({"memory.offload", "run.device"}) +
                  ": memory.offload = true moves CUDA activations to host memory, but this job runs on the CPU "
                  "(run.device = \"" + c.get_string("run.device") + "\"), where they already are");
    if (m.checkpoint.empty())
      throw Error(c.origin_of_any({"memory.offload", "memory.checkpoint"}) +
                  ": memory.offload = true offloads the inputs that checkpointed nodes keep for backward: "
                  "list the nodes in memory.checkpoint");
  }
  if (c.has("comm.cuda_backend") && r.device != DeviceKind::Cuda)
    throw Error(c.origin_of_any({"comm.cuda_backend", "run.device"}) +
                ": comm.cuda_backend is set but the job runs on the CPU (run.device = \"" + c.get_string("run.device") +
                "\")");
  if (j.comm.p2p_semantics == "rendezvous" && r.device == DeviceKind::Cuda)
    throw Error(c.origin_of_any({"comm.p2p_semantics", "run.device"}) +
                ": comm.p2p_semantics = \"rendezvous\" gives CPU sends NCCL's rules, for tests; a CUDA job has "
                "NCCL's own (or Gloo's through host memory): leave it out");
  j.adapter = c.has("model.adapter") ? c.get_string("model.adapter") : "";
  j.model = c.section_json("model");
  j.model.erase("adapter");
  j.partition = c.section_json("partition");
  j.optimizer = optimizer_config(c, j.train.optimizer);
  j.parallel_json = c.section_json("parallel");
  j.plugin_tables = c.plugin_tables();
  return j;
}

}  // namespace smp
