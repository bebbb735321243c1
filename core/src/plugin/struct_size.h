// The one check of the size of an ABI struct the other side filled: it must
// hold at least the fields of the minor the reader cannot do without. (A field
// added later is tested where it is read, with SMP_HAS_FIELD from abi.h.)
#pragma once

#include <smp/error.h>

#include <cstddef>
#include <string>

namespace smp {

// Throws "<what> struct_size <n> is smaller than ABI <since>'s <need>" (or
// "<what> is null"). `since` is the minor whose fields `need` covers ("2.0").
template <class T>
void require_struct_size(const T* s, size_t need, const char* since, const std::string& what) {
  if (!s) throw Error(what + " is null");
  if (s->struct_size < need)
    throw Error(what + " struct_size " + std::to_string(s->struct_size) + " is smaller than ABI " + since + "'s " +
                std::to_string(need));
}

}  // namespace smp
