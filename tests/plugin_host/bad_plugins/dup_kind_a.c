/* Registers the module kind "dup_kind" (fine on its own). */
#include "test_c_plugin.h"

static const smp_module_kind kind = SMP_TEST_KIND("dup_kind");
static const smp_module_kind* const kinds[] = {&kind};
static const smp_plugin_descriptor descriptor = SMP_TEST_DESCRIPTOR(
    SMP_TEST_FULL_SIZE, "dup_kind_a", SMP_ABI_VERSION_MAJOR, SMP_ABI_VERSION_MINOR, "", kinds);

SMP_TEST_ENTRY(descriptor)
