/*
 * smp plugin ABI 2.x — the only contract between libsmp_core and plugins.
 *
 * Pure C (C11 and C++). No C++ or LibTorch types cross this boundary.
 *
 * Versioning (after PJRT / Triton backends):
 *   - SMP_ABI_VERSION_MAJOR changes on any incompatible change (a field removed,
 *     reordered or retyped). The host refuses a plugin with another major, by
 *     name and version: the first five descriptor fields (struct_size, name,
 *     plugin_version, abi_major, abi_minor) keep their place in every major, and
 *     a plugin handed a host of another major returns its descriptor untouched
 *     so the host can say who it refuses.
 *   - SMP_ABI_VERSION_MINOR changes when fields are appended to a struct or
 *     functions appended to a table. The host refuses a plugin built for a newer
 *     minor than its own. A plugin accepts any host of its major whose table
 *     holds the 2.0 functions and checks a later function before calling it
 *     (SMP_HAS_FIELD(host, smp_host_api, fn)); it may refuse a host that lacks
 *     a feature it cannot work without, naming it.
 *   - Every struct that crosses the boundary starts with `size_t struct_size`,
 *     filled by whoever fills the struct with the type's SMP_*_STRUCT_SIZE
 *     constant (below), so the reader knows which fields the writer knew about.
 *
 * Extensions (after PJRT's extension_start): capabilities that are optional, or
 * that one side may lack, hang off `extension_start` of the host table and of
 * the plugin descriptor as a singly linked chain of structs that each begin
 * with smp_extension_base. A reader walks the chain and skips types it does not
 * know; a plugin that needs a host extension looks for it in its entry point
 * and refuses the host with an error naming it when it is missing (the SDK's
 * PluginBuilder::require_host_extension does this). Extension types are
 * numbered here and never reused; each extension struct is versioned by its
 * own struct_size. This lets the ABI grow without a new major. Since 2.5
 * smp_module_context has a chain too, and the core structs gain no more
 * fields: new capabilities are extensions (the memory contract, a plugin's
 * configuration tables, the mesh, communication).
 *
 * Mesh and placements (after PyTorch DTensor): a module is given the rank's
 * device mesh (smp_module_context.mesh), and asks the host for its position on
 * any named axis (host->mesh_axis) and that axis' communicator
 * (host->mesh_comm). Axes: "pp", "dp", "tp", "ep" (expert parallel, a split of
 * dp), "edp" (the dp ranks holding the same experts), "mp", "world", "cp" (the
 * sequence axis, parallel.cp), and any a job declares (parallel.axes; since
 * 2.4, listed by the host's SMP_EXTENSION_MESH): the core knows those by name
 * only. Since 2.8 each dimension's role (what it splits: the batch, the
 * sequence or the model) is in its flags, and the core decides by roles. Every parameter
 * declares a placement per axis (smp_param_info.placements): replicated (the
 * default for an axis not listed), sharded along a dimension, or replicated
 * with a gradient that is partial and must be summed over the axis. The core
 * derives gradient reduction, the global gradient norm and clipping from the
 * placements alone.
 *
 * Errors: functions return `smp_error*`, NULL meaning success. Errors are made
 * by the host (host->error_create) so that one allocator owns them; whoever
 * receives an error owns it and frees it with host->error_destroy.
 * No C++ exception may cross this boundary in either direction.
 *
 * Lifetimes: every pointer argument is borrowed for the duration of the call
 * unless its comment says otherwise. "new reference" = caller must release.
 * Events from asynchronous collectives are owned by the caller: wait, then
 * destroy (destroying a pending event waits for it first).
 *
 * Loading: a plugin exports one symbol, SMP_PLUGIN_ENTRY_SYMBOL, of type
 * smp_plugin_entry_fn. The host calls it once with its API table; the plugin
 * returns its descriptor, which must stay valid until the library is unloaded.
 */
#ifndef SMP_ABI_H
#define SMP_ABI_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SMP_ABI_VERSION_MAJOR 2
#define SMP_ABI_VERSION_MINOR 8

/* The bytes of `type` up to and including `last_field`. Used only to define
 * the named SMP_*_STRUCT_SIZE constants below; fill struct_size with those. */
#define SMP_STRUCT_SIZE(type, last_field) \
  (offsetof(type, last_field) + sizeof(((type*)0)->last_field))

/* Whether a struct the other side filled holds `field`: its struct_size
 * reaches past it. The one test for a field added after its struct's first
 * minor (since 2.3; readers check fields, not the writer's minor). */
#define SMP_HAS_FIELD(ptr, type, field) ((ptr)->struct_size >= SMP_STRUCT_SIZE(type, field))

#define SMP_PLUGIN_ENTRY_SYMBOL "smp_plugin_entry"

/* ------------------------------------------------------------------------ */
/* Opaque handles                                                            */
/* ------------------------------------------------------------------------ */

typedef struct smp_error smp_error;                 /* host-owned error object */
typedef struct smp_tensor smp_tensor;               /* reference-counted tensor */
typedef struct smp_comm smp_comm;                   /* one mesh axis' communicator; borrowed */
typedef struct smp_mesh smp_mesh;                   /* the rank's device mesh; borrowed. NULL = one rank */
typedef struct smp_event smp_event;                 /* an asynchronous collective; owned by the caller */
typedef struct smp_graph_builder smp_graph_builder; /* host-owned, valid during describe() */
typedef struct smp_module smp_module;               /* plugin-owned module instance */
typedef struct smp_adapter smp_adapter;             /* plugin-owned model adapter instance */
typedef struct smp_optimizer smp_optimizer;         /* plugin-owned optimizer instance (since 2.3) */

/* DLPack's struct (ATen/dlpack.h, DLPack 0.6). Forward-declared: only pointers cross. */
struct DLManagedTensor;

typedef enum smp_error_code {
  SMP_ERR_OK = 0,
  SMP_ERR_INVALID_ARGUMENT = 1,
  SMP_ERR_UNSUPPORTED = 2,
  SMP_ERR_NOT_FOUND = 3,
  SMP_ERR_INTERNAL = 4,
  SMP_ERR_COMMUNICATION = 5,
  SMP_ERR_TIMEOUT = 6,
  SMP_ERR_OUT_OF_MEMORY = 7
} smp_error_code;

typedef enum smp_dtype {
  SMP_DTYPE_FLOAT32 = 0,
  SMP_DTYPE_FLOAT64 = 1,
  SMP_DTYPE_FLOAT16 = 2,
  SMP_DTYPE_BFLOAT16 = 3,
  SMP_DTYPE_INT64 = 4,
  SMP_DTYPE_INT32 = 5,
  SMP_DTYPE_UINT8 = 6,
  SMP_DTYPE_INT8 = 7,
  SMP_DTYPE_BOOL = 8,
  SMP_DTYPE_UNKNOWN = 255
} smp_dtype;

typedef enum smp_device_type { SMP_DEVICE_CPU = 0, SMP_DEVICE_CUDA = 1 } smp_device_type;

