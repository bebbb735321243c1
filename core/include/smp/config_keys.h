// The job configuration's keys, each declared once. From these lists come the
// schema that checks a job file (core/src/base/config.cpp), the typed structs
// with their defaults (job_config.h), the reading of one into the other
// (JobConfig::from) and the key reference (docs/config-reference.md).
//
// X(field, "table.key", C++ type, check, default, presence, "doc line")
//   check:    what a value must satisfy beyond its type (config.cpp's Rule)
//   presence: Default (absent = the default) or Derived (no default in the
//             schema: parallel.dp is derived from the world size, memory.shard
//             is another way to give parallel.zero)
// Types: int, int64_t, uint64_t, double, bool, std::string, Strings, Ints,
// DeviceList, AxisSizes, AxisJoins, Precision, DeviceKind (job_config.h).
// Tables that plugins own (their keys declared and checked by the plugin) are
// not here: see SMP_EXTENSION_CONFIG in abi.h.
#pragma once

#define SMP_PARALLEL_KEYS(X)                                                                                        \
  X(pp, "parallel.pp", int, Positive, 1, Default, "pipeline-parallel degree (stages)")                            \
  X(tp, "parallel.tp", int, Positive, 1, Default, "tensor-parallel degree")                                       \
  X(cp, "parallel.cp", int, Positive, 1, Default,                                                                  \
    "context parallelism: every sample's sequence split over cp ranks (chunks r and 2 cp - 1 - r of 2 cp), "       \
    "attention over the whole sequence by parallel.cp_mode; the mesh dimension \"cp\", just outside tp unless "  \
    "parallel.placement names it")                                                                                 \
  X(cp_mode, "parallel.cp_mode", std::string, CpMode, "ring", Default,                                             \
    "how attention spans the cp ranks: \"ring\" (key/value blocks travel round the ring, overlapped with the "    \
    "block computation) or \"alltoall\" (DeepSpeed-Ulysses: heads and kv heads divisible by cp)")                 \
  X(dp, "parallel.dp", int, Positive, 1, Derived,                                                                  \
    "data-parallel degree; default world / (pp x tp), and pp x tp x dp must be the world")                         \
  X(ep, "parallel.ep", int, Positive, 1, Default,                                                                  \
    "expert parallelism: the dp ranks of a (pp, tp) slice split into groups of ep that exchange tokens; "          \
    "expert parameters are data-parallel over the other dp / ep ranks (edp)")                                      \
  X(microbatches, "parallel.microbatches", int, Positive, 1, Default, "microbatches per step and data-parallel rank") \
  X(schedule, "parallel.schedule", std::string, Schedule, "1f1b", Default, "pipeline schedule")                   \
  X(virtual_stages, "parallel.virtual_stages", int, Positive, 1, Default,                                          \
    "model chunks per pipeline rank (interleaved-1f1b only)")                                                      \
  X(layout, "parallel.layout", std::string, LayoutMode, "manual", Default,                                         \
    "manual: the layout as these keys give it; auto: smp-launch runs smp-plan for parallel.cluster and sets tp, "  \
    "pp, dp, ep, microbatches, schedule, virtual_stages, zero and memory.checkpoint to the layout it predicts "     \
    "fastest (the run then records \"planned\")")                                                                   \
  X(cluster, "parallel.cluster", std::string, None, "", Default,                                                   \
    "with parallel.layout = \"auto\": the cluster to plan for, a preset (dgx-a100-80gb, dgx-h100, dgx-h200) or "   \
    "a cluster file (smp-plan --calibrate writes one for this machine)")                                           \
  X(partition, "parallel.partition", std::string, None, "balanced", Default,                                      \
    "partition strategy of a loaded plugin (smp_partition: balanced, tree, manual); its options in [partition]")   \
  X(placement, "parallel.placement", std::string, Placement, "pp,dp,tp", Default,                                  \
    "rank order of the mesh dimensions, slowest- to fastest-varying; an axis of parallel.axes it does not name "   \
    "goes just outside tp")                                                                                        \
  X(axes, "parallel.axes", AxisSizes, None, AxisSizes{}, Default,                                                  \
    "the job's own mesh dimensions beyond pp, dp, tp and cp, e.g. { tok = 2 }: model axes that replicate the "  \
    "batch and split what the loaded plugins' rules for them split (in name order, after tp's), unless "        \
    "parallel.sequence_axes names them")                                                                           \
  X(sequence_axes, "parallel.sequence_axes", Strings, None, Strings{}, Default,                                    \
    "axes of parallel.axes that split every sample's sequence as parallel.cp's \"cp\" does (the sequence role: "   \
    "the adapter cuts its sequences, every kind needs a rule for the axis, the loss is a sum over it)")           \
  X(flatten, "parallel.flatten", AxisJoins, None, AxisJoins{}, Default,                                            \
    "derived axes joining dimensions, slowest first, e.g. { dp_cp = [\"dp\", \"cp\"] }: each has a communicator "  \
    "a plugin can ask for")                                                                                        \
  X(tie_across_stages, "parallel.tie_across_stages", bool, None, true, Default,                                    \
    "tied modules may sit on several pipeline stages (their gradients are summed over them)")                      \
  X(tp_replicate_indivisible, "parallel.tp_replicate_indivisible", bool, None, false, Default,                     \
    "keep a node replicated (with a warning) when its sizes do not divide tp, instead of failing")

