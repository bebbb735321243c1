/* Defect: the descriptor's struct_size stops after torch_version, short of the
 * fields ABI 1.0 requires (module_kinds ... n_tp_rules). */
#include "test_c_plugin.h"

static const smp_module_kind kind = SMP_TEST_KIND("bad_small_descriptor_kind");
static const smp_module_kind* const kinds[] = {&kind};
static const smp_plugin_descriptor descriptor =
    SMP_TEST_DESCRIPTOR(SMP_STRUCT_SIZE(smp_plugin_descriptor, torch_version), "bad_small_descriptor",
                        SMP_ABI_VERSION_MAJOR, SMP_ABI_VERSION_MINOR, "", kinds);

SMP_TEST_ENTRY(descriptor)