typedef enum smp_reduce_op {
  SMP_REDUCE_SUM = 0,
  SMP_REDUCE_MAX = 1,
  SMP_REDUCE_MIN = 2,
  SMP_REDUCE_PRODUCT = 3
} smp_reduce_op;

typedef enum smp_log_level {
  SMP_LOG_DEBUG = 0,
  SMP_LOG_INFO = 1,
  SMP_LOG_WARN = 2,
  SMP_LOG_ERROR = 3
} smp_log_level;

/* ------------------------------------------------------------------------ */
/* Extensions                                                                */
/* ------------------------------------------------------------------------ */

/* Extension type numbers. Assigned here, in order, never reused. Types at or
 * above SMP_EXTENSION_PRIVATE_BASE are free for experiments between a core and
 * a plugin built together; a reader skips any type it does not know. */
typedef enum smp_extension_type {
  SMP_EXTENSION_NONE = 0,
  SMP_EXTENSION_OPTIMIZERS = 1, /* since 2.3, on a plugin descriptor: smp_optimizers_extension */
  SMP_EXTENSION_MESH = 2,       /* since 2.4, on the host table: smp_mesh_extension */
  SMP_EXTENSION_COMM = 3,       /* since 2.4, on the host table: smp_comm_extension */
  SMP_EXTENSION_CONFIG = 4,     /* since 2.5, on a plugin descriptor: smp_config_extension */
  SMP_EXTENSION_JOB_TABLES = 5, /* since 2.5, on smp_module_context: smp_job_tables_extension */
  SMP_EXTENSION_MEMORY = 6,     /* since 2.5, on a plugin descriptor: smp_memory_extension */
  SMP_EXTENSION_DECODE = 7,     /* since 2.7, on smp_forward_args: smp_decode_extension */
  SMP_EXTENSION_INFERENCE = 8,  /* since 2.7, on a plugin descriptor: smp_inference_extension */
  SMP_EXTENSION_BATCH_AXES = 9, /* since 2.8, on smp_batch_request: smp_batch_axes_extension */
  SMP_EXTENSION_GRAPH = 10,     /* since 2.8, on the host table: smp_graph_extension */
  SMP_EXTENSION_PRIVATE_BASE = 0x10000
} smp_extension_type;

typedef struct smp_extension_base {
  size_t struct_size;                       /* of the whole extension struct */
  uint32_t type;                            /* smp_extension_type */
  uint32_t version;                         /* the extension's own version, from 1 */
  const struct smp_extension_base* next;    /* NULL ends the chain */
} smp_extension_base;

/* ------------------------------------------------------------------------ */
/* Module kinds: create from a config, forward over tensors, parameters      */
/* ------------------------------------------------------------------------ */

/* What a module instance is told about where it runs. Filled by the host. */
typedef struct smp_module_context {
  size_t struct_size;
  const char* node_name;  /* hierarchical graph name, e.g. "blocks.3.mlp" */
  uint64_t init_seed;     /* derived from the job seed and the node (or shared) key:
                             the same for every parallel layout */
  smp_device_type device_type;
  int32_t device_index;
  smp_mesh* mesh;         /* borrowed for the module's lifetime; NULL = a one-rank mesh.
                             Ask host->mesh_axis / host->mesh_comm for any axis. */
  const char* parallel_json; /* the job's [parallel] table as a JSON object, e.g.
                                {"tp": 2, ...}; borrowed for the call */
  /* Since 2.1: what the memory manager asks of this module, a JSON object
   * ("{}" = nothing): {"recompute_attention_core": true} asks it to keep no
   * activations of its attention core (softmax(Q K^T) V) and recompute them in
   * backward. Only asked of kinds whose memory features declare it
   * (SMP_EXTENSION_MEMORY, or smp_module_kind.memory_features). */
  const char* memory_json;
  /* Since 2.5: NULL, or the host's extensions for this module (e.g.
   * SMP_EXTENSION_JOB_TABLES). The struct's last field: later additions are
   * extensions. */
  const struct smp_extension_base* extension_start;
} smp_module_context;

/* One call of a module. */
typedef struct smp_forward_args {
  size_t struct_size;
  const char* method;           /* NULL or "forward"; other names for tied modules, e.g. "attend" */
  smp_tensor* const* inputs;    /* borrowed */
  size_t n_inputs;
  smp_tensor** outputs;         /* out: n_outputs new references */
  size_t n_outputs;
  int32_t training;             /* 1 during training steps (dropout on) */
  uint64_t rng_seed;            /* per call; same for every layout */
  /* Since 2.7: NULL, or the host's extensions for this call (e.g.
   * SMP_EXTENSION_DECODE). The struct's last field: later additions are
   * extensions. */
  const struct smp_extension_base* extension_start;
} smp_forward_args;

/* How a parameter lies along one mesh axis (DTensor's placements, kept small). */
typedef enum smp_placement_kind {
  SMP_PLACEMENT_REPLICATE = 0,    /* every rank of the axis holds the whole value */
  SMP_PLACEMENT_SHARD = 1,        /* rank i holds slice i of dimension `dim` */
  SMP_PLACEMENT_PARTIAL_GRAD = 2  /* replicated value, but each rank's gradient is a
                                     partial sum: the core sums it over the axis
                                     (e.g. sequence-parallel layer norms over "tp") */
} smp_placement_kind;

typedef struct smp_placement {
  size_t struct_size;
  const char* axis;         /* an axis with SMP_AXIS_RULES, or "dp" (replicated only) */
  smp_placement_kind kind;
  int32_t dim;              /* SHARD: the split dimension; else ignored */
} smp_placement;

/* Since 2.2: how a parameter created without storage (deferred init, see
 * SMP_MEMORY_FEATURE_DEFERRED_INIT) gets its values, so that the host fills
 * only the part it keeps (a ZeRO-3 dp shard) and no rank ever holds more.
 *   NORMAL:   element i of the FULL tensor (row-major, all tp ranks together)
 *             is value * N(0,1) drawn by the counter-based generator of
 *             smp/sdk/init.hpp from (key, i); the parameter is the part
 *             [slice_begin, slice_begin + slice_length) of full_shape along
 *             slice_dim (slice_dim -1: all of it).
 *   CONSTANT: every element is `value`. */
typedef enum smp_param_init_kind { SMP_PARAM_INIT_NORMAL = 0, SMP_PARAM_INIT_CONSTANT = 1 } smp_param_init_kind;

typedef struct smp_param_init {
  size_t struct_size;
  smp_param_init_kind kind;
  uint64_t key;                /* NORMAL: the draw's generator key */
  double value;                /* NORMAL: the standard deviation; CONSTANT: the value */
  const int64_t* full_shape;   /* borrowed for the call */
  size_t full_ndim;
  int32_t slice_dim;
  int64_t slice_begin;
  int64_t slice_length;
} smp_param_init;

