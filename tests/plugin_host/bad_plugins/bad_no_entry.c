/* Defect: no smp_plugin_entry symbol (a misspelt one instead). */
#include "test_c_plugin.h"

static const smp_module_kind kind = SMP_TEST_KIND("bad_no_entry_kind");
static const smp_module_kind* const kinds[] = {&kind};
static const smp_plugin_descriptor descriptor = SMP_TEST_DESCRIPTOR(
    SMP_TEST_FULL_SIZE, "bad_no_entry", SMP_ABI_VERSION_MAJOR, SMP_ABI_VERSION_MINOR, "", kinds);

SMP_TEST_EXPORT const smp_plugin_descriptor* smp_plugin_entry_v2(const smp_host_api* host, smp_error** error);
SMP_TEST_EXPORT const smp_plugin_descriptor* smp_plugin_entry_v2(const smp_host_api* host, smp_error** error) {
  if (error) *error = NULL;
  test_host = host;
  return &descriptor;
}