#define SMP_MEMORY_KEYS(X)                                                                                          \
  X(zero, "parallel.zero", int, ZeroStage, 0, Default,                                                             \
    "sharded data parallelism (ZeRO): 0 none, 1 optimizer state, 2 + gradients, 3 + parameters")                   \
  X(shard, "memory.shard", std::string, ShardName, "", Derived,                                                    \
    "the ZeRO stage by name; give it or parallel.zero (both only if they agree)")                                  \
  X(checkpoint, "memory.checkpoint", Strings, None, Strings{}, Default,                                            \
    "activation checkpointing: nodes whose kind, name or name prefix is listed recompute their activations "       \
    "in backward")                                                                                                 \
  X(checkpoint_every, "memory.checkpoint_every", int, Positive, 1, Default,                                        \
    "of the nodes memory.checkpoint selects, every n-th")                                                          \
  X(checkpoint_attention_core, "memory.checkpoint_attention_core", Strings, None, Strings{}, Default,              \
    "selective checkpointing: the listed nodes recompute their attention core (softmax(Q K^T) V) in backward")     \
  X(offload, "memory.offload", bool, None, false, Default,                                                         \
    "CUDA only: the inputs checkpointed nodes keep for backward wait in pinned host memory")                       \
  X(offload_horizon, "memory.offload_horizon", int, Positive, 4, Default,                                          \
    "offloaded inputs are loaded back this many backward passes ahead")

#define SMP_TRAIN_KEYS(X)                                                                                           \
  X(steps, "train.steps", int64_t, NonNegative, 10, Default, "training steps")                                     \
  X(batch_size, "train.batch_size", int64_t, Positive, 8, Default,                                                 \
    "global batch (samples per step); a multiple of dp x microbatches")                                            \
  X(seed, "train.seed", uint64_t, None, 1234, Default, "seeds initialisation, data order and dropout (counter-based)") \
  X(lr, "train.lr", double, NonNegativeReal, 3e-4, Default, "peak learning rate")                                  \
  X(min_lr, "train.min_lr", double, NonNegativeReal, 3e-5, Default, "learning rate at the end of the cosine decay") \
  X(warmup_steps, "train.warmup_steps", int64_t, NonNegative, 0, Default,                                          \
    "linear warm-up steps before the cosine decay")                                                                \
  X(optimizer, "train.optimizer", std::string, None, "adamw", Default,                                             \
    "an optimizer kind of a loaded plugin (smp_optim: adamw, sgd); its own settings in [optimizer]")               \
  X(weight_decay, "train.weight_decay", double, NonNegativeReal, 0.1, Default,                                    \
    "decoupled weight decay (p <- p (1 - lr wd)), on the tensors train.weight_decay_on names")                     \
  X(weight_decay_on, "train.weight_decay_on", std::string, DecayOn, "matrices", Default,                            \
    "matrices: parameters of 2 or more dimensions (GPT-style); all: every parameter (torch.optim.AdamW's)")        \
  X(beta1, "train.beta1", double, UnitInterval, 0.9, Default, "AdamW's beta1 (refused with another optimizer)")    \
  X(beta2, "train.beta2", double, UnitInterval, 0.95, Default, "AdamW's beta2 (refused with another optimizer)")   \
  X(eps, "train.eps", double, PositiveReal, 1e-8, Default, "AdamW's epsilon (refused with another optimizer)")     \
  X(grad_clip, "train.grad_clip", double, NonNegativeReal, 1.0, Default, "global gradient-norm clipping; 0 = off") \
  X(val_every, "train.val_every", int64_t, NonNegative, 0, Default,                                                \
    "smp::Trainer: validate every n steps (and at the end); 0 = at the end")                                                     \
  X(val_batches, "train.val_batches", int64_t, NonNegative, 2, Default,                                            \
    "global batches per validation; 0 = no validation")                                                           \
  X(log_every, "train.log_every", int64_t, Positive, 1, Default, "a progress line every n steps (rank 0)")          \
  X(bucket_mb, "train.bucket_mb", double, BucketMiB,       4.0, Derived,                                           \
    "DDP-style gradient buckets (MiB) reduced while backward runs; 0 = one reduction after backward; default 25 "  \
    "on CUDA (as PyTorch's DDP: fewer, larger all-reduces, which NCCL needs to reach its bandwidth), 4 on the CPU") \
  X(precision, "train.precision", Precision, Precision, Precision::Fp32, Default,                                  \
    "compute dtype of parameters and activations; 16-bit keeps fp32 masters and optimizer state")                 \
  X(grad_reduce_dtype, "train.grad_reduce_dtype", Precision, Precision, Precision::Fp32, Default,                  \
    "dtype gradients are accumulated and reduced in: fp32 or the compute dtype")                                   \
  X(initial_loss_scale, "train.initial_loss_scale", double, PositiveReal, 65536.0, Default,                        \
    "fp16 only: the dynamic loss scale to start with")                                                             \
  X(loss_scale_window, "train.loss_scale_window", int64_t, Positive, 1000, Default,                                \
    "fp16 only: good steps in a row before the loss scale doubles")                                                \
  X(min_loss_scale, "train.min_loss_scale", double, PositiveReal, 1.0, Default,                                    \
    "fp16 only: the loss scale never goes below")

