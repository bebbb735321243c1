/* A well-formed plugin written in C: one module kind, "good_c_kind", whose
 * forward returns an error (not implemented). Shows a C plugin loads. */
#include "test_c_plugin.h"

static const smp_module_kind kind = SMP_TEST_KIND("good_c_kind");
static const smp_module_kind* const kinds[] = {&kind};
static const smp_plugin_descriptor descriptor = SMP_TEST_DESCRIPTOR(
    SMP_TEST_FULL_SIZE, "good_c_plugin", SMP_ABI_VERSION_MAJOR, SMP_ABI_VERSION_MINOR, "", kinds);

SMP_TEST_ENTRY(descriptor)
