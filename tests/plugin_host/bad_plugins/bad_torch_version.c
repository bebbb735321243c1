/* Defect: claims to be built against another LibTorch. */
#include "test_c_plugin.h"

static const smp_module_kind kind = SMP_TEST_KIND("bad_torch_version_kind");
static const smp_module_kind* const kinds[] = {&kind};
static const smp_plugin_descriptor descriptor = SMP_TEST_DESCRIPTOR(
    SMP_TEST_FULL_SIZE, "bad_torch_version", SMP_ABI_VERSION_MAJOR, SMP_ABI_VERSION_MINOR, "0.0.0-bad", kinds);

SMP_TEST_ENTRY(descriptor)
