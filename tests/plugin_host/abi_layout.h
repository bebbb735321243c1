/* The layout of every ABI struct as one TU's compiler sees it. abi_c11.c
 * computes it as C11, abi_cxx.cpp as C++; abi_header_test.cpp compares. */
#ifndef SMP_TEST_ABI_LAYOUT_H
#define SMP_TEST_ABI_LAYOUT_H

#include <smp/abi.h>

#ifdef __cplusplus
extern "C" {
#endif

/* X(type, its SMP_*_STRUCT_SIZE constant) for every struct that crosses the boundary. */
#define SMP_ABI_STRUCTS(X)                                              \
  X(smp_extension_base, SMP_EXTENSION_BASE_STRUCT_SIZE)                 \
  X(smp_module_context, SMP_MODULE_CONTEXT_STRUCT_SIZE)                 \
  X(smp_forward_args, SMP_FORWARD_ARGS_STRUCT_SIZE)                     \
  X(smp_placement, SMP_PLACEMENT_STRUCT_SIZE)                           \
  X(smp_param_init, SMP_PARAM_INIT_STRUCT_SIZE)                         \
  X(smp_param_info, SMP_PARAM_INFO_STRUCT_SIZE)                         \
  X(smp_module_kind, SMP_MODULE_KIND_STRUCT_SIZE)                       \
  X(smp_graph_node, SMP_GRAPH_NODE_STRUCT_SIZE)                         \
  X(smp_adapter_context, SMP_ADAPTER_CONTEXT_STRUCT_SIZE)               \
  X(smp_batch_request, SMP_BATCH_REQUEST_STRUCT_SIZE)                   \
  X(smp_model_adapter, SMP_MODEL_ADAPTER_STRUCT_SIZE)                   \
  X(smp_cost_node, SMP_COST_NODE_STRUCT_SIZE)                           \
  X(smp_cost_graph, SMP_COST_GRAPH_STRUCT_SIZE)                         \
  X(smp_partition_request, SMP_PARTITION_REQUEST_STRUCT_SIZE)           \
  X(smp_partition_strategy, SMP_PARTITION_STRATEGY_STRUCT_SIZE)         \
  X(smp_rule, SMP_RULE_STRUCT_SIZE)                                     \
  X(smp_plugin_descriptor, SMP_PLUGIN_DESCRIPTOR_STRUCT_SIZE)           \
  X(smp_host_api, SMP_HOST_API_STRUCT_SIZE)                             \
  X(smp_optimizer_create_args, SMP_OPTIMIZER_CREATE_ARGS_STRUCT_SIZE)   \
  X(smp_optimizer_step_args, SMP_OPTIMIZER_STEP_ARGS_STRUCT_SIZE)       \
  X(smp_optimizer_kind, SMP_OPTIMIZER_KIND_STRUCT_SIZE)                 \
  X(smp_optimizers_extension, SMP_OPTIMIZERS_EXTENSION_STRUCT_SIZE)   \
  X(smp_mesh_extension, SMP_MESH_EXTENSION_STRUCT_SIZE)                 \
  X(smp_p2p_args, SMP_P2P_ARGS_STRUCT_SIZE)                             \
  X(smp_broadcast_args, SMP_BROADCAST_ARGS_STRUCT_SIZE)                 \
  X(smp_event_wait_args, SMP_EVENT_WAIT_ARGS_STRUCT_SIZE)               \
  X(smp_event_callback_args, SMP_EVENT_CALLBACK_ARGS_STRUCT_SIZE)       \
  X(smp_comm_extension, SMP_COMM_EXTENSION_STRUCT_SIZE)                 \
  X(smp_config_table, SMP_CONFIG_TABLE_STRUCT_SIZE)                     \
  X(smp_config_extension, SMP_CONFIG_EXTENSION_STRUCT_SIZE)             \
  X(smp_job_tables_extension, SMP_JOB_TABLES_EXTENSION_STRUCT_SIZE)     \
  X(smp_kind_memory, SMP_KIND_MEMORY_STRUCT_SIZE)                       \
  X(smp_rule_memory, SMP_RULE_MEMORY_STRUCT_SIZE)                       \
  X(smp_memory_extension, SMP_MEMORY_EXTENSION_STRUCT_SIZE)             \
  X(smp_kind_inference, SMP_KIND_INFERENCE_STRUCT_SIZE)                 \
  X(smp_inference_extension, SMP_INFERENCE_EXTENSION_STRUCT_SIZE)       \
  X(smp_decode_extension, SMP_DECODE_EXTENSION_STRUCT_SIZE)            \
  X(smp_axis_coord, SMP_AXIS_COORD_STRUCT_SIZE)                         \
  X(smp_batch_axes_extension, SMP_BATCH_AXES_EXTENSION_STRUCT_SIZE)     \
  X(smp_graph_extension, SMP_GRAPH_EXTENSION_STRUCT_SIZE)

typedef struct smp_layout_entry {
  const char* type;
  size_t size;         /* sizeof(type) */
  size_t align;        /* alignment of type */
  size_t struct_size;  /* its SMP_*_STRUCT_SIZE constant */
} smp_layout_entry;

/* Enum sizes, in this order: error_code, dtype, device_type, reduce_op, log_level, split,
 * placement_kind, loss_reduction, extension_type. */
#define SMP_ABI_N_ENUMS 9

extern const smp_layout_entry smp_layout_c[];
extern const size_t smp_layout_c_count;
extern const size_t smp_enum_sizes_c[SMP_ABI_N_ENUMS];
extern const int smp_abi_c_version[2];

extern const smp_layout_entry smp_layout_cxx[];
extern const size_t smp_layout_cxx_count;
extern const size_t smp_enum_sizes_cxx[SMP_ABI_N_ENUMS];

#ifdef __cplusplus
}
#endif

#endif
