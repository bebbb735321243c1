// The core's exception type. Messages name the file, key, plugin or rank at fault.
#pragma once

#include <stdexcept>
#include <string>

// Exported from libsmp_core (built with hidden visibility): the public API.
#pragma GCC visibility push(default)
namespace smp {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace smp
#pragma GCC visibility pop