typedef struct smp_param_info {
  size_t struct_size;
  const char* name;     /* local name, e.g. "weight"; borrowed for the call */
  smp_tensor* tensor;   /* borrowed; a leaf with requires_grad */
  const smp_placement* placements; /* one per axis that is not plain replicated; borrowed */
  size_t n_placements;
  /* Since 2.2: non-NULL when the tensor was created without storage (its
   * sizes and dtype are set, its storage holds 0 bytes); the host fills it. */
  const smp_param_init* init;
  /* Since 2.6: SMP_PARAM_FLAG_* bits (0: a trained parameter). */
  uint32_t flags;
} smp_param_info;

/* Since 2.6: the tensor is state the module updates itself in forward (a
 * running statistic: LibTorch's buffers), not a trained parameter. It gets no
 * gradient and no optimizer state, must not require grad, is saved in
 * checkpoints, and before each step the first replica along its data-parallel
 * axis sends its values to the others (DDP's broadcast_buffers). */
#define SMP_PARAM_FLAG_BUFFER 1u

typedef void (*smp_param_visitor)(void* user, const smp_param_info* param);

typedef struct smp_module_kind {
  size_t struct_size;
  const char* name;  /* unique across all loaded plugins */
  void* state;       /* passed back to create() */
  /* config_json: the node's config, a JSON object. */
  smp_error* (*create)(void* state, const char* config_json, const smp_module_context* ctx,
                       smp_module** out);
  smp_error* (*forward)(smp_module* module, const smp_forward_args* args);
  smp_error* (*parameters)(smp_module* module, smp_param_visitor visit, void* user);
  void (*destroy)(smp_module* module);
  /* Since 2.1: SMP_MEMORY_FEATURE_* bits, what memory_json may ask of this kind.
   * Since 2.5 SMP_EXTENSION_MEMORY says it, and a host reads this only from a
   * plugin without that extension. */
  uint32_t memory_features;
} smp_module_kind;

/* The module recomputes its attention core in backward when memory_json asks. */
#define SMP_MEMORY_FEATURE_RECOMPUTE_ATTENTION_CORE 1u
/* Since 2.2: asked {"deferred_init": true}, the module creates its parameters
 * without storage and describes each one's initialiser (smp_param_info.init).
 * The module must not read them before its first forward. */
#define SMP_MEMORY_FEATURE_DEFERRED_INIT 2u

/* ------------------------------------------------------------------------ */
/* Model adapters: the model as a DAG of module calls, plus batches          */
/* ------------------------------------------------------------------------ */

/* One module call. Values are named; a value is produced by one node (or is a
 * graph input) and consumed by any number of later nodes. */
typedef struct smp_graph_node {
  size_t struct_size;
  const char* name;        /* hierarchical: "blocks.3.attn"; dots give the module tree */
  const char* kind;        /* a registered module kind */
  const char* config_json; /* JSON object handed to the kind's create() */
  const char* method;      /* NULL = "forward" */
  const char* const* inputs;
  size_t n_inputs;
  const char* const* outputs;
  size_t n_outputs;
  const char* shared_key;  /* NULL, or a key: nodes with the same key share one module
                              (and so its parameters), e.g. a tied embedding / LM head */
  double flops_hint;            /* forward FLOPs per sample; 0 = unknown (profile) */
  double param_bytes_hint;      /* 0 = unknown */
  double activation_bytes_hint; /* per sample; 0 = unknown */
  /* Since 2.2, for the memory model, per sample (0 = none):
   *   activation_fp32_extra_bytes_hint: bytes kept IN ADDITION when the compute
   *     dtype is 16-bit (e.g. a softmax computed in fp32 whose 16-bit copy is
   *     kept too); actual bytes, not scaled by the compute dtype;
   *   attention_core_bytes_hint: the part of activation_bytes_hint (fp32 bytes)
   *     the node stops keeping when asked to recompute its attention core
   *     (SMP_MEMORY_FEATURE_RECOMPUTE_ATTENTION_CORE); the fp32 extra goes too. */
  double activation_fp32_extra_bytes_hint;
  double attention_core_bytes_hint;
} smp_graph_node;

typedef struct smp_adapter_context {
  size_t struct_size;
  uint64_t seed;
  /* Since 2.2: the job's [parallel] table as a JSON object (every key, defaults
   * filled), borrowed for the call: e.g. to pad a vocabulary to a multiple of
   * 128 x tp as Megatron does. */
  const char* parallel_json;
} smp_adapter_context;

typedef enum smp_split { SMP_SPLIT_TRAIN = 0, SMP_SPLIT_VALIDATION = 1 } smp_split;

/* The samples of one microbatch of one data-parallel rank. The adapter must
 * return the same samples for a given (split, step, global index) whatever the
 * layout: dp rank r takes samples [r*B/dp, (r+1)*B/dp) of the global batch B,
 * microbatch i takes its contiguous slice of those. */
typedef struct smp_batch_request {
  size_t struct_size;
  smp_split split;
  int64_t step;
  int64_t global_batch;
  int64_t first_sample;  /* index in the global batch of this microbatch's first sample */
  int64_t num_samples;
  /* Since 2.8: NULL, or the host's extensions for this request
   * (SMP_EXTENSION_BATCH_AXES: the rank's coordinates on the axes that split
   * data). The struct's last field: later additions are extensions. */
  const struct smp_extension_base* extension_start;
} smp_batch_request;

typedef struct smp_model_adapter {
  size_t struct_size;
  const char* name;
  void* state;
  /* model_config_json: the job's [model] table as JSON. */
  smp_error* (*create)(void* state, const char* model_config_json, const smp_adapter_context* ctx,
                       smp_adapter** out);
  /* Describe the graph with host->graph_add_input/graph_add_node/graph_set_loss. */
  smp_error* (*describe)(smp_adapter* adapter, smp_graph_builder* builder);
  /* outputs: one new reference per graph input, in the order they were added. */
  smp_error* (*batch)(smp_adapter* adapter, const smp_batch_request* request, smp_tensor** outputs,
                      size_t n_outputs);
  void (*destroy)(smp_adapter* adapter);
} smp_model_adapter;

/* ------------------------------------------------------------------------ */
/* Partition strategies                                                      */
/* ------------------------------------------------------------------------ */

typedef struct smp_cost_node {
  size_t struct_size;
  const char* name;        /* hierarchical, as in the graph */
  double compute;          /* seconds (or FLOPs) forward + backward per microbatch */
  double memory;           /* bytes: parameters + optimizer state + activations */
  const char* shared_key;  /* NULL or the graph's shared key */
} smp_cost_node;

typedef struct smp_cost_graph {
  size_t struct_size;
  const smp_cost_node* nodes; /* in execution (topological) order */
  size_t n_nodes;
  const int64_t* edge_src;    /* value edges: node index producing ... */
  const int64_t* edge_dst;    /* ... node index consuming */
  size_t n_edges;
} smp_cost_graph;

typedef struct smp_partition_request {
  size_t struct_size;
  const smp_cost_graph* graph;
  int32_t num_stages;
  const char* options_json; /* the job's [partition] table as JSON */
  int32_t tie_across_stages; /* 0: nodes sharing a key must land on one stage */
  int32_t* stage_of_node;   /* out: n_nodes entries in [0, num_stages) */
} smp_partition_request;

