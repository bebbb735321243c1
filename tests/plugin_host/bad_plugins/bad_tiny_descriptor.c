/* Defect: the descriptor's struct_size is too small to even hold the versions. */
#include "test_c_plugin.h"

static const smp_module_kind kind = SMP_TEST_KIND("bad_tiny_descriptor_kind");
static const smp_module_kind* const kinds[] = {&kind};
static const smp_plugin_descriptor descriptor = SMP_TEST_DESCRIPTOR(
    sizeof(size_t), "bad_tiny_descriptor", SMP_ABI_VERSION_MAJOR, SMP_ABI_VERSION_MINOR, "", kinds);

SMP_TEST_ENTRY(descriptor)
