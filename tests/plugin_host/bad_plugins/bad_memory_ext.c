/* Defect: its SMP_EXTENSION_MEMORY describes a module kind it does not register. */
#include "test_c_plugin.h"

static const smp_module_kind kind = SMP_TEST_KIND("bad_mem_kind");
static const smp_module_kind* const kinds[] = {&kind};
static const smp_kind_memory kind_memory = {SMP_KIND_MEMORY_STRUCT_SIZE, "someone_elses_kind",
                                            SMP_MEMORY_FEATURE_DEFERRED_INIT};
static const smp_kind_memory* const kind_memories[] = {&kind_memory};
static const smp_memory_extension memory = {
    {SMP_MEMORY_EXTENSION_STRUCT_SIZE, SMP_EXTENSION_MEMORY, 1, NULL}, kind_memories, 1, NULL, 0};
static const smp_plugin_descriptor descriptor = {
    .struct_size = SMP_PLUGIN_DESCRIPTOR_STRUCT_SIZE, .name = "bad_memory_ext", .plugin_version = "0.0.1",
    .abi_major = SMP_ABI_VERSION_MAJOR, .abi_minor = SMP_ABI_VERSION_MINOR, .torch_version = "",
    .module_kinds = kinds, .n_module_kinds = 1, .adapters = NULL, .n_adapters = 0, .partitioners = NULL,
    .n_partitioners = 0, .rules = NULL, .n_rules = 0, .extension_start = &memory.base};

SMP_TEST_ENTRY(descriptor)