typedef struct smp_partition_strategy {
  size_t struct_size;
  const char* name;
  void* state;
  smp_error* (*partition)(void* state, const smp_partition_request* request);
} smp_partition_strategy;

/* ------------------------------------------------------------------------ */
/* Rules: per mesh axis, a serial kind becomes a distributed kind            */
/* ------------------------------------------------------------------------ */

/* When the mesh's `axis` has more than one rank, every node of `kind` becomes
 * `dist_kind` (after `check` accepts its config). "tp" rules give Megatron's
 * layers, "ep" rules expert-parallel layers; since 2.4 a rule may name any
 * axis (one the job declares, e.g. "cp"). Rules of different axes apply in
 * the order tp, the job's axes as declared, ep; a job axis of size > 1 that
 * no rule applies on is refused. */
typedef struct smp_rule {
  size_t struct_size;
  const char* axis;       /* a mesh axis rules apply on: "tp", "ep", or a job's (since 2.4) */
  const char* kind;       /* the serial kind this rule applies to */
  const char* dist_kind;  /* the kind that replaces it */
  void* state;
  /* NULL, or returns an error naming the sizes when config can't be split axis_size ways. */
  smp_error* (*check)(void* state, const char* config_json, int32_t axis_size);
  /* Since 2.1, for the memory manager's model: the fractions (0 to 1) of the
   * node's parameter bytes and of its activation bytes (its cost hints) that
   * dist_kind splits axis_size ways; the rest stays replicated. A rule of
   * minor 0 (a smaller struct_size) counts as splitting both entirely. Since
   * 2.5 SMP_EXTENSION_MEMORY says it, and a host reads these two only from a
   * plugin without that extension. */
  double param_split;
  double activation_split;
} smp_rule;

/* ------------------------------------------------------------------------ */
/* Optimizers (since 2.3): kinds a plugin lists in its descriptor's           */
/* SMP_EXTENSION_OPTIMIZERS extension; train.optimizer names one              */
/* ------------------------------------------------------------------------ */

/* The tensors an optimizer updates: each parameter as the memory manager
 * hands it over. Without ZeRO they are the parameters (or their fp32 masters
 * under 16-bit compute); under ZeRO they are this rank's 1-D shard segments of
 * them, fp32. The optimizer keeps its state in tensors of the same shape,
 * dtype and device, which the host enumerates (checkpoints) through state_tensors(). */
typedef struct smp_optimizer_create_args {
  size_t struct_size;
  const smp_extension_base* extension_start;
  const char* config_json;     /* the job's [optimizer] section, "{}" if none; the kind
                                  refuses a key it does not know, naming it */
  smp_tensor* const* params;   /* n_params handles, borrowed: retain those it keeps */
  const uint8_t* weight_decay; /* per tensor: 1 = apply weight decay (matrices), 0 = not */
  size_t n_params;
  double weight_decay_rate;    /* train.weight_decay: decoupled, lr x rate x p */
} smp_optimizer_create_args;

/* One update, on the thread that trains (the rank's training thread). */
typedef struct smp_optimizer_step_args {
  size_t struct_size;
  const smp_extension_base* extension_start;
  smp_tensor* const* grads; /* n_grads == n_params; NULL = skip that tensor; read only */
  size_t n_grads;
  double lr;
  double grad_scale;        /* the update uses grad_scale x grads[i]: the mean over the
                               step's items, clipping and the loss scale, applied on the fly */
  int64_t step;             /* updates so far, this one included (1 on the first): the host
                               keeps the count, so a restored job continues it */
} smp_optimizer_step_args;

/* Called once per state tensor; the handle is borrowed for the call (retain
 * it to keep it). `param` indexes the create call's params. */
typedef void (*smp_optimizer_state_visitor)(void* user, size_t param, const char* name, smp_tensor* state);

typedef struct smp_optimizer_kind {
  size_t struct_size;
  const smp_extension_base* extension_start;
  const char* name; /* "adamw", "sgd", "lion" */
  void* state;      /* passed back to create */
  smp_error* (*create)(void* state, const smp_optimizer_create_args* args, smp_optimizer** out);
  smp_error* (*step)(smp_optimizer* optimizer, const smp_optimizer_step_args* args);
  /* Every state tensor, by (param, name): the live tensors, which the host
   * may overwrite in place (restoring a checkpoint) between steps. */
  smp_error* (*state_tensors)(smp_optimizer* optimizer, smp_optimizer_state_visitor visit, void* user);
  void (*destroy)(smp_optimizer* optimizer);
} smp_optimizer_kind;

/* type SMP_EXTENSION_OPTIMIZERS, version 1 */
typedef struct smp_optimizers_extension {
  smp_extension_base base;
  const smp_optimizer_kind* const* kinds;
  size_t n_kinds;
} smp_optimizers_extension;

/* ------------------------------------------------------------------------ */
/* SMP_EXTENSION_MESH: the mesh's axes, by index                             */
/* ------------------------------------------------------------------------ */
/* A job's mesh has the core's axes and any a job declares (parallel.axes, e.g.
 * "cp"), which the core knows by name only. A plugin enumerates them here;
 * host->mesh_axis and host->mesh_comm take any of the names. Every axis'
 * communicator exists before the first module is created. */
typedef enum smp_axis_flags {
  SMP_AXIS_DIMENSION = 1, /* a dimension of the mesh (else derived: a split or a join of dimensions) */
  SMP_AXIS_DATA = 2,      /* over dp: gradients are already summed over it (no PARTIAL_GRAD placement) */
  SMP_AXIS_RULES = 4,     /* rules apply on it (tp, the job's axes, ep): modules may be placed on it */
  /* Since 2.8, what a dimension does (its role; at most one of the three):
   *   SPLITS_BATCH: each coordinate reads its own samples (dp);
   *   SPLITS_SEQUENCE: each coordinate holds its share of every sample's
   *     sequence (parallel.cp): parameters are replicated over it, their
   *     gradients and the loss's sums are partial and summed over it, and
   *     every node's kind must have a rule for it;
   *   SPLITS_MODEL: the batch is replicated over it and the rules split the
   *     model (tp, pp, the job's axes). */
  SMP_AXIS_SPLITS_BATCH = 8,
  SMP_AXIS_SPLITS_SEQUENCE = 16,
  SMP_AXIS_SPLITS_MODEL = 32
} smp_axis_flags;

/* type SMP_EXTENSION_MESH, version 1. A NULL mesh is a one-rank mesh with the
 * core's axes (pp, dp, tp, ep, edp, mp, world), each of size 1. */
typedef struct smp_mesh_extension {
  smp_extension_base base;
  smp_error* (*axis_count)(const smp_mesh* mesh, int32_t* count);
  /* axis `index` (0 <= index < count): its name (borrowed for the mesh's
   * lifetime), group size, this rank's coordinate and smp_axis_flags */
  smp_error* (*axis_at)(const smp_mesh* mesh, int32_t index, const char** name, int32_t* size, int32_t* rank,
                        uint32_t* flags);
} smp_mesh_extension;

