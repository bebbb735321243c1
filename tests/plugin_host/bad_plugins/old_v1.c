/* Defect: an ABI 1.0 plugin (built before ABI 2.0): its descriptor is 1.0's
 * size and says major 1. The host must refuse it by name and version. */
#include "test_c_plugin.h"

static const smp_module_kind kind = SMP_TEST_KIND("old_v1_kind");
static const smp_module_kind* const kinds[] = {&kind};
/* ABI 1.0's descriptor ended with its rule list (then tp_rules, n_tp_rules). */
static const smp_plugin_descriptor descriptor =
    SMP_TEST_DESCRIPTOR(SMP_STRUCT_SIZE(smp_plugin_descriptor, n_rules), "old_v1", 1, 0, "", kinds);

SMP_TEST_ENTRY(descriptor)
