// The field offsets of every struct that crosses the plugin boundary, frozen
// per ABI minor, for x86-64 Linux (LP64). Within a major, abi.h only appends
// fields (abi/include/smp/ABI_CHANGELOG.md), so no number below may ever
// change: a minor that appends a field adds its row. Beside each row: the ABI
// 2.x minor that added the field. The table was generated once from abi.h and
// checked against the header of every commit that changed it since 2.0
// (git log -- abi/include/smp/abi.h): a field's minor is that of the first
// header that has it, and no field of an older header sits elsewhere now.
//
// Checked here: every offset; each SMP_*_STRUCT_SIZE constant, the current ones
// and the per-minor ones (SMP_*_STRUCT_SIZE_2_0, ...), ends exactly after the
// last field of its minor by this table; every per-minor constant abi.h
// defines is among them; and the rows of a struct cover all of it (no field
// between two rows or after the last), so a field appended without its row
// fails too.
#include "abi_layout.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

// The data model the numbers hold for. (Elsewhere the offsets are still
// compiled, the comparisons skipped.)
#if defined(__x86_64__) && defined(__LP64__) && defined(__linux__)
static_assert(sizeof(void*) == 8 && sizeof(size_t) == 8 && sizeof(long) == 8, "x86-64 Linux is LP64");
constexpr bool kFrozenDataModel = true;
#else
constexpr bool kFrozenDataModel = false;
#endif

#define SKIP_UNLESS_FROZEN_DATA_MODEL() \
  if (!kFrozenDataModel) GTEST_SKIP() << "the frozen offsets are x86-64 Linux LP64's"

struct Row {
  const char* type;
  const char* field;
  size_t frozen;  // its offset on x86-64 Linux LP64
  int minor;      // the ABI 2.x minor that added it
  size_t actual;  // offsetof as compiled now
  size_t size;    // sizeof the field
  size_t align;   // alignof the field
};

// The field name is compiled: a field renamed or removed fails the build.
#define ROW(type, field, offset, minor)                                                      \
  Row{#type, #field, offset, minor, offsetof(type, field), sizeof(static_cast<type*>(nullptr)->field), \
      alignof(decltype(static_cast<type*>(nullptr)->field))}