#define SMP_RUN_KEYS(X)                                                                                             \
  X(dir, "run.dir", std::string, None, "runs/default", Default, "where logs, summary.json, report.html and traces go") \
  X(log_to_file, "run.log_to_file", bool, None, true, Default, "each rank also logs to <run.dir>/logs/rank-<r>.log") \
  X(timeout_s, "run.timeout_s", double, PositiveSeconds, 300.0, Default,                                              \
    "rendezvous and collective timeout; a rank waiting longer fails naming the group")                             \
  X(threads, "run.threads", int, NonNegative, 0, Default,                                                          \
    "intra-op threads per rank; 0 = OMP_NUM_THREADS or LibTorch's; at most the machine's cores "                   \
    "(std::thread::hardware_concurrency) unless run.threads_oversubscribe")                                        \
  X(threads_oversubscribe, "run.threads_oversubscribe", bool, None, false, Default,                                \
    "allow run.threads above the machine's cores (each rank's threads then share cores, as MPI's --oversubscribe)") \
  X(device, "run.device", DeviceKind, Device, DeviceKind::Auto, Default,                                           \
    "auto = CUDA when this build has it and a GPU is present")                                                     \
  X(devices, "run.devices", DeviceList, None, DeviceList{}, Default,                                               \
    "with run.device = cuda: the GPU of each local rank (entries may repeat: ranks sharing a GPU)")                \
  X(dump_parameters, "run.dump_parameters", bool, None, false, Default,                                            \
    "smp::Trainer: each rank writes its parameter shards to <run.dir>/parameters/rank-<r>.json at the end and to "               \
    "parameters-initial/ before the first step (small models)")                                                    \
  X(trace, "run.trace", bool, None, false, Default,                                                                \
    "smp::Trainer: each rank writes a Chrome / Perfetto trace of the run.trace_steps steps to <run.dir>/trace/")                 \
  X(trace_steps, "run.trace_steps", Ints, None, (Ints{1, 3}), Default,                                             \
    "[from, to], training steps (1-based, inclusive) that run.trace and run.profile_ops record")                   \
  X(trace_merge, "run.trace_merge", bool, None, false, Default,                                                    \
    "rank 0 also writes <run.dir>/trace.json, a track per rank")                                                   \
  X(profile_ops, "run.profile_ops", bool, None, false, Default,                                                    \
    "smp::Trainer: every ATen op and autograd node of the traced steps by name, to <run.dir>/ops/rank-<r>.json")            \
  X(checkpoint_every, "run.checkpoint_every", int64_t, NonNegative, 0, Default,                                   \
    "smp::Trainer: save a checkpoint every n steps and after the last one; 0 = never")                                           \
  X(checkpoint_dir, "run.checkpoint_dir", std::string, None, "", Default,                                         \
    "where checkpoints go (one folder per step and a `latest` pointer); \"\" = <run.dir>/checkpoints")             \
  X(keep_checkpoints, "run.keep_checkpoints", int, NonNegative, 3, Default,                                       \
    "the newest n checkpoints in run.checkpoint_dir are kept, older ones deleted; 0 = keep all")                   \
  X(snapshot_every, "run.snapshot_every", int64_t, NonNegative, 0, Default,                                      \
    "smp::Trainer: every n steps each rank's state to its machine's memory (run.snapshot_dir) and a copy to its "  \
    "counterpart on the next machine; an elastic job that loses a machine resumes from it, reading no disk, "      \
    "having lost at most n steps; 0 = never")                                                                     \
  X(snapshot_dir, "run.snapshot_dir", std::string, None, "/dev/shm", Default,                                     \
    "where run.snapshot_every keeps each machine's snapshots: a folder in its memory (tmpfs)")                     \
  X(checkpoint_async, "run.checkpoint_async", bool, None, true, Default,                                          \
    "write checkpoints in the background: the step waits only while the state is copied to host memory")           \
  X(exit_after_steps, "run.exit_after_steps", int64_t, NonNegative, 0, Default,                                  \
    "smp::Trainer: stop once this run has taken n steps (saving a checkpoint first when run.checkpoint_every > 0), as "          \
    "Megatron's --exit-interval: the schedule still spans train.steps; 0 = run to train.steps")                    \
  X(hang_timeout_s, "run.hang_timeout_s", double, NonNegativeSeconds, 0.0, Default,                                 \
    "smp::Trainer, under smp-launch: a rank that completes no step (or load, save, validation) for this long is reported "       \
    "with its last lines and treated as failed (restarted with --max-restarts); 0 = never")                        \
  X(resume, "run.resume", std::string, None, "auto", Default,                                                     \
    "auto: continue from the newest checkpoint in run.checkpoint_dir when there is one; never; latest: that "      \
    "one, an error when there is none; or a checkpoint folder (any layout). A runtime resumes at create only "     \
    "when asked: this key or run.checkpoint_dir given (smp-worker gives \"auto\"), or a restarted rank")                                       \
  X(init_from, "run.init_from", std::string, None, "", Default,                                                   \
    "a checkpoint folder (e.g. from smp-checkpoint import) whose parameters start a run that does not resume; "    \
    "its optimizer state and step are not used")

