// The plugin side of the ABI: the host table, error translation, tensor handles.
// Header-only; a plugin includes it and links LibTorch, never libsmp_core.
#pragma once

#include <smp/abi.h>
#include <smp/common/exceptions.hpp>

#include <ATen/core/Tensor.h>

#include <cstdlib>
#include <stdexcept>
#include <string>
#include <typeinfo>
#include <utility>

namespace smp::sdk {

// Set once by the entry point (SMP_PLUGIN). Each plugin .so has its own copy:
// plugins are built with hidden visibility.
inline const smp_host_api*& host_slot() {
  static const smp_host_api* host = nullptr;
  return host;
}
inline const smp_host_api& host() {
  const smp_host_api* h = host_slot();
  if (!h) throw std::logic_error("smp sdk: host API used before the plugin entry point ran");
  return *h;
}

// A failure in a plugin: carries an ABI error code to the host.
class Error : public std::runtime_error {
 public:
  Error(smp_error_code code, const std::string& message) : std::runtime_error(message), code_(code) {}
  explicit Error(const std::string& message) : Error(SMP_ERR_INVALID_ARGUMENT, message) {}
  smp_error_code code() const { return code_; }

 private:
  smp_error_code code_;
};

// Turns a host error into an exception (the plugin owns the error; it is freed here).
inline void check(smp_error* err) {
  if (!err) return;
  const smp_host_api& h = host();
  smp_error_code code = h.error_code(err);
  std::string msg = h.error_message(err);
  h.error_destroy(err);
  throw Error(code, msg);
}

// Runs f and turns any exception into an ABI error made by `create`
// (guard_exceptions in smp/common/exceptions.hpp: an sdk::Error keeps its code,
// anything else is SMP_ERR_INTERNAL, a plugin's own marked as the plugin's).
template <class F>
smp_error* guard_with(smp_error* (*create)(smp_error_code, const char*), const char* who, F&& f,
                      bool plugin_code = false) noexcept {
  return guard_exceptions<Error>(create, SMP_ERR_INTERNAL, who, std::forward<F>(f), plugin_code);
}

// Runs f in a plugin and turns any exception into an ABI error for the host.
template <class F>
smp_error* guard(F&& f) noexcept {
  return guard_with(host().error_create, "plugin", std::forward<F>(f), true);
}

// Borrowed view: the at::Tensor behind a handle, same storage and autograd graph.
inline const at::Tensor& aten(const smp_tensor* t) {
  if (!t) throw Error("smp sdk: null tensor handle");
  return *static_cast<const at::Tensor*>(host().tensor_aten(t));
}

// New reference: a handle that shares storage and autograd history with t.
inline smp_tensor* to_handle(const at::Tensor& t) { return host().tensor_from_aten(&t); }

// Owning handle (RAII over retain/release).
class TensorRef {
 public:
  TensorRef() = default;
  static TensorRef adopt(smp_tensor* t) { TensorRef r; r.t_ = t; return r; }
  static TensorRef borrow(smp_tensor* t) {
    if (t) host().tensor_retain(t);
    return adopt(t);
  }
  explicit TensorRef(const at::Tensor& t) : t_(to_handle(t)) {}
  TensorRef(const TensorRef& o) : t_(o.t_) { if (t_) host().tensor_retain(t_); }
  TensorRef(TensorRef&& o) noexcept : t_(std::exchange(o.t_, nullptr)) {}
  TensorRef& operator=(TensorRef o) noexcept { std::swap(t_, o.t_); return *this; }
  ~TensorRef() { if (t_) host().tensor_release(t_); }
  smp_tensor* get() const { return t_; }
  smp_tensor* release() { return std::exchange(t_, nullptr); }
  const at::Tensor& tensor() const { return aten(t_); }

 private:
  smp_tensor* t_ = nullptr;
};

// The first extension of `type` in a chain, or null.
inline const smp_extension_base* find_extension(const smp_extension_base* chain, uint32_t type) {
  for (; chain; chain = chain->next)
    if (chain->type == type) return chain;
  return nullptr;
}

inline void log(smp_log_level level, const char* plugin, const std::string& msg) {
  host().log(level, plugin, msg.c_str());
}

}  // namespace smp::sdk
