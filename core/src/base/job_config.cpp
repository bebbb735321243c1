#include <smp/error.h>
#include <smp/job_config.h>

#include <ATen/Context.h>
#include <torch/version.h>

#include <nlohmann/json.hpp>

namespace smp {

namespace {

DeviceKind resolve_device(const std::string& device, const std::string& origin) {
  const bool have_cuda = at::hasCUDA();
  if (device == "cpu") return DeviceKind::Cpu;
  if (device == "cuda") {
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

namespace {

ParallelConfig parallel_of(const Config& c) {
  ParallelConfig p;
  p.pp = static_cast<int>(c.get_int("parallel.pp"));
  p.dp = static_cast<int>(c.get_int("parallel.dp"));
  p.tp = static_cast<int>(c.get_int("parallel.tp"));
  p.ep = static_cast<int>(c.get_int("parallel.ep"));
  p.microbatches = static_cast<int>(c.get_int("parallel.microbatches"));
  p.schedule = c.get_string("parallel.schedule");
  p.virtual_stages = static_cast<int>(c.get_int("parallel.virtual_stages"));
  p.partition = c.get_string("parallel.partition");
  p.placement = c.get_string("parallel.placement");
  const nlohmann::json par = c.section_json("parallel");
  for (const auto& [name, size] : par["axes"].items()) p.axes.emplace_back(name, size.get<int>());
  for (const auto& [name, dims] : par["flatten"].items())
    p.flatten.emplace_back(name, dims.get<std::vector<std::string>>());
  p.sequence_parallel = c.get_bool("parallel.sequence_parallel");
  p.tie_across_stages = c.get_bool("parallel.tie_across_stages");
  p.tp_replicate_indivisible = c.get_bool("parallel.tp_replicate_indivisible");
  return p;
}

MemoryConfig memory_of(const Config& c) {
  MemoryConfig m;
  m.zero = static_cast<int>(c.get_int("parallel.zero"));
  if (c.has("memory.shard")) {
    const std::string shard = c.get_string("memory.shard");
    const int named = shard == "optimizer" ? 1 : shard == "gradients" ? 2 : shard == "parameters" ? 3 : 0;
    if (c.has("parallel.zero") && named != m.zero)
      throw Error(c.origin() + ": memory.shard = \"" + shard + "\" (ZeRO stage " + std::to_string(named) +
                  ") contradicts parallel.zero = " + std::to_string(m.zero) + ": give one of the two");
    m.zero = named;
  }
  m.checkpoint = c.get_string_array("memory.checkpoint");
  m.checkpoint_every = static_cast<int>(c.get_int("memory.checkpoint_every"));
  if (c.has("memory.checkpoint_every") && m.checkpoint.empty())
    throw Error(c.origin() + ": memory.checkpoint_every is set but memory.checkpoint lists no nodes");
  m.checkpoint_attention_core = c.get_string_array("memory.checkpoint_attention_core");
  m.offload = c.get_bool("memory.offload");
  m.offload_horizon = static_cast<int>(c.get_int("memory.offload_horizon"));
  if (c.has("memory.offload_horizon") && !m.offload)
    throw Error(c.origin() + ": memory.offload_horizon is set but memory.offload is not true");
  return m;
}

TrainConfig train_of(const Config& c) {
  TrainConfig t;
  t.steps = c.get_int("train.steps");
  t.batch_size = c.get_int("train.batch_size");
  t.seed = static_cast<uint64_t>(c.get_int("train.seed"));
  t.lr = c.get_double("train.lr");
  t.min_lr = c.get_double("train.min_lr");
  t.warmup_steps = c.get_int("train.warmup_steps");
  t.optimizer = c.get_string("train.optimizer");
  t.weight_decay = c.get_double("train.weight_decay");
  t.grad_clip = c.get_double("train.grad_clip");
  t.val_every = c.get_int("train.val_every");
  t.val_batches = c.get_int("train.val_batches");
  t.log_every = c.get_int("train.log_every");
  t.bucket_bytes = static_cast<int64_t>(c.get_double("train.bucket_mb") * 1024 * 1024);
  t.precision = precision_of(c.get_string("train.precision"));
  t.grad_reduce = precision_of(c.get_string("train.grad_reduce_dtype"));
  if (t.grad_reduce != Precision::Fp32 && t.grad_reduce != t.precision)
    throw Error(c.origin() + ": train.grad_reduce_dtype = \"" + to_string(t.grad_reduce) +
                "\": gradients are reduced in fp32 or in the compute dtype (train.precision = \"" +
                to_string(t.precision) + "\")");
  for (const char* key : {"train.initial_loss_scale", "train.loss_scale_window", "train.min_loss_scale"})
    if (c.has(key) && t.precision != Precision::Fp16)
      throw Error(c.origin() + ": " + key + " is only used with train.precision = \"fp16\" (this job: \"" +
                  to_string(t.precision) + "\")");
  t.initial_loss_scale = c.get_double("train.initial_loss_scale");
  t.loss_scale_window = c.get_int("train.loss_scale_window");
  t.min_loss_scale = c.get_double("train.min_loss_scale");
  if (t.min_loss_scale > t.initial_loss_scale)
    throw Error(c.origin() + ": train.min_loss_scale (" + std::to_string(t.min_loss_scale) +
                ") is above train.initial_loss_scale (" + std::to_string(t.initial_loss_scale) + ")");
  return t;
}

RunConfig run_of(const Config& c, const TrainConfig& t) {
  RunConfig r;
  r.dir = c.get_string("run.dir");
  r.log_to_file = c.get_bool("run.log_to_file");
  r.timeout_s = c.get_double("run.timeout_s");
  r.threads = static_cast<int>(c.get_int("run.threads"));
  r.device = resolve_device(c.get_string("run.device"), c.origin());
  for (int64_t d : c.get_int_array("run.devices")) r.devices.push_back(static_cast<int>(d));
  if (!r.devices.empty() && r.device != DeviceKind::Cuda)
    throw Error(c.origin() + ": run.devices is set but the job runs on the CPU (run.device = \"" +
                c.get_string("run.device") + "\")");
#if TORCH_VERSION_MAJOR < 2
  // LibTorch 1.x has no fp16 GEMM on the CPU ("addmm_impl_cpu_" not implemented
  // for 'Half'): refuse before any rank starts rather than fail in the first step.
  if (t.precision == Precision::Fp16 && r.device == DeviceKind::Cpu)
    throw Error(c.origin() + ": train.precision = \"fp16\" on the CPU needs LibTorch 2 or later (this is " +
                TORCH_VERSION + ", without fp16 matrix multiplies on the CPU): use \"bf16\", or a CUDA device");
#endif
  r.dump_parameters = c.get_bool("run.dump_parameters");
  r.trace = c.get_bool("run.trace");
  r.trace_merge = c.get_bool("run.trace_merge");
  const std::vector<int64_t> window = c.get_int_array("run.trace_steps");
  if (window.size() != 2 || window[0] < 1 || window[1] < window[0])
    throw Error(c.origin() + ": run.trace_steps: expected [from, to] with 1 <= from <= to (training steps, "
                "1-based), got " + nlohmann::json(window).dump());
  r.trace_first = window[0], r.trace_last = window[1];
  r.profile_ops = c.get_bool("run.profile_ops");
  if (c.has("run.trace_steps") && !r.trace && !r.profile_ops)
    throw Error(c.origin() + ": run.trace_steps is set but neither run.trace nor run.profile_ops is true");
  if (c.has("run.trace_merge") && !r.trace)
    throw Error(c.origin() + ": run.trace_merge is set but run.trace is not true");
  return r;
}

// [optimizer], and AdamW's three train.* keys: given in one place each, and
// never to another optimizer (no key is accepted and then ignored).
nlohmann::json optimizer_config(const Config& c, const std::string& optimizer) {
  nlohmann::json o = c.section_json("optimizer");
  for (const char* key : {"beta1", "beta2", "eps"}) {
    const std::string train_key = std::string("train.") + key;
    if (optimizer != "adamw") {
      if (c.has(train_key))
        throw Error(c.origin() + ": " + train_key + " is AdamW's, but train.optimizer = \"" + optimizer +
                    "\" (give its settings in [optimizer])");
      continue;
    }
    if (o.contains(key) && c.has(train_key))
      throw Error(c.origin() + ": " + train_key + " and optimizer." + key + " both set: give one of the two");
    if (!o.contains(key)) o[key] = c.get_double(train_key);
  }
  return o;
}

}  // namespace

JobConfig JobConfig::from(const Config& c) {
  JobConfig j;
  j.origin = c.origin();
  j.parallel = parallel_of(c);
  j.memory = memory_of(c);
  j.train = train_of(c);
  j.run = run_of(c, j.train);
  const MemoryConfig& m = j.memory;
  const RunConfig& r = j.run;
  if (m.offload) {
    if (r.device != DeviceKind::Cuda)
      throw Error(c.origin() + ": memory.offload = true moves CUDA activations to host memory, but this job runs "
                  "on the CPU (run.device = \"" + c.get_string("run.device") + "\"), where they already are");
    if (m.checkpoint.empty())
      throw Error(c.origin() + ": memory.offload = true offloads the inputs that checkpointed nodes keep for "
                  "backward: list the nodes in memory.checkpoint");
  }

  j.shm_slot_bytes = static_cast<int64_t>(c.get_double("comm.shm_mb") * 1024 * 1024);
  j.cuda_backend = c.get_string("comm.cuda_backend");
  if (c.has("comm.cuda_backend") && r.device != DeviceKind::Cuda)
    throw Error(c.origin() + ": comm.cuda_backend is set but the job runs on the CPU (run.device = \"" +
                c.get_string("run.device") + "\")");
  j.plugin_paths = c.get_string_array("plugins.paths");
  j.adapter = c.has("model.adapter") ? c.get_string("model.adapter") : "";
  j.model = c.section_json("model");
  j.model.erase("adapter");
  j.partition = c.section_json("partition");
  j.optimizer = optimizer_config(c, j.train.optimizer);
  j.parallel_json = c.section_json("parallel");
  return j;
}

}  // namespace smp
