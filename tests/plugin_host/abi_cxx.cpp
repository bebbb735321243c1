// smp/abi.h compiled as C++17 (-Wall -Wextra -Wpedantic -Werror).
#include "abi_layout.h"

#define SMP_LAYOUT_ENTRY(type, size_constant) {#type, sizeof(type), alignof(type), size_constant},

extern "C" {
const smp_layout_entry smp_layout_cxx[] = {SMP_ABI_STRUCTS(SMP_LAYOUT_ENTRY)};
const size_t smp_layout_cxx_count = sizeof(smp_layout_cxx) / sizeof(smp_layout_cxx[0]);
const size_t smp_enum_sizes_cxx[SMP_ABI_N_ENUMS] = {sizeof(smp_error_code), sizeof(smp_dtype),
                                                    sizeof(smp_device_type), sizeof(smp_reduce_op),
                                                    sizeof(smp_log_level), sizeof(smp_split), sizeof(smp_placement_kind),
                                                    sizeof(smp_loss_reduction), sizeof(smp_extension_type)};
}

// Static checks: every named struct-size constant lies within its struct, and
// reaches its end up to (at most) trailing padding.
#define SMP_STATIC_SIZE_CHECK(type, size_constant)                                       \
  static_assert((size_constant) <= sizeof(type), #size_constant " exceeds its struct"); \
  static_assert((size_constant) + alignof(type) > sizeof(type), #size_constant " stops short of the last field");
SMP_ABI_STRUCTS(SMP_STATIC_SIZE_CHECK)
