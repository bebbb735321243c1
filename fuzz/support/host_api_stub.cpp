// The host table for the plugin-descriptor fuzzer only (fuzz/CMakeLists.txt).
// The real one (core/src/plugin/host_api.cpp) pulls in the communicators and
// the whole tensor bridge; the descriptor checks read only its LibTorch
// version and hand a plugin's error back. The normal build's replay test
// (tests/fuzz) links the real one.
#include "plugin/host_api.h"

#include <torch/version.h>

struct smp_error {
  std::string message;
};

namespace smp {

const smp_host_api* host_api() {
  static const smp_host_api table = [] {
    smp_host_api h{};
    h.struct_size = sizeof h;
    h.abi_major = SMP_ABI_VERSION_MAJOR;
    h.abi_minor = SMP_ABI_VERSION_MINOR;
    h.torch_version = TORCH_VERSION;
    return h;
  }();
  return &table;
}

std::string consume_error(smp_error* err) {
  if (!err) return "";
  std::string msg = err->message;
  delete err;
  return msg;
}

}  // namespace smp
