// smp/abi.h is one contract for C and C++ plugins: both languages must see the
// same struct layouts. (Building abi_c11.c as strict C11 is itself part of the test.)
#include "abi_layout.h"

#include <gtest/gtest.h>

#include <cstring>

TEST(AbiHeader, CompilesAsC11AndCxxWithTheSameLayouts) {
  ASSERT_EQ(smp_layout_c_count, smp_layout_cxx_count);
  ASSERT_GE(smp_layout_c_count, 15u);
  for (size_t i = 0; i < smp_layout_c_count; ++i) {
    const smp_layout_entry& c = smp_layout_c[i];
    const smp_layout_entry& cxx = smp_layout_cxx[i];
    SCOPED_TRACE(c.type);
    EXPECT_STREQ(c.type, cxx.type);
    EXPECT_EQ(c.size, cxx.size);
    EXPECT_EQ(c.align, cxx.align);
    EXPECT_EQ(c.struct_size, cxx.struct_size);
    // Every struct starts with struct_size, and SMP_STRUCT_SIZE covers the
    // whole struct up to (at most) trailing padding.
    EXPECT_LE(c.struct_size, c.size);
    EXPECT_GT(c.struct_size + c.align, c.size);
  }
  for (int i = 0; i < SMP_ABI_N_ENUMS; ++i) {
    EXPECT_EQ(smp_enum_sizes_c[i], smp_enum_sizes_cxx[i]) << "enum #" << i;
    EXPECT_EQ(smp_enum_sizes_c[i], sizeof(int)) << "enum #" << i;
  }
  EXPECT_EQ(smp_abi_c_version[0], SMP_ABI_VERSION_MAJOR);
  EXPECT_EQ(smp_abi_c_version[1], SMP_ABI_VERSION_MINOR);
}

TEST(AbiHeader, StructSizeStartsEveryStruct) {
  EXPECT_EQ(offsetof(smp_plugin_descriptor, struct_size), 0u);
  EXPECT_EQ(offsetof(smp_host_api, struct_size), 0u);
  EXPECT_EQ(offsetof(smp_module_kind, struct_size), 0u);
  EXPECT_EQ(offsetof(smp_forward_args, struct_size), 0u);
  // The versions come right after struct_size and the name strings, so a host
  // can read them from any descriptor that holds them.
  EXPECT_LT(offsetof(smp_plugin_descriptor, abi_minor), offsetof(smp_plugin_descriptor, module_kinds));
}
