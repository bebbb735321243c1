/* Defect: the plugin refuses the host (it needs a newer ABI minor than the
 * host offers) and says why through host->error_create. */
#include "test_c_plugin.h"

#include <stdio.h>

SMP_TEST_EXPORT const smp_plugin_descriptor* smp_plugin_entry(const smp_host_api* host, smp_error** error);
SMP_TEST_EXPORT const smp_plugin_descriptor* smp_plugin_entry(const smp_host_api* host, smp_error** error) {
  char why[160];
  snprintf(why, sizeof why, "bad_refuses_host needs smp ABI %u.%u or newer, the host offers %u.%u",
           (unsigned)SMP_ABI_VERSION_MAJOR, (unsigned)SMP_ABI_VERSION_MINOR + 99u, (unsigned)host->abi_major,
           (unsigned)host->abi_minor);
  *error = host->error_create(SMP_ERR_UNSUPPORTED, why);
  return NULL;
}