/* ------------------------------------------------------------------------ */
/* SMP_EXTENSION_COMM: point-to-point, asynchronous broadcast, completion     */
/* modes and on-ready callbacks, each call with an args struct               */
/* ------------------------------------------------------------------------ */
/* Every function takes one args struct that begins with struct_size (filled
 * with its SMP_*_ARGS_STRUCT_SIZE) and an extension chain, so a call can grow
 * without a new function. The completion and threading rules of the host
 * table's events (above) hold, with these additions. */

/* How smp_comm_extension.event_wait completes an operation. */
typedef enum smp_completion_mode {
  SMP_COMPLETION_DEFAULT = 0, /* as host->event_wait: host-blocking on CPU, stream-ordered on NCCL */
  SMP_COMPLETION_HOST = 1,    /* returns once the result is readable from the host (CUDA: after the
                                 device has finished it) */
  SMP_COMPLETION_STREAM = 2   /* orders the calling thread's current stream after the operation; on CPU
                                 (no streams) the same as HOST */
} smp_completion_mode;

/* send and recv: a point-to-point transfer on a communicator. */
typedef struct smp_p2p_args {
  size_t struct_size;
  const smp_extension_base* extension_start;
  smp_comm* comm;
  smp_tensor* tensor;  /* send: read; recv: written, with the sender's shape and dtype */
  int32_t peer;        /* the other side's rank in comm */
  int32_t tag;         /* matches a send with a recv between the same two ranks */
  smp_event** event;   /* NULL: complete before returning (host-blocking); else *event completes it */
} smp_p2p_args;

typedef struct smp_broadcast_args {
  size_t struct_size;
  const smp_extension_base* extension_start;
  smp_comm* comm;
  smp_tensor* inout;   /* root's value, in place on every rank */
  int32_t root;        /* rank in comm */
  smp_event** event;   /* NULL: blocking; else *event completes it */
} smp_broadcast_args;

typedef struct smp_event_wait_args {
  size_t struct_size;
  const smp_extension_base* extension_start;
  smp_event* event;
  smp_completion_mode mode;
} smp_event_wait_args;

/* Called exactly once after the operation has finished (event_ready would
 * return 1), on a host thread that is not the rank's training thread, with
 * NULL or the operation's error (borrowed for the call; event_wait later
 * returns the same error). It must not block, nor call the host's
 * communication functions; it may signal the training thread. event_destroy
 * returns only after the callback has run. */
typedef void (*smp_event_callback)(void* user, const smp_error* error);

typedef struct smp_event_callback_args {
  size_t struct_size;
  const smp_extension_base* extension_start;
  smp_event* event;
  smp_event_callback callback;
  void* user;
} smp_event_callback_args;

/* type SMP_EXTENSION_COMM, version 1, on the host table. */
typedef struct smp_comm_extension {
  smp_extension_base base;
  smp_error* (*send)(const smp_p2p_args* args);
  smp_error* (*recv)(const smp_p2p_args* args);
  smp_error* (*broadcast)(const smp_broadcast_args* args);
  /* host->event_wait with a completion mode */
  smp_error* (*event_wait)(const smp_event_wait_args* args);
  /* at most one callback per event */
  smp_error* (*event_on_ready)(const smp_event_callback_args* args);
} smp_comm_extension;

/* ------------------------------------------------------------------------ */
/* SMP_EXTENSION_CONFIG and SMP_EXTENSION_JOB_TABLES: a plugin's own tables  */
/* of the job configuration (since 2.5)                                      */
/* ------------------------------------------------------------------------ */
/* A plugin owns settings the core does not know (smp_tp's [tp], say) by
 * declaring their table in its descriptor. The core keeps a table it does not
 * own as written; once the plugins are loaded it calls the owner's check with
 * it (with "{}" when the job has none), and refuses a table no loaded plugin
 * declares, naming it. The owner refuses a key it does not know or a bad
 * value, naming the key. Two plugins cannot declare one table. */
typedef struct smp_config_table {
  size_t struct_size;
  const char* name; /* lower-case letters, digits, '_'; not a core table (parallel, memory, train, run,
                       comm, plugins, model, partition, optimizer) */
  void* state;      /* passed back to check */
  smp_error* (*check)(void* state, const char* table_json);
} smp_config_table;

/* type SMP_EXTENSION_CONFIG, version 1, on a plugin descriptor. */
typedef struct smp_config_extension {
  smp_extension_base base;
  const smp_config_table* const* tables;
  size_t n_tables;
} smp_config_extension;

/* type SMP_EXTENSION_JOB_TABLES, version 1, on smp_module_context: the tables
 * of every loaded plugin (checked by their owners), so that a layer can read
 * a setting of the plugin it belongs to, or of another. */
typedef struct smp_job_tables_extension {
  smp_extension_base base;
  const char* tables_json; /* a JSON object by table name, e.g. {"tp": {"sequence_parallel": true}};
                              a declared table the job does not give is {}; borrowed for the call */
} smp_job_tables_extension;

/* ------------------------------------------------------------------------ */
/* SMP_EXTENSION_MEMORY: the memory contract (since 2.5)                     */
/* ------------------------------------------------------------------------ */
/* What the memory manager may ask of a plugin's module kinds, and what its
 * rules split, for the memory model. A host of 2.5 reads these from this
 * extension when a descriptor has it, and then ignores the 2.1 fields that
 * said the same (smp_module_kind.memory_features, smp_rule.param_split and
 * activation_split); it reads those fields from a plugin without it. The SDK
 * fills both, so that its plugins keep their features on hosts from 2.1 on.
 * New memory capabilities are added here (a new version of this extension, or
 * new SMP_MEMORY_FEATURE_* bits), not to the core structs. The per-call parts
 * of the contract stay with their calls and are used only with the kinds that
 * declare the feature: smp_module_context.memory_json asks, smp_param_info.init
 * answers (deferred init); smp_graph_node's byte hints are cost hints of the
 * graph like flops_hint. */
typedef struct smp_kind_memory {
  size_t struct_size;
  const char* kind;  /* a module kind this plugin registers */
  uint32_t features; /* SMP_MEMORY_FEATURE_* bits: what memory_json may ask of it */
} smp_kind_memory;

typedef struct smp_rule_memory {
  size_t struct_size;
  const char* axis;        /* a rule this plugin registers: its axis ... */
  const char* kind;        /* ... and serial kind */
  double param_split;      /* fractions (0 to 1) of the node's parameter and activation bytes */
  double activation_split; /* that the rule's dist_kind splits over the axis; the rest is replicated */
} smp_rule_memory;

/* type SMP_EXTENSION_MEMORY, version 1, on a plugin descriptor. A kind it does
 * not list has no features; a rule it does not list splits both entirely. */
typedef struct smp_memory_extension {
  smp_extension_base base;
  const smp_kind_memory* const* kinds;
  size_t n_kinds;
  const smp_rule_memory* const* rules;
  size_t n_rules;
} smp_memory_extension;

