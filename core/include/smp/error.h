// The core's exception type. Messages name the file, key, plugin or rank at fault.
#pragma once

#include <stdexcept>
#include <string>

namespace smp {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace smp
