// A check against an independent implementation (Hugging Face's transformers,
// safetensors and tokenizers, Megatron's own reader) or a facility of the
// system (network namespaces) that cannot run on this machine:
//
//   SMP_REFERENCE_UNAVAILABLE() << "transformers is not installable here: " << why;
//
// skips the test with its reason, as GTEST_SKIP does, unless
// SMP_REQUIRE_REFERENCES=1 (CI sets it: .ci/run), where it fails it: CI must
// not stay green while the checks that matter most never execute.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>

namespace smp_test {

inline bool references_required() {
  const char* v = std::getenv("SMP_REQUIRE_REFERENCES");
  return v && std::strcmp(v, "1") == 0;
}

}  // namespace smp_test

#define SMP_REFERENCE_UNAVAILABLE()                                                                           \
  return GTEST_MESSAGE_(::smp_test::references_required()                                                     \
                            ? "Failed: this reference check cannot run here, and SMP_REQUIRE_REFERENCES=1"    \
                            : "Skipped",                                                                      \
                        ::smp_test::references_required() ? ::testing::TestPartResult::kFatalFailure          \
                                                          : ::testing::TestPartResult::kSkip)