/* ------------------------------------------------------------------------ */
/* Inference (since 2.7): what kinds do outside training, and decoding calls  */
/* ------------------------------------------------------------------------ */
/* Generation feeds a model a few new positions per call and keeps what
 * attention needs of the earlier ones (a KV cache). A forward call during
 * generation carries SMP_EXTENSION_DECODE; the host issues such calls only
 * when every node that runs is of a kind that declares, for its method, that
 * it either works position by position (SMP_INFERENCE_POSITIONWISE: each
 * position's outputs depend on that position's inputs alone, so feeding fewer
 * positions changes nothing) or honours the extension (SMP_INFERENCE_DECODE);
 * it refuses any other node by name. */
#define SMP_INFERENCE_POSITIONWISE 1u
#define SMP_INFERENCE_DECODE 2u

/* What one kind (one method, or all of them) does outside training. */
typedef struct smp_kind_inference {
  size_t struct_size;
  const char* kind;       /* a module kind this plugin registers */
  const char* method;     /* NULL: every method of the kind; else this one */
  uint32_t flags;         /* SMP_INFERENCE_* bits */
  /* The output the method leaves sharded over a mesh axis (-1: none), e.g. a
   * vocabulary-parallel head's logits: rank i of shard_axis holds slice i of
   * dimension shard_dim (negative counts from the end). The host puts it
   * together (an all-gather) where a program asks for the value whole
   * (Runtime::forward). */
  int32_t sharded_output;
  const char* shard_axis;
  int32_t shard_dim;
} smp_kind_inference;

/* type SMP_EXTENSION_INFERENCE, version 1, on a plugin descriptor. A kind it
 * does not list declares nothing: no decoding through it, outputs whole. */
typedef struct smp_inference_extension {
  smp_extension_base base;
  const smp_kind_inference* const* kinds;
  size_t n_kinds;
} smp_inference_extension;

/* type SMP_EXTENSION_DECODE, version 1, on smp_forward_args.extension_start.
 * The call's inputs are positions [start[i], start[i] + s) of sample i, where
 * s is the call's sequence length (dimension 1). A kind that mixes positions
 * (attention) keeps, per sample, what later positions need of these (its K
 * and V) at their positions, attends each new position p to the kept
 * positions 0..p only (so what was kept past start[i] is overwritten, never
 * read), and offsets its position encodings by start[i]. The batch is fixed
 * while decoding: a call whose batch size or capacity differs from the cache's
 * starts a new one (then every start must be 0). A call without the extension
 * frees the cache. */
typedef struct smp_decode_extension {
  smp_extension_base base;
  const int64_t* start; /* n_samples entries, each >= 0; borrowed for the call */
  size_t n_samples;     /* the call's batch size */
  int64_t capacity;     /* positions a cache must hold: start[i] + s <= capacity */
} smp_decode_extension;

/* ------------------------------------------------------------------------ */
/* Axes that split data (since 2.8)                                          */
/* ------------------------------------------------------------------------ */
/* One axis that splits data, as a batch request sees it. */
typedef struct smp_axis_coord {
  size_t struct_size;
  const char* axis; /* the axis' name, borrowed for the call */
  uint32_t flags;   /* smp_axis_flags: SMP_AXIS_SPLITS_BATCH or SMP_AXIS_SPLITS_SEQUENCE */
  int32_t index;    /* this rank's coordinate on it */
  int32_t size;     /* the axis' size */
} smp_axis_coord;

/* type SMP_EXTENSION_BATCH_AXES, version 1, on smp_batch_request: every
 * dimension of the mesh that splits data, with this rank's coordinate. The
 * request's samples are already this rank's share of the batch axes (dp); on a
 * sequence axis (SPLITS_SEQUENCE, size n, coordinate r) an adapter that
 * declared smp_graph_extension.split_sequence returns coordinate r's share of
 * each sample's sequence: the tokens at the load-balanced positions, chunks r
 * and 2n - 1 - r of 2n equal chunks (the SDK's sequence_share). */
typedef struct smp_batch_axes_extension {
  smp_extension_base base;
  const smp_axis_coord* axes; /* borrowed for the call */
  size_t n_axes;
} smp_batch_axes_extension;

/* type SMP_EXTENSION_GRAPH, version 1, on the host table: what a graph
 * declares beyond its nodes, during smp_model_adapter.describe(). */
typedef struct smp_graph_extension {
  smp_extension_base base;
  /* The adapter's batch() returns each sample's share of the sequence on a
   * sequence axis (see smp_batch_axes_extension), along dimension `dim` of
   * every input. A job with a sequence axis of size > 1 refuses a graph
   * without it, naming the adapter. */
  smp_error* (*split_sequence)(smp_graph_builder* b, int32_t dim);
} smp_graph_extension;

/* ------------------------------------------------------------------------ */
/* The plugin descriptor                                                     */
/* ------------------------------------------------------------------------ */

typedef struct smp_plugin_descriptor {
  size_t struct_size;
  const char* name;
  const char* plugin_version;
  uint32_t abi_major;     /* SMP_ABI_VERSION_MAJOR the plugin was built with */
  uint32_t abi_minor;
  const char* torch_version; /* LibTorch version it was built against, "" if it doesn't use it */
  const smp_module_kind* const* module_kinds;
  size_t n_module_kinds;
  const smp_model_adapter* const* adapters;
  size_t n_adapters;
  const smp_partition_strategy* const* partitioners;
  size_t n_partitioners;
  const smp_rule* const* rules;
  size_t n_rules;
  const smp_extension_base* extension_start; /* NULL, or the plugin's extensions */
} smp_plugin_descriptor;

/* ------------------------------------------------------------------------ */
/* The host API table                                                        */
/* ------------------------------------------------------------------------ */

/* How the graph's loss is normalised. The core averages over microbatches and
 * data-parallel ranks once, in one place, from this. */
typedef enum smp_loss_reduction {
  SMP_LOSS_MEAN = 0, /* the loss value is a mean over the microbatch's samples */
  SMP_LOSS_SUM = 1   /* the loss value is a sum; a count value (same node) says over
                        how many items (tokens not masked, say): the step's loss is
                        the sum over every microbatch and rank / the summed counts */
} smp_loss_reduction;

