// Exceptions at the plugin boundary, shared by the core's host table and the
// plugin SDK (sdk/host.hpp): nothing may unwind across the C ABI, and a plugin's
// own exception must reach the user as the plugin's, with its type. Kept free of
// the ABI header (the error and code types are template parameters) so the core
// outside plugin/ never sees the C types.
#pragma once

#include <c10/util/Exception.h>

#include <cxxabi.h>

#include <cstdlib>
#include <exception>
#include <string>
#include <typeinfo>
#include <utility>

namespace smp::sdk {

// A plugin's own exception (LibTorch's, the standard library's, the
// plugin's: anything but an smp::sdk::Error, which carries its code) crosses
// the ABI as an internal error with its message and its type after this mark,
// "Target 9 is out of bounds. (c10::IndexError, thrown by plugin code)": the
// host then reports it as the plugin's exception, not as an internal error of
// smp's (host_api.cpp's consume_error, the one reader of the mark).
inline constexpr const char* kPluginExceptionMark = ", thrown by plugin code)";

// The exception's dynamic type as C++ spells it ("c10::IndexError").
inline std::string exception_type(const std::exception& e) {
  const char* mangled = typeid(e).name();
  int status = 0;
  char* name = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string out = status == 0 && name ? name : mangled;
  std::free(name);
  return out;
}

// The message of a plugin's own exception, marked as its (see kPluginExceptionMark).
inline std::string plugin_exception_message(const std::exception& e) {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  return std::string(c10_error ? c10_error->what_without_backtrace() : e.what()) + " (" + exception_type(e) +
         kPluginExceptionMark;
}

// Runs f and turns any exception into an error made by `create`: a CodedError
// (one with code()) keeps its code, anything else becomes `internal`. The one
// exception-to-error wrapper, used by the plugin side (sdk::guard_with) and by
// the core's host table alike. plugin_code: f is a plugin's code, whose own
// exceptions are marked as the plugin's; the core's are its internal errors.
template <class CodedError, class Err, class Code, class F>
Err* guard_exceptions(Err* (*create)(Code, const char*), Code internal, const char* who, F&& f,
                      bool plugin_code = false) noexcept {
  try {
    std::forward<F>(f)();
    return nullptr;
  } catch (const CodedError& e) {
    return create(e.code(), e.what());
  } catch (const std::exception& e) {
    if (plugin_code) return create(internal, plugin_exception_message(e).c_str());
    const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
    return create(internal, c10_error ? c10_error->what_without_backtrace() : e.what());
  } catch (...) {
    const std::string what = std::string("unknown exception in ") + who;
    return create(internal, (plugin_code ? what + " (not a std::exception" + kPluginExceptionMark : what).c_str());
  }
}

}  // namespace smp::sdk
