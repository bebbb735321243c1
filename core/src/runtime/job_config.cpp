#include <smp/error.h>
#include <smp/job_config.h>

#include <ATen/Context.h>

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
  // "auto": the GPU runtime comes with the GPU issue; until the executor
  // places tensors on it, auto means the CPU.
  return DeviceKind::Cpu;
}

}  // namespace

JobConfig JobConfig::from(const Config& c) {
  JobConfig j;
  j.origin = c.origin();
  ParallelConfig& p = j.parallel;
  p.pp = static_cast<int>(c.get_int("parallel.pp"));
  p.dp = static_cast<int>(c.get_int("parallel.dp"));
  p.tp = static_cast<int>(c.get_int("parallel.tp"));
  p.ep = static_cast<int>(c.get_int("parallel.ep"));
  p.microbatches = static_cast<int>(c.get_int("parallel.microbatches"));
  p.schedule = c.get_string("parallel.schedule");
  p.virtual_stages = static_cast<int>(c.get_int("parallel.virtual_stages"));
  p.partition = c.get_string("parallel.partition");
  p.placement = c.get_string("parallel.placement");
  p.sequence_parallel = c.get_bool("parallel.sequence_parallel");
  p.tie_across_stages = c.get_bool("parallel.tie_across_stages");
  p.tp_replicate_indivisible = c.get_bool("parallel.tp_replicate_indivisible");

  TrainConfig& t = j.train;
  t.steps = c.get_int("train.steps");
  t.batch_size = c.get_int("train.batch_size");
  t.seed = static_cast<uint64_t>(c.get_int("train.seed"));
  t.lr = c.get_double("train.lr");
  t.min_lr = c.get_double("train.min_lr");
  t.warmup_steps = c.get_int("train.warmup_steps");
  t.weight_decay = c.get_double("train.weight_decay");
  t.beta1 = c.get_double("train.beta1");
  t.beta2 = c.get_double("train.beta2");
  t.eps = c.get_double("train.eps");
  t.grad_clip = c.get_double("train.grad_clip");
  t.val_every = c.get_int("train.val_every");
  t.val_batches = c.get_int("train.val_batches");
  t.log_every = c.get_int("train.log_every");
  t.bucket_bytes = static_cast<int64_t>(c.get_double("train.bucket_mb") * 1024 * 1024);

  RunConfig& r = j.run;
  r.dir = c.get_string("run.dir");
  r.log_to_file = c.get_bool("run.log_to_file");
  r.timeout_s = c.get_double("run.timeout_s");
  r.threads = static_cast<int>(c.get_int("run.threads"));
  r.device = resolve_device(c.get_string("run.device"), c.origin());
  r.dump_parameters = c.get_bool("run.dump_parameters");

  j.shm_slot_bytes = static_cast<int64_t>(c.get_double("comm.shm_mb") * 1024 * 1024);
  j.plugin_paths = c.get_string_array("plugins.paths");
  j.adapter = c.has("model.adapter") ? c.get_string("model.adapter") : "";
  j.model = c.section_json("model");
  j.model.erase("adapter");
  j.partition = c.section_json("partition");
  j.parallel_json = c.section_json("parallel");
  return j;
}

}  // namespace smp
