// The one way the host makes an ABI extension struct: zeroed, its header (the
// whole struct's size as the ABI's *_STRUCT_SIZE macro gives it, the type, the
// version) filled, chained before `next`. Six places filled these headers by
// hand; a field forgotten there was a plugin reading garbage.
#pragma once

#include <smp/abi.h>

#include <cstddef>
#include <cstdint>

namespace smp {

template <class T>
T make_extension(smp_extension_type type, size_t struct_size, const smp_extension_base* next = nullptr,
                 uint32_t version = 1) {
  T e{};
  e.base.struct_size = struct_size;
  e.base.type = type;
  e.base.version = version;
  e.base.next = next;
  return e;
}

}  // namespace smp
