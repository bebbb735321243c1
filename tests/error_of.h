// The message of the exception of type E that f throws, or "" when it throws
// none: the tests check error messages (they must name the key, node, plugin
// or rank at fault). An exception of another type propagates and fails the test.
#pragma once

#include <string>
#include <utility>

namespace smp_test {

template <class E, class F>
std::string error_of(F&& f) {
  try {
    std::forward<F>(f)();
  } catch (const E& e) {
    return e.what();
  }
  return "";
}

}  // namespace smp_test
