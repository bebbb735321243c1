/* Defect: built for a newer ABI minor than the core knows. */
#include "test_c_plugin.h"

static const smp_module_kind kind = SMP_TEST_KIND("bad_newer_minor_kind");
static const smp_module_kind* const kinds[] = {&kind};
static const smp_plugin_descriptor descriptor = SMP_TEST_DESCRIPTOR(
    SMP_TEST_FULL_SIZE, "bad_newer_minor", SMP_ABI_VERSION_MAJOR, SMP_ABI_VERSION_MINOR + 1, "", kinds);

SMP_TEST_ENTRY(descriptor)
