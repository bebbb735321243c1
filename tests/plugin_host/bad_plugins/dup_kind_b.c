/* Defect (together with dup_kind_a): registers "dup_kind" too. Its first kind,
 * "dup_kind_b_only", is unique: a refusal must not register it either. */
#include "test_c_plugin.h"

static const smp_module_kind unique_kind = SMP_TEST_KIND("dup_kind_b_only");
static const smp_module_kind dup_kind = SMP_TEST_KIND("dup_kind");
static const smp_module_kind* const kinds[] = {&unique_kind, &dup_kind};
static const smp_plugin_descriptor descriptor = SMP_TEST_DESCRIPTOR(
    SMP_TEST_FULL_SIZE, "dup_kind_b", SMP_ABI_VERSION_MAJOR, SMP_ABI_VERSION_MINOR, "", kinds);

SMP_TEST_ENTRY(descriptor)