// The keys only the training loop (smp::Trainer, which smp-worker runs) acts
// on: a Runtime stepped without a Trainer refuses, at its first step, such a
// key that asks for something (a value other than 0 / false), naming it,
// rather than ignore it.
#define SMP_TRAINER_KEYS(K)                                                                                         \
  K("run.checkpoint_every") K("train.val_every") K("run.trace") K("run.profile_ops") K("run.dump_parameters")      \
  K("run.exit_after_steps") K("run.hang_timeout_s") K("run.snapshot_every")

#define SMP_COMM_KEYS(X)                                                                                            \
  X(shm_mb, "comm.shm_mb", double, ShmMiB, 16.0, Default,                                                 \
    "CPU collectives and pipeline sends through shared memory on one host, slots of this many MiB; 0 = Gloo")      \
  X(cuda_backend, "comm.cuda_backend", std::string, CudaBackend, "auto", Default,                                  \
    "what carries CUDA tensors: nccl, gloo (through host memory), or auto (NCCL unless ranks share a GPU)")   \
  X(p2p_semantics, "comm.p2p_semantics", std::string, P2pSemantics, "buffered", Default,                           \
    "CPU sends and receives: buffered (as Gloo and shared memory give them) or rendezvous (NCCL's rules, for "     \
    "tests: a send completes when its receive runs, a pair's ops in posted order; a hang is reported after "       \
    "run.timeout_s naming the ops)")

#define SMP_PLUGINS_KEYS(X)                                                                                         \
  X(paths, "plugins.paths", Strings, None, Strings{}, Default,                                                     \
    "plugins to load besides --plugin (by path or name, searched in SMP_PLUGIN_PATH and the install)")

// Every list, in the order of the reference: (struct of JobConfig, list).
#define SMP_CONFIG_TABLES(T)          \
  T(parallel, SMP_PARALLEL_KEYS)      \
  T(memory, SMP_MEMORY_KEYS)          \
  T(train, SMP_TRAIN_KEYS)            \
  T(run, SMP_RUN_KEYS)                \
  T(comm, SMP_COMM_KEYS)              \
  T(plugins, SMP_PLUGINS_KEYS)
