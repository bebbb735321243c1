/*
 * smp plugin ABI — the only contract between libsmp_core and plugins.
 *
 * Pure C (C11 and C++). No C++ or LibTorch types cross this boundary.
 *
 * Versioning (after PJRT / Triton backends):
 *   - SMP_ABI_VERSION_MAJOR changes on any incompatible change (a field removed,
 *     reordered or retyped). The host refuses a plugin with another major.
 *   - SMP_ABI_VERSION_MINOR changes when fields are appended to a struct or
 *     functions appended to a table. The host refuses a plugin built for a newer
 *     minor than its own; a plugin may refuse a host older than it needs.
 *   - Every struct that crosses the boundary starts with `size_t struct_size`,
 *     filled with SMP_STRUCT_SIZE(type, last_field) by whoever fills the struct,
 *     so the reader knows which fields the writer knew about.
 *
 * Errors: functions return `smp_error*`, NULL meaning success. Errors are made
 * by the host (host->error_create) so that one allocator owns them; whoever
 * receives an error owns it and frees it with host->error_destroy.
 * No C++ exception may cross this boundary in either direction.
 *
 * Lifetimes: every pointer argument is borrowed for the duration of the call
 * unless its comment says otherwise. "new reference" = caller must release.
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

#define SMP_ABI_VERSION_MAJOR 1
#define SMP_ABI_VERSION_MINOR 0

#define SMP_STRUCT_SIZE(type, last_field) \
  (offsetof(type, last_field) + sizeof(((type*)0)->last_field))

#define SMP_PLUGIN_ENTRY_SYMBOL "smp_plugin_entry"

/* ------------------------------------------------------------------------ */
/* Opaque handles                                                            */
/* ------------------------------------------------------------------------ */

typedef struct smp_error smp_error;                 /* host-owned error object */
typedef struct smp_tensor smp_tensor;               /* reference-counted tensor */
typedef struct smp_comm smp_comm;                   /* one mesh axis' communicator; borrowed */
typedef struct smp_graph_builder smp_graph_builder; /* host-owned, valid during describe() */
typedef struct smp_module smp_module;               /* plugin-owned module instance */
typedef struct smp_adapter smp_adapter;             /* plugin-owned model adapter instance */

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
  int32_t tp_rank;        /* position on the tensor-parallel axis */
  int32_t tp_size;
  smp_comm* tp_comm;      /* borrowed for the module's lifetime */
  int32_t sequence_parallel; /* 1: activations between layers are split along the sequence */
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
} smp_forward_args;

typedef struct smp_param_info {
  size_t struct_size;
  const char* name;     /* local name, e.g. "weight"; borrowed for the call */
  smp_tensor* tensor;   /* borrowed; a leaf with requires_grad */
  int32_t shard_dim;    /* dimension split across tp ranks, -1 when replicated */
  int32_t tp_grad_sum;  /* 1: replicated across tp but its gradient differs per rank
                           (sequence-parallel norms) and must be summed over tp */
} smp_param_info;

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
} smp_module_kind;

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
} smp_graph_node;

typedef struct smp_adapter_context {
  size_t struct_size;
  uint64_t seed;
  int32_t seq_parallel_capable; /* reserved */
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
/* Tensor-parallel rules                                                     */
/* ------------------------------------------------------------------------ */

typedef struct smp_tp_rule {
  size_t struct_size;
  const char* kind;       /* the serial kind this rule applies to */
  const char* dist_kind;  /* the kind that replaces it when tp > 1 */
  void* state;
  /* NULL, or returns an error naming the sizes when config can't be split tp_size ways. */
  smp_error* (*check)(void* state, const char* config_json, int32_t tp_size);
} smp_tp_rule;

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
  const smp_tp_rule* const* tp_rules;
  size_t n_tp_rules;
} smp_plugin_descriptor;

/* ------------------------------------------------------------------------ */
/* The host API table                                                        */
/* ------------------------------------------------------------------------ */

typedef struct smp_host_api {
  size_t struct_size;
  uint32_t abi_major;
  uint32_t abi_minor;
  const char* torch_version;

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

  /* graph building, during smp_model_adapter.describe() */
  smp_error* (*graph_add_input)(smp_graph_builder* b, const char* value_name);
  smp_error* (*graph_add_node)(smp_graph_builder* b, const smp_graph_node* node);
  smp_error* (*graph_set_loss)(smp_graph_builder* b, const char* value_name);
  /* model FLOPs of one training sample (forward + backward), for MFU */
  smp_error* (*graph_set_flops_per_sample)(smp_graph_builder* b, double flops);
} smp_host_api;

/* The one symbol a plugin exports. Returns NULL after writing *error when it
 * refuses the host (for instance a host minor older than it needs). */
typedef const smp_plugin_descriptor* (*smp_plugin_entry_fn)(const smp_host_api* host,
                                                             smp_error** error);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* SMP_ABI_H */