typedef struct smp_host_api {
  size_t struct_size;
  uint32_t abi_major;
  uint32_t abi_minor;
  const char* torch_version;
  const smp_extension_base* extension_start; /* NULL, or the host's extensions */

  /* errors */
  smp_error* (*error_create)(smp_error_code code, const char* message); /* new error */
  smp_error_code (*error_code)(const smp_error* error);
  const char* (*error_message)(const smp_error* error); /* borrowed from error */
  void (*error_destroy)(smp_error* error);

  /* logging, tagged with the plugin name and the rank */
  void (*log)(smp_log_level level, const char* plugin, const char* message);

  /* tensors: framework-neutral view */
  void (*tensor_retain)(smp_tensor* t);
  void (*tensor_release)(smp_tensor* t);
  smp_dtype (*tensor_dtype)(const smp_tensor* t);
  int64_t (*tensor_ndim)(const smp_tensor* t);
  const int64_t* (*tensor_sizes)(const smp_tensor* t);   /* borrowed from t */
  const int64_t* (*tensor_strides)(const smp_tensor* t); /* in elements; borrowed from t */
  void (*tensor_device)(const smp_tensor* t, smp_device_type* type, int32_t* index);
  void* (*tensor_data)(const smp_tensor* t);
  /* zero-copy; *out is a new DLManagedTensor owned by the caller (call its deleter) */
  smp_error* (*tensor_to_dlpack)(smp_tensor* t, struct DLManagedTensor** out);
  /* zero-copy; takes ownership of dl; *out is a new reference */
  smp_error* (*tensor_from_dlpack)(struct DLManagedTensor* dl, smp_tensor** out);

  /* tensors: LibTorch bridge. Valid only because the host refuses plugins built
   * against another LibTorch version. `aten` points to an at::Tensor. */
  smp_tensor* (*tensor_from_aten)(const void* aten); /* new reference sharing storage and autograd */
  const void* (*tensor_aten)(const smp_tensor* t);   /* borrowed from t */

  /* collectives on one mesh axis' communicator; in-place where there is one tensor */
  int32_t (*comm_rank)(const smp_comm* comm);
  int32_t (*comm_size)(const smp_comm* comm);
  smp_error* (*comm_allreduce)(smp_comm* comm, smp_tensor* inout, smp_reduce_op op);
  /* out = concatenation of every rank's in along dim 0 */
  smp_error* (*comm_allgather)(smp_comm* comm, smp_tensor* in, smp_tensor* out);
  /* out = this rank's dim-0 slice of the reduction of every rank's in */
  smp_error* (*comm_reduce_scatter)(smp_comm* comm, smp_tensor* in, smp_tensor* out,
                                    smp_reduce_op op);
  /* dim-0 splits; NULL splits = equal */
  smp_error* (*comm_alltoall)(smp_comm* comm, smp_tensor* in, smp_tensor* out,
                              const int64_t* in_splits, const int64_t* out_splits);
  smp_error* (*comm_broadcast)(smp_comm* comm, smp_tensor* inout, int32_t root);

  /* asynchronous forms: *event (owned by the caller) completes the operation;
   * the tensors must not be touched until it has been waited */
  smp_error* (*comm_allreduce_async)(smp_comm* comm, smp_tensor* inout, smp_reduce_op op, smp_event** event);
  smp_error* (*comm_allgather_async)(smp_comm* comm, smp_tensor* in, smp_tensor* out, smp_event** event);
  smp_error* (*comm_reduce_scatter_async)(smp_comm* comm, smp_tensor* in, smp_tensor* out, smp_reduce_op op,
                                          smp_event** event);
  smp_error* (*comm_alltoall_async)(smp_comm* comm, smp_tensor* in, smp_tensor* out, const int64_t* in_splits,
                                    const int64_t* out_splits, smp_event** event);
  /* Completion (the rules for every event):
   *  - event_wait on CPU tensors (Gloo, shared memory) returns once the result
   *    is in place: it blocks the calling thread.
   *  - event_wait on CUDA tensors over NCCL is stream-ordered: it returns at
   *    once, and work queued afterwards on the calling thread's current CUDA
   *    stream sees the result; synchronize that stream to read it on the host.
   *  - event_ready never blocks: 1 once the operation has finished (on the
   *    device for NCCL), so that a wait would neither block nor order anything.
   *  - event_wait returns the operation's error, and the same error (a new
   *    smp_error with its code and message) on every later wait.
   * Threads: call the communication functions, and wait on an event, from the
   * thread that called into the plugin (the rank's training thread); every
   * member of a communicator issues its collectives in the same order. */
  int32_t (*event_ready)(smp_event* event);
  smp_error* (*event_wait)(smp_event* event);
  void (*event_destroy)(smp_event* event);      /* waits first if it was never waited */

  /* the mesh: this rank's position and size on a named axis ("pp", "dp", "tp",
   * "ep", "edp", "mp", "world", or one the job declared: SMP_EXTENSION_MESH
   * lists them); an unknown axis is an error naming the mesh's axes */
  smp_error* (*mesh_axis)(const smp_mesh* mesh, const char* axis, int32_t* rank, int32_t* size);
  /* the axis' communicator (since 2.4 every axis' is made before any module,
   * so ranks may ask in any order; borrowed for the mesh's lifetime).
   * A NULL mesh gives *comm = NULL: comm_rank/comm_size report it as rank 0
   * of 1, and a plugin skips collectives on a group of one (the SDK does). */
  smp_error* (*mesh_comm)(smp_mesh* mesh, const char* axis, smp_comm** comm);

  /* graph building, during smp_model_adapter.describe() */
  smp_error* (*graph_add_input)(smp_graph_builder* b, const char* value_name);
  smp_error* (*graph_add_node)(smp_graph_builder* b, const smp_graph_node* node);
  /* the loss: a per-sample mean (SMP_LOSS_MEAN)... */
  smp_error* (*graph_set_loss)(smp_graph_builder* b, const char* value_name);
  /* model FLOPs of one training sample (forward + backward), for MFU */
  smp_error* (*graph_set_flops_per_sample)(smp_graph_builder* b, double flops);
  /* ...or a sum over `count_value`'s items (SMP_LOSS_SUM): count_value a
   * scalar output of a node (since 2.2 any node, not only the loss's: the
   * core carries it to the last stage) */
  smp_error* (*graph_set_loss_sum)(smp_graph_builder* b, const char* sum_value, const char* count_value);
  /* what throughput is counted in ("tokens", "samples", "interactions") and
   * how many of them one sample holds; default "samples", 1 */
  smp_error* (*graph_set_throughput_unit)(smp_graph_builder* b, const char* unit, double per_sample);
  /* Since 2.2: a validation metric, reported as sum / count over the
   * validation batches of every rank (e.g. "hr@10": hits and users). Both
   * values are scalars, outputs of one node; the core sums them over the
   * microbatches and ranks that compute them (once per tp group). */
  smp_error* (*graph_add_metric)(smp_graph_builder* b, const char* name, const char* sum_value,
                                 const char* count_value);
} smp_host_api;

/* The one symbol a plugin exports. Returns NULL after writing *error when it
 * refuses the host (for instance a host minor older than it needs, or a host
 * without an extension it requires). Given a host of another major it returns
 * its descriptor without touching the host table: the host refuses it by name. */
typedef const smp_plugin_descriptor* (*smp_plugin_entry_fn)(const smp_host_api* host,
                                                             smp_error** error);

/* ------------------------------------------------------------------------ */
/* struct_size constants: the size of each struct as this header knows it    */
/* ------------------------------------------------------------------------ */

