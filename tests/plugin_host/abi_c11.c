/* smp/abi.h compiled as strict C11 (-std=c11 -Wall -Wextra -Wpedantic -Werror). */
#include "abi_layout.h"

#include <stdalign.h>

#define SMP_LAYOUT_ENTRY(type, size_constant) {#type, sizeof(type), alignof(type), size_constant},

const smp_layout_entry smp_layout_c[] = {SMP_ABI_STRUCTS(SMP_LAYOUT_ENTRY)};
const size_t smp_layout_c_count = sizeof(smp_layout_c) / sizeof(smp_layout_c[0]);
const size_t smp_enum_sizes_c[SMP_ABI_N_ENUMS] = {sizeof(smp_error_code), sizeof(smp_dtype),
                                                  sizeof(smp_device_type), sizeof(smp_reduce_op),
                                                  sizeof(smp_log_level), sizeof(smp_split), sizeof(smp_placement_kind),
                                                  sizeof(smp_loss_reduction), sizeof(smp_extension_type)};

/* Static checks, as C11 sees the header (see abi_cxx.cpp). */
#define SMP_STATIC_SIZE_CHECK(type, size_constant)                                  \
  _Static_assert((size_constant) <= sizeof(type), #size_constant " exceeds its struct"); \
  _Static_assert((size_constant) + alignof(type) > sizeof(type), #size_constant " stops short of the last field");
SMP_ABI_STRUCTS(SMP_STATIC_SIZE_CHECK)
const int smp_abi_c_version[2] = {SMP_ABI_VERSION_MAJOR, SMP_ABI_VERSION_MINOR};

/* The entry point type is usable from C. */
static smp_plugin_entry_fn entry_type_check = NULL;
const void* smp_abi_c_entry_type(void);
const void* smp_abi_c_entry_type(void) { return (const void*)&entry_type_check; }
