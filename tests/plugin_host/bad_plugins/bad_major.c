/* Defect: built for the next ABI major. */
#include "test_c_plugin.h"

static const smp_module_kind kind = SMP_TEST_KIND("bad_major_kind");
static const smp_module_kind* const kinds[] = {&kind};
static const smp_plugin_descriptor descriptor = SMP_TEST_DESCRIPTOR(
    SMP_TEST_FULL_SIZE, "bad_major", SMP_ABI_VERSION_MAJOR + 1, 0, "", kinds);

SMP_TEST_ENTRY(descriptor)