// In declaration order. Never change a number; append rows for appended fields.
const std::vector<Row>& frozen_table() {
  static const std::vector<Row> rows = {
      ROW(smp_extension_base, struct_size, 0, 0),
      ROW(smp_extension_base, type, 8, 0),
      ROW(smp_extension_base, version, 12, 0),
      ROW(smp_extension_base, next, 16, 0),

      ROW(smp_module_context, struct_size, 0, 0),
      ROW(smp_module_context, node_name, 8, 0),
      ROW(smp_module_context, init_seed, 16, 0),
      ROW(smp_module_context, device_type, 24, 0),
      ROW(smp_module_context, device_index, 28, 0),
      ROW(smp_module_context, mesh, 32, 0),
      ROW(smp_module_context, parallel_json, 40, 0),
      ROW(smp_module_context, memory_json, 48, 1),  // 2.1, c30fd4d
      ROW(smp_module_context, extension_start, 56, 5),  // 2.5

      ROW(smp_forward_args, struct_size, 0, 0),
      ROW(smp_forward_args, method, 8, 0),
      ROW(smp_forward_args, inputs, 16, 0),
      ROW(smp_forward_args, n_inputs, 24, 0),
      ROW(smp_forward_args, outputs, 32, 0),
      ROW(smp_forward_args, n_outputs, 40, 0),
      ROW(smp_forward_args, training, 48, 0),
      ROW(smp_forward_args, rng_seed, 56, 0),
      ROW(smp_forward_args, extension_start, 64, 7),

      ROW(smp_placement, struct_size, 0, 0),
      ROW(smp_placement, axis, 8, 0),
      ROW(smp_placement, kind, 16, 0),
      ROW(smp_placement, dim, 20, 0),

      ROW(smp_param_init, struct_size, 0, 2),  // 2.2, dbb91b6
      ROW(smp_param_init, kind, 8, 2),  // 2.2, dbb91b6
      ROW(smp_param_init, key, 16, 2),  // 2.2, dbb91b6
      ROW(smp_param_init, value, 24, 2),  // 2.2, dbb91b6
      ROW(smp_param_init, full_shape, 32, 2),  // 2.2, dbb91b6
      ROW(smp_param_init, full_ndim, 40, 2),  // 2.2, dbb91b6
      ROW(smp_param_init, slice_dim, 48, 2),  // 2.2, dbb91b6
      ROW(smp_param_init, slice_begin, 56, 2),  // 2.2, dbb91b6
      ROW(smp_param_init, slice_length, 64, 2),  // 2.2, dbb91b6

      ROW(smp_param_info, struct_size, 0, 0),
      ROW(smp_param_info, name, 8, 0),
      ROW(smp_param_info, tensor, 16, 0),
      ROW(smp_param_info, placements, 24, 0),
      ROW(smp_param_info, n_placements, 32, 0),
      ROW(smp_param_info, init, 40, 2),  // 2.2, dbb91b6
      ROW(smp_param_info, flags, 48, 6),  // 2.6

      ROW(smp_module_kind, struct_size, 0, 0),
      ROW(smp_module_kind, name, 8, 0),
      ROW(smp_module_kind, state, 16, 0),
      ROW(smp_module_kind, create, 24, 0),
      ROW(smp_module_kind, forward, 32, 0),
      ROW(smp_module_kind, parameters, 40, 0),
      ROW(smp_module_kind, destroy, 48, 0),
      ROW(smp_module_kind, memory_features, 56, 1),  // 2.1, c30fd4d

      ROW(smp_graph_node, struct_size, 0, 0),
      ROW(smp_graph_node, name, 8, 0),
      ROW(smp_graph_node, kind, 16, 0),
      ROW(smp_graph_node, config_json, 24, 0),
      ROW(smp_graph_node, method, 32, 0),
      ROW(smp_graph_node, inputs, 40, 0),
      ROW(smp_graph_node, n_inputs, 48, 0),
      ROW(smp_graph_node, outputs, 56, 0),
      ROW(smp_graph_node, n_outputs, 64, 0),
      ROW(smp_graph_node, shared_key, 72, 0),
      ROW(smp_graph_node, flops_hint, 80, 0),
      ROW(smp_graph_node, param_bytes_hint, 88, 0),
      ROW(smp_graph_node, activation_bytes_hint, 96, 0),
      ROW(smp_graph_node, activation_fp32_extra_bytes_hint, 104, 2),  // 2.2, c8d2e3f
      ROW(smp_graph_node, attention_core_bytes_hint, 112, 2),  // 2.2, c8d2e3f

      ROW(smp_adapter_context, struct_size, 0, 0),
      ROW(smp_adapter_context, seed, 8, 0),
      ROW(smp_adapter_context, parallel_json, 16, 2),  // 2.2, 0675ede

      ROW(smp_batch_request, struct_size, 0, 0),
      ROW(smp_batch_request, split, 8, 0),
      ROW(smp_batch_request, step, 16, 0),
      ROW(smp_batch_request, global_batch, 24, 0),
      ROW(smp_batch_request, first_sample, 32, 0),
      ROW(smp_batch_request, num_samples, 40, 0),
      ROW(smp_batch_request, extension_start, 48, 8),

      ROW(smp_model_adapter, struct_size, 0, 0),
      ROW(smp_model_adapter, name, 8, 0),
      ROW(smp_model_adapter, state, 16, 0),
      ROW(smp_model_adapter, create, 24, 0),
      ROW(smp_model_adapter, describe, 32, 0),
      ROW(smp_model_adapter, batch, 40, 0),
      ROW(smp_model_adapter, destroy, 48, 0),

      ROW(smp_cost_node, struct_size, 0, 0),
      ROW(smp_cost_node, name, 8, 0),
      ROW(smp_cost_node, compute, 16, 0),
      ROW(smp_cost_node, memory, 24, 0),
      ROW(smp_cost_node, shared_key, 32, 0),

      ROW(smp_cost_graph, struct_size, 0, 0),
      ROW(smp_cost_graph, nodes, 8, 0),
      ROW(smp_cost_graph, n_nodes, 16, 0),
      ROW(smp_cost_graph, edge_src, 24, 0),
      ROW(smp_cost_graph, edge_dst, 32, 0),
      ROW(smp_cost_graph, n_edges, 40, 0),

      ROW(smp_partition_request, struct_size, 0, 0),
      ROW(smp_partition_request, graph, 8, 0),
      ROW(smp_partition_request, num_stages, 16, 0),
      ROW(smp_partition_request, options_json, 24, 0),
      ROW(smp_partition_request, tie_across_stages, 32, 0),
      ROW(smp_partition_request, stage_of_node, 40, 0),

      ROW(smp_partition_strategy, struct_size, 0, 0),
      ROW(smp_partition_strategy, name, 8, 0),
      ROW(smp_partition_strategy, state, 16, 0),
      ROW(smp_partition_strategy, partition, 24, 0),

      ROW(smp_rule, struct_size, 0, 0),
      ROW(smp_rule, axis, 8, 0),
      ROW(smp_rule, kind, 16, 0),
      ROW(smp_rule, dist_kind, 24, 0),
      ROW(smp_rule, state, 32, 0),
      ROW(smp_rule, check, 40, 0),
      ROW(smp_rule, param_split, 48, 1),  // 2.1, 71c2b2a
      ROW(smp_rule, activation_split, 56, 1),  // 2.1, 71c2b2a

      ROW(smp_plugin_descriptor, struct_size, 0, 0),
      ROW(smp_plugin_descriptor, name, 8, 0),
      ROW(smp_plugin_descriptor, plugin_version, 16, 0),
      ROW(smp_plugin_descriptor, abi_major, 24, 0),
      ROW(smp_plugin_descriptor, abi_minor, 28, 0),
      ROW(smp_plugin_descriptor, torch_version, 32, 0),
      ROW(smp_plugin_descriptor, module_kinds, 40, 0),
      ROW(smp_plugin_descriptor, n_module_kinds, 48, 0),
      ROW(smp_plugin_descriptor, adapters, 56, 0),
      ROW(smp_plugin_descriptor, n_adapters, 64, 0),
      ROW(smp_plugin_descriptor, partitioners, 72, 0),
      ROW(smp_plugin_descriptor, n_partitioners, 80, 0),
      ROW(smp_plugin_descriptor, rules, 88, 0),
      ROW(smp_plugin_descriptor, n_rules, 96, 0),
      ROW(smp_plugin_descriptor, extension_start, 104, 0),

      ROW(smp_host_api, struct_size, 0, 0),
      ROW(smp_host_api, abi_major, 8, 0),
      ROW(smp_host_api, abi_minor, 12, 0),
      ROW(smp_host_api, torch_version, 16, 0),
      ROW(smp_host_api, extension_start, 24, 0),
      ROW(smp_host_api, error_create, 32, 0),
      ROW(smp_host_api, error_code, 40, 0),
      ROW(smp_host_api, error_message, 48, 0),
      ROW(smp_host_api, error_destroy, 56, 0),
      ROW(smp_host_api, log, 64, 0),
      ROW(smp_host_api, tensor_retain, 72, 0),
      ROW(smp_host_api, tensor_release, 80, 0),
      ROW(smp_host_api, tensor_dtype, 88, 0),
      ROW(smp_host_api, tensor_ndim, 96, 0),
      ROW(smp_host_api, tensor_sizes, 104, 0),
      ROW(smp_host_api, tensor_strides, 112, 0),
      ROW(smp_host_api, tensor_device, 120, 0),
      ROW(smp_host_api, tensor_data, 128, 0),
      ROW(smp_host_api, tensor_to_dlpack, 136, 0),
      ROW(smp_host_api, tensor_from_dlpack, 144, 0),
      ROW(smp_host_api, tensor_from_aten, 152, 0),
      ROW(smp_host_api, tensor_aten, 160, 0),
      ROW(smp_host_api, comm_rank, 168, 0),
      ROW(smp_host_api, comm_size, 176, 0),
      ROW(smp_host_api, comm_allreduce, 184, 0),
      ROW(smp_host_api, comm_allgather, 192, 0),
      ROW(smp_host_api, comm_reduce_scatter, 200, 0),
      ROW(smp_host_api, comm_alltoall, 208, 0),
      ROW(smp_host_api, comm_broadcast, 216, 0),
      ROW(smp_host_api, comm_allreduce_async, 224, 0),
      ROW(smp_host_api, comm_allgather_async, 232, 0),
      ROW(smp_host_api, comm_reduce_scatter_async, 240, 0),
      ROW(smp_host_api, comm_alltoall_async, 248, 0),
      ROW(smp_host_api, event_ready, 256, 0),
      ROW(smp_host_api, event_wait, 264, 0),
      ROW(smp_host_api, event_destroy, 272, 0),
      ROW(smp_host_api, mesh_axis, 280, 0),
      ROW(smp_host_api, mesh_comm, 288, 0),
      ROW(smp_host_api, graph_add_input, 296, 0),
      ROW(smp_host_api, graph_add_node, 304, 0),
      ROW(smp_host_api, graph_set_loss, 312, 0),
      ROW(smp_host_api, graph_set_flops_per_sample, 320, 0),
      ROW(smp_host_api, graph_set_loss_sum, 328, 0),
      ROW(smp_host_api, graph_set_throughput_unit, 336, 0),
      ROW(smp_host_api, graph_add_metric, 344, 2),  // 2.2, 8f4e48c
      // 2.3: optimizer kinds (the SMP_EXTENSION_OPTIMIZERS extension)
      ROW(smp_optimizer_create_args, struct_size, 0, 3),
      ROW(smp_optimizer_create_args, extension_start, 8, 3),
      ROW(smp_optimizer_create_args, config_json, 16, 3),
      ROW(smp_optimizer_create_args, params, 24, 3),
      ROW(smp_optimizer_create_args, weight_decay, 32, 3),
      ROW(smp_optimizer_create_args, n_params, 40, 3),
      ROW(smp_optimizer_create_args, weight_decay_rate, 48, 3),
      ROW(smp_optimizer_step_args, struct_size, 0, 3),
      ROW(smp_optimizer_step_args, extension_start, 8, 3),
      ROW(smp_optimizer_step_args, grads, 16, 3),
      ROW(smp_optimizer_step_args, n_grads, 24, 3),
      ROW(smp_optimizer_step_args, lr, 32, 3),
      ROW(smp_optimizer_step_args, grad_scale, 40, 3),
      ROW(smp_optimizer_step_args, step, 48, 3),
      ROW(smp_optimizer_kind, struct_size, 0, 3),
      ROW(smp_optimizer_kind, extension_start, 8, 3),
      ROW(smp_optimizer_kind, name, 16, 3),
      ROW(smp_optimizer_kind, state, 24, 3),
      ROW(smp_optimizer_kind, create, 32, 3),
      ROW(smp_optimizer_kind, step, 40, 3),
      ROW(smp_optimizer_kind, state_tensors, 48, 3),
      ROW(smp_optimizer_kind, destroy, 56, 3),
      ROW(smp_optimizers_extension, base, 0, 3),
      ROW(smp_optimizers_extension, kinds, 24, 3),
      ROW(smp_optimizers_extension, n_kinds, 32, 3),
      ROW(smp_mesh_extension, base, 0, 4),
      ROW(smp_mesh_extension, axis_count, 24, 4),
      ROW(smp_mesh_extension, axis_at, 32, 4),
      ROW(smp_p2p_args, struct_size, 0, 4),
      ROW(smp_p2p_args, extension_start, 8, 4),
      ROW(smp_p2p_args, comm, 16, 4),
      ROW(smp_p2p_args, tensor, 24, 4),
      ROW(smp_p2p_args, peer, 32, 4),
      ROW(smp_p2p_args, tag, 36, 4),
      ROW(smp_p2p_args, event, 40, 4),
      ROW(smp_broadcast_args, struct_size, 0, 4),
      ROW(smp_broadcast_args, extension_start, 8, 4),
      ROW(smp_broadcast_args, comm, 16, 4),
      ROW(smp_broadcast_args, inout, 24, 4),
      ROW(smp_broadcast_args, root, 32, 4),
      ROW(smp_broadcast_args, event, 40, 4),
      ROW(smp_event_wait_args, struct_size, 0, 4),
      ROW(smp_event_wait_args, extension_start, 8, 4),
      ROW(smp_event_wait_args, event, 16, 4),
      ROW(smp_event_wait_args, mode, 24, 4),
      ROW(smp_event_callback_args, struct_size, 0, 4),
      ROW(smp_event_callback_args, extension_start, 8, 4),
      ROW(smp_event_callback_args, event, 16, 4),
      ROW(smp_event_callback_args, callback, 24, 4),
      ROW(smp_event_callback_args, user, 32, 4),
      ROW(smp_comm_extension, base, 0, 4),
      ROW(smp_comm_extension, send, 24, 4),
      ROW(smp_comm_extension, recv, 32, 4),
      ROW(smp_comm_extension, broadcast, 40, 4),
      ROW(smp_comm_extension, event_wait, 48, 4),
      ROW(smp_comm_extension, event_on_ready, 56, 4),
      // 2.5: plugins' configuration tables, and the memory contract as an extension
      ROW(smp_config_table, struct_size, 0, 5),
      ROW(smp_config_table, name, 8, 5),
      ROW(smp_config_table, state, 16, 5),
      ROW(smp_config_table, check, 24, 5),
      ROW(smp_config_extension, base, 0, 5),
      ROW(smp_config_extension, tables, 24, 5),
      ROW(smp_config_extension, n_tables, 32, 5),
      ROW(smp_job_tables_extension, base, 0, 5),
      ROW(smp_job_tables_extension, tables_json, 24, 5),
      ROW(smp_kind_memory, struct_size, 0, 5),
      ROW(smp_kind_memory, kind, 8, 5),
      ROW(smp_kind_memory, features, 16, 5),
      ROW(smp_rule_memory, struct_size, 0, 5),
      ROW(smp_rule_memory, axis, 8, 5),
      ROW(smp_rule_memory, kind, 16, 5),
      ROW(smp_rule_memory, param_split, 24, 5),
      ROW(smp_rule_memory, activation_split, 32, 5),
      ROW(smp_memory_extension, base, 0, 5),
      ROW(smp_memory_extension, kinds, 24, 5),
      ROW(smp_memory_extension, n_kinds, 32, 5),
      ROW(smp_memory_extension, rules, 40, 5),
      ROW(smp_memory_extension, n_rules, 48, 5),
      ROW(smp_kind_inference, struct_size, 0, 7),
      ROW(smp_kind_inference, kind, 8, 7),
      ROW(smp_kind_inference, method, 16, 7),
      ROW(smp_kind_inference, flags, 24, 7),
      ROW(smp_kind_inference, sharded_output, 28, 7),
      ROW(smp_kind_inference, shard_axis, 32, 7),
      ROW(smp_kind_inference, shard_dim, 40, 7),
      ROW(smp_inference_extension, base, 0, 7),
      ROW(smp_inference_extension, kinds, 24, 7),
      ROW(smp_inference_extension, n_kinds, 32, 7),
      ROW(smp_decode_extension, base, 0, 7),
      ROW(smp_decode_extension, start, 24, 7),
      ROW(smp_decode_extension, n_samples, 32, 7),
      ROW(smp_decode_extension, capacity, 40, 7),
      ROW(smp_axis_coord, struct_size, 0, 8),
      ROW(smp_axis_coord, axis, 8, 8),
      ROW(smp_axis_coord, flags, 16, 8),
      ROW(smp_axis_coord, index, 20, 8),
      ROW(smp_axis_coord, size, 24, 8),
      ROW(smp_batch_axes_extension, base, 0, 8),
      ROW(smp_batch_axes_extension, axes, 24, 8),
      ROW(smp_batch_axes_extension, n_axes, 32, 8),
      ROW(smp_graph_extension, base, 0, 8),
      ROW(smp_graph_extension, split_sequence, 24, 8),
  };
  return rows;
}

