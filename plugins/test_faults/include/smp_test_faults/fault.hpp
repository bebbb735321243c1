// The fault points of in-tree plugins (smp_nn, smp_tp): the plugins' side of
// the core's base/test_faults.h, for builds made for testing only.
//
// With SMP_TEST_FAULTS off (a release build) fault(name) is the constant
// false and the branches it guards compile away. With it on, a fault is set
// in this process's SMP_TEST_FAULT=<name>[,<name>...]; the core has already
// refused unknown names and warned about each one set before any plugin runs.
#pragma once

#include <smp_test_faults_config.h>

#if SMP_TEST_FAULTS
#include <cstdlib>
#include <string>
#endif

namespace smp_test_faults {

#if SMP_TEST_FAULTS
// Whether `name` is among SMP_TEST_FAULT's names (read once per call site's
// caller: keep the result in a static, as the callers below do).
inline bool fault(const char* name) {
  const char* set = std::getenv("SMP_TEST_FAULT");
  return set && ("," + std::string(set) + ",").find("," + std::string(name) + ",") != std::string::npos;
}
#else
constexpr bool fault(const char*) { return false; }
#endif

}  // namespace smp_test_faults