#define SMP_EXTENSION_BASE_STRUCT_SIZE SMP_STRUCT_SIZE(smp_extension_base, next)
#define SMP_MODULE_CONTEXT_STRUCT_SIZE SMP_STRUCT_SIZE(smp_module_context, extension_start)
#define SMP_MODULE_CONTEXT_STRUCT_SIZE_2_0 SMP_STRUCT_SIZE(smp_module_context, parallel_json) /* the fields of minor 0 */
#define SMP_FORWARD_ARGS_STRUCT_SIZE SMP_STRUCT_SIZE(smp_forward_args, extension_start)
#define SMP_FORWARD_ARGS_STRUCT_SIZE_2_6 SMP_STRUCT_SIZE(smp_forward_args, rng_seed) /* the fields before 2.7 */
#define SMP_PLACEMENT_STRUCT_SIZE SMP_STRUCT_SIZE(smp_placement, dim)
#define SMP_PARAM_INFO_STRUCT_SIZE SMP_STRUCT_SIZE(smp_param_info, flags)
#define SMP_PARAM_INFO_STRUCT_SIZE_2_0 SMP_STRUCT_SIZE(smp_param_info, n_placements) /* the fields of minor 0 */
#define SMP_PARAM_INIT_STRUCT_SIZE SMP_STRUCT_SIZE(smp_param_init, slice_length)
#define SMP_MODULE_KIND_STRUCT_SIZE SMP_STRUCT_SIZE(smp_module_kind, memory_features)
#define SMP_MODULE_KIND_STRUCT_SIZE_2_0 SMP_STRUCT_SIZE(smp_module_kind, destroy) /* the fields of minor 0 */
#define SMP_GRAPH_NODE_STRUCT_SIZE SMP_STRUCT_SIZE(smp_graph_node, attention_core_bytes_hint)
#define SMP_GRAPH_NODE_STRUCT_SIZE_2_0 SMP_STRUCT_SIZE(smp_graph_node, activation_bytes_hint) /* the fields of minor 0 */
#define SMP_ADAPTER_CONTEXT_STRUCT_SIZE SMP_STRUCT_SIZE(smp_adapter_context, parallel_json)
#define SMP_ADAPTER_CONTEXT_STRUCT_SIZE_2_0 SMP_STRUCT_SIZE(smp_adapter_context, seed) /* the fields of minor 0 */
#define SMP_BATCH_REQUEST_STRUCT_SIZE SMP_STRUCT_SIZE(smp_batch_request, extension_start)
#define SMP_BATCH_REQUEST_STRUCT_SIZE_2_7 SMP_STRUCT_SIZE(smp_batch_request, num_samples) /* the fields before 2.8 */
#define SMP_MODEL_ADAPTER_STRUCT_SIZE SMP_STRUCT_SIZE(smp_model_adapter, destroy)
#define SMP_COST_NODE_STRUCT_SIZE SMP_STRUCT_SIZE(smp_cost_node, shared_key)
#define SMP_COST_GRAPH_STRUCT_SIZE SMP_STRUCT_SIZE(smp_cost_graph, n_edges)
#define SMP_PARTITION_REQUEST_STRUCT_SIZE SMP_STRUCT_SIZE(smp_partition_request, stage_of_node)
#define SMP_PARTITION_STRATEGY_STRUCT_SIZE SMP_STRUCT_SIZE(smp_partition_strategy, partition)
#define SMP_RULE_STRUCT_SIZE SMP_STRUCT_SIZE(smp_rule, activation_split)
#define SMP_RULE_STRUCT_SIZE_2_0 SMP_STRUCT_SIZE(smp_rule, check) /* the fields of minor 0 */
#define SMP_PLUGIN_DESCRIPTOR_STRUCT_SIZE SMP_STRUCT_SIZE(smp_plugin_descriptor, extension_start)
#define SMP_HOST_API_STRUCT_SIZE SMP_STRUCT_SIZE(smp_host_api, graph_add_metric)
#define SMP_HOST_API_STRUCT_SIZE_2_0 SMP_STRUCT_SIZE(smp_host_api, graph_set_throughput_unit) /* the functions of minor 0 */
#define SMP_OPTIMIZER_CREATE_ARGS_STRUCT_SIZE SMP_STRUCT_SIZE(smp_optimizer_create_args, weight_decay_rate)
#define SMP_OPTIMIZER_STEP_ARGS_STRUCT_SIZE SMP_STRUCT_SIZE(smp_optimizer_step_args, step)
#define SMP_OPTIMIZER_KIND_STRUCT_SIZE SMP_STRUCT_SIZE(smp_optimizer_kind, destroy)
#define SMP_OPTIMIZERS_EXTENSION_STRUCT_SIZE SMP_STRUCT_SIZE(smp_optimizers_extension, n_kinds)
#define SMP_MESH_EXTENSION_STRUCT_SIZE SMP_STRUCT_SIZE(smp_mesh_extension, axis_at)
#define SMP_P2P_ARGS_STRUCT_SIZE SMP_STRUCT_SIZE(smp_p2p_args, event)
#define SMP_BROADCAST_ARGS_STRUCT_SIZE SMP_STRUCT_SIZE(smp_broadcast_args, event)
#define SMP_EVENT_WAIT_ARGS_STRUCT_SIZE SMP_STRUCT_SIZE(smp_event_wait_args, mode)
#define SMP_EVENT_CALLBACK_ARGS_STRUCT_SIZE SMP_STRUCT_SIZE(smp_event_callback_args, user)
#define SMP_COMM_EXTENSION_STRUCT_SIZE SMP_STRUCT_SIZE(smp_comm_extension, event_on_ready)
#define SMP_CONFIG_TABLE_STRUCT_SIZE SMP_STRUCT_SIZE(smp_config_table, check)
#define SMP_CONFIG_EXTENSION_STRUCT_SIZE SMP_STRUCT_SIZE(smp_config_extension, n_tables)
#define SMP_JOB_TABLES_EXTENSION_STRUCT_SIZE SMP_STRUCT_SIZE(smp_job_tables_extension, tables_json)
#define SMP_KIND_MEMORY_STRUCT_SIZE SMP_STRUCT_SIZE(smp_kind_memory, features)
#define SMP_RULE_MEMORY_STRUCT_SIZE SMP_STRUCT_SIZE(smp_rule_memory, activation_split)
#define SMP_MEMORY_EXTENSION_STRUCT_SIZE SMP_STRUCT_SIZE(smp_memory_extension, n_rules)
#define SMP_KIND_INFERENCE_STRUCT_SIZE SMP_STRUCT_SIZE(smp_kind_inference, shard_dim)
#define SMP_INFERENCE_EXTENSION_STRUCT_SIZE SMP_STRUCT_SIZE(smp_inference_extension, n_kinds)
#define SMP_DECODE_EXTENSION_STRUCT_SIZE SMP_STRUCT_SIZE(smp_decode_extension, capacity)
#define SMP_AXIS_COORD_STRUCT_SIZE SMP_STRUCT_SIZE(smp_axis_coord, size)
#define SMP_BATCH_AXES_EXTENSION_STRUCT_SIZE SMP_STRUCT_SIZE(smp_batch_axes_extension, n_axes)
#define SMP_GRAPH_EXTENSION_STRUCT_SIZE SMP_STRUCT_SIZE(smp_graph_extension, split_sequence)

/* The descriptor prefix every major keeps: enough to name a plugin and its ABI. */
#define SMP_PLUGIN_DESCRIPTOR_VERSION_PREFIX SMP_STRUCT_SIZE(smp_plugin_descriptor, abi_minor)

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* SMP_ABI_H */