constexpr int kTableMajor = 2;  // a new major starts a new table

const char* const kBreak = "a field moved: an ABI break (fields are only appended; see ABI_CHANGELOG.md)";

// sizeof and alignof of every struct in SMP_ABI_STRUCTS, by name.
struct StructLayout {
  size_t size, align;
};
const std::map<std::string, StructLayout>& structs() {
  static const std::map<std::string, StructLayout> m = {
#define SMP_TEST_STRUCT(type, constant) {#type, {sizeof(type), alignof(type)}},
      SMP_ABI_STRUCTS(SMP_TEST_STRUCT)
#undef SMP_TEST_STRUCT
  };
  return m;
}

std::vector<const Row*> rows_of(const std::string& type) {
  std::vector<const Row*> rows;
  for (const Row& r : frozen_table())
    if (type == r.type) rows.push_back(&r);
  return rows;
}

// A struct-size constant and the minor whose fields it covers.
struct SizeConstant {
  const char* name;
  const char* type;
  size_t value;
  int minor;
};

// Every size constant: the per-minor ones (what a writer of that minor fills;
// for structs a plugin fills, the smallest the host accepts), then the current
// SMP_*_STRUCT_SIZE of every struct (all fields up to this header's minor).
// Add a row here with each new SMP_*_STRUCT_SIZE_2_<minor> constant.
#define SIZE_AT(constant, type, minor) SizeConstant{#constant, #type, constant, minor}
const std::vector<SizeConstant>& size_constants() {
  static const std::vector<SizeConstant> constants = [] {
    std::vector<SizeConstant> c = {
        SIZE_AT(SMP_PARAM_INFO_STRUCT_SIZE_2_0, smp_param_info, 0),
        SIZE_AT(SMP_MODULE_CONTEXT_STRUCT_SIZE_2_0, smp_module_context, 0),
        SIZE_AT(SMP_MODULE_KIND_STRUCT_SIZE_2_0, smp_module_kind, 0),
        SIZE_AT(SMP_GRAPH_NODE_STRUCT_SIZE_2_0, smp_graph_node, 0),
        SIZE_AT(SMP_ADAPTER_CONTEXT_STRUCT_SIZE_2_0, smp_adapter_context, 0),
        SIZE_AT(SMP_RULE_STRUCT_SIZE_2_0, smp_rule, 0),
        SIZE_AT(SMP_HOST_API_STRUCT_SIZE_2_0, smp_host_api, 0),
        SIZE_AT(SMP_FORWARD_ARGS_STRUCT_SIZE_2_6, smp_forward_args, 6),
        SIZE_AT(SMP_BATCH_REQUEST_STRUCT_SIZE_2_7, smp_batch_request, 7),
    };
#define SMP_TEST_CURRENT(type, constant) \
  c.push_back(SizeConstant{#constant, #type, constant, SMP_ABI_VERSION_MINOR});
    SMP_ABI_STRUCTS(SMP_TEST_CURRENT)
#undef SMP_TEST_CURRENT
    return c;
  }();
  return constants;
}

std::string where(const Row& r) { return std::string(r.type) + "." + r.field + " (ABI 2." + std::to_string(r.minor) + ")"; }

TEST(AbiOffsets, NoFieldEverMoves) {
  SKIP_UNLESS_FROZEN_DATA_MODEL();
  ASSERT_EQ(SMP_ABI_VERSION_MAJOR, kTableMajor) << "this table is ABI " << kTableMajor
                                                << "'s: a new major starts a new one";
  ASSERT_GE(frozen_table().size(), 160u);
  for (const Row& r : frozen_table())
    if (r.actual != r.frozen)
      ADD_FAILURE() << where(r) << ": expected offset " << r.frozen << ", actual offset " << r.actual << ": "
                    << kBreak;
}

TEST(AbiOffsets, EachSizeConstantEndsAfterTheLastFieldOfItsMinor) {
  SKIP_UNLESS_FROZEN_DATA_MODEL();
  for (const SizeConstant& c : size_constants()) {
    SCOPED_TRACE(c.name);
    const Row* last = nullptr;  // the last field of minor <= c.minor, by the frozen table
    for (const Row* r : rows_of(c.type))
      if (r->minor <= c.minor && (!last || r->frozen > last->frozen)) last = r;
    ASSERT_NE(last, nullptr) << c.type << " has no row of minor <= " << c.minor;
    const size_t end = last->frozen + last->size;
    EXPECT_EQ(c.value, end) << c.name << " is " << c.value << ", but by the frozen table the fields of " << c.type
                            << " up to ABI 2." << c.minor << " end at " << end << " (after " << last->field
                            << " at offset " << last->frozen << "). Either " << kBreak
                            << ", or a field was appended without its row here";
  }
}

TEST(AbiOffsets, ThePluginDescriptorsVersionPrefixNeverChanges) {
  SKIP_UNLESS_FROZEN_DATA_MODEL();
  // Kept in every major, so that a host can name a plugin of any major.
  EXPECT_EQ(SMP_PLUGIN_DESCRIPTOR_VERSION_PREFIX, 32u)
      << "smp_plugin_descriptor's version prefix ends after abi_minor at 32: " << kBreak;
}

TEST(AbiOffsets, TheTableCoversEveryFieldOfEveryStruct) {
  SKIP_UNLESS_FROZEN_DATA_MODEL();
  std::set<std::string> tabled;
  for (const Row& r : frozen_table()) tabled.insert(r.type);
  for (const auto& [type, layout] : structs()) {
    SCOPED_TRACE(type);
    EXPECT_TRUE(tabled.erase(type)) << type << " (in SMP_ABI_STRUCTS) has no rows";
    const auto rows = rows_of(type);
    if (rows.empty()) continue;
    // Every struct starts with struct_size; an extension with its smp_extension_base, which does.
    const std::string first = rows.front()->field;
    EXPECT_TRUE(first == "struct_size" || first == "base") << type << " starts with " << first;
    EXPECT_EQ(rows.front()->frozen, 0u);
    for (size_t i = 1; i < rows.size(); ++i) {
      const Row& prev = *rows[i - 1];
      const Row& r = *rows[i];
      // The next field starts where the previous one ends, aligned: nothing in between.
      const size_t next = (prev.frozen + prev.size + r.align - 1) / r.align * r.align;
      EXPECT_EQ(r.frozen, next) << where(r) << " should follow " << prev.field << " at " << next
                                << ": a row is missing, or " << kBreak;
      EXPECT_GE(r.minor, prev.minor) << where(r) << " comes after " << where(prev)
                                     << ": fields of a later minor only follow those of earlier ones";
      EXPECT_LE(r.minor, SMP_ABI_VERSION_MINOR) << where(r) << " is newer than the header's minor";
    }
    // Nothing after the last row but padding.
    const size_t end = rows.back()->frozen + rows.back()->size;
    EXPECT_EQ((end + layout.align - 1) / layout.align * layout.align, layout.size)
        << type << " is " << layout.size << " bytes but its last row (" << rows.back()->field << ") ends at " << end
        << ": a field has no row here (fields are appended, each with its row: ROW(" << type
        << ", <field>, <offset>, " << SMP_ABI_VERSION_MINOR << "))";
  }
  EXPECT_TRUE(tabled.empty()) << "rows for a struct not in SMP_ABI_STRUCTS: " << *tabled.begin();
}

TEST(AbiOffsets, EveryPerMinorSizeConstantOfTheHeaderIsChecked) {
  std::ifstream in(std::string(SMP_SOURCE_DIR) + "/abi/include/smp/abi.h");
  ASSERT_TRUE(in) << "cannot read abi.h under " << SMP_SOURCE_DIR;
  std::stringstream text;
  text << in.rdbuf();
  const std::string header = text.str();
  const std::regex define(R"(#define\s+(SMP_\w+_STRUCT_SIZE_(\d+)_(\d+))\b)");
  int found = 0;
  for (auto it = std::sregex_iterator(header.begin(), header.end(), define); it != std::sregex_iterator(); ++it) {
    ++found;
    const std::string name = (*it)[1];
    const int major = std::stoi((*it)[2]), minor = std::stoi((*it)[3]);
    const auto& all = size_constants();
    auto c = std::find_if(all.begin(), all.end(), [&](const SizeConstant& s) { return name == s.name; });
    if (c == all.end()) {
      ADD_FAILURE() << "abi.h defines " << name << ", which this test does not check: add SIZE_AT(" << name
                    << ", <type>, " << minor << ") to size_constants()";
      continue;
    }
    EXPECT_EQ(major, SMP_ABI_VERSION_MAJOR) << name;
    EXPECT_EQ(minor, c->minor) << name << " is checked as minor " << c->minor;
  }
  EXPECT_GE(found, 5) << "abi.h had 5 per-minor size constants at ABI 2.2; none is ever removed within a major";
}

}  // namespace
