/* The layout of every ABI struct as one TU's compiler sees it. abi_c11.c
 * computes it as C11, abi_cxx.cpp as C++; abi_header_test.cpp compares. */
#ifndef SMP_TEST_ABI_LAYOUT_H
#define SMP_TEST_ABI_LAYOUT_H

#include <smp/abi.h>

#ifdef __cplusplus
extern "C" {
#endif

/* X(type, last_field) for every struct that crosses the boundary. */
#define SMP_ABI_STRUCTS(X)                          \
  X(smp_module_context, sequence_parallel)          \
  X(smp_forward_args, rng_seed)                     \
  X(smp_param_info, tp_grad_sum)                    \
  X(smp_module_kind, destroy)                       \
  X(smp_graph_node, activation_bytes_hint)          \
  X(smp_adapter_context, seq_parallel_capable)      \
  X(smp_batch_request, num_samples)                 \
  X(smp_model_adapter, destroy)                     \
  X(smp_cost_node, shared_key)                      \
  X(smp_cost_graph, n_edges)                        \
  X(smp_partition_request, stage_of_node)           \
  X(smp_partition_strategy, partition)              \
  X(smp_tp_rule, check)                             \
  X(smp_plugin_descriptor, n_tp_rules)              \
  X(smp_host_api, graph_set_flops_per_sample)

typedef struct smp_layout_entry {
  const char* type;
  size_t size;         /* sizeof(type) */
  size_t align;        /* alignment of type */
  size_t struct_size;  /* SMP_STRUCT_SIZE(type, last_field) */
} smp_layout_entry;

/* Enum sizes, in this order: error_code, dtype, device_type, reduce_op, log_level, split. */
#define SMP_ABI_N_ENUMS 6

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
