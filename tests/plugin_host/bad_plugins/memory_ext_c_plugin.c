/* A C plugin of ABI 2.5 that says its memory contract twice: the 2.1 field of
 * its kind claims attention-core recompute, its SMP_EXTENSION_MEMORY says
 * deferred init (and a rule that splits half the activations). A host of 2.5
 * must believe the extension. It also owns a configuration table, [mem_c],
 * whose check refuses any key but "ok". */
#include "test_c_plugin.h"

#include <string.h>

static const smp_module_kind kind = {SMP_MODULE_KIND_STRUCT_SIZE, "mem_c_kind", NULL, test_create, test_forward,
                                     test_parameters, test_destroy, SMP_MEMORY_FEATURE_RECOMPUTE_ATTENTION_CORE};
static const smp_module_kind* const kinds[] = {&kind};

static const smp_rule rule = {SMP_RULE_STRUCT_SIZE, "tp", "mem_c_serial", "mem_c_kind", NULL, NULL, 0.25, 0.25};
static const smp_rule* const rules[] = {&rule};

static const smp_kind_memory kind_memory = {SMP_KIND_MEMORY_STRUCT_SIZE, "mem_c_kind", SMP_MEMORY_FEATURE_DEFERRED_INIT};
static const smp_kind_memory* const kind_memories[] = {&kind_memory};
static const smp_rule_memory rule_memory = {SMP_RULE_MEMORY_STRUCT_SIZE, "tp", "mem_c_serial", 1.0, 0.5};
static const smp_rule_memory* const rule_memories[] = {&rule_memory};
static const smp_memory_extension memory = {
    {SMP_MEMORY_EXTENSION_STRUCT_SIZE, SMP_EXTENSION_MEMORY, 1, NULL}, kind_memories, 1, rule_memories, 1};

static smp_error* check_table(void* state, const char* table_json) {
  (void)state;
  if (strcmp(table_json, "{}") == 0 || strcmp(table_json, "{\"ok\":true}") == 0) return NULL;
  return test_host->error_create(SMP_ERR_INVALID_ARGUMENT, "mem_c: only the key 'ok' (true) is known");
}
static const smp_config_table table = {SMP_CONFIG_TABLE_STRUCT_SIZE, "mem_c", NULL, check_table};
static const smp_config_table* const tables[] = {&table};
static const smp_config_extension config = {
    {SMP_CONFIG_EXTENSION_STRUCT_SIZE, SMP_EXTENSION_CONFIG, 1, &memory.base}, tables, 1};

static const smp_plugin_descriptor descriptor = {
    .struct_size = SMP_PLUGIN_DESCRIPTOR_STRUCT_SIZE, .name = "memory_ext_c_plugin", .plugin_version = "0.0.1",
    .abi_major = SMP_ABI_VERSION_MAJOR, .abi_minor = SMP_ABI_VERSION_MINOR, .torch_version = "",
    .module_kinds = kinds, .n_module_kinds = 1, .adapters = NULL, .n_adapters = 0, .partitioners = NULL,
    .n_partitioners = 0, .rules = rules, .n_rules = 1, .extension_start = &config.base};

SMP_TEST_ENTRY(descriptor)
