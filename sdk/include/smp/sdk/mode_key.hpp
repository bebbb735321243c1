// The one dispatcher mode key through which smp acts on ops inside a
// program's unmodified modules while smp runs their node: c10's
// TESTING_ONLY_GenericMode, a mode key above autograd present in LibTorch
// 1.13 to 2.x and unused by LibTorch itself (the C++ frontend has no forward
// hooks). Shared by the tensor-parallel plan (tp_plan.hpp: linear, its
// transpose, addmm, matmul, embedding) and converted BatchNorm
// (sync_batch_norm.hpp: batch_norm). One fallthrough for every other op is
// registered once per process; each op's kernel once.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/intrusive_ptr.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

namespace smp::sdk {
namespace mode_key_detail {

constexpr c10::DispatchKey kModeKey = c10::DispatchKey::TESTING_ONLY_GenericMode;

// Ops a kernel at the mode key calls run with the key excluded: they dispatch as usual.
struct Normal {
  c10::impl::ExcludeDispatchKeyGuard guard{kModeKey};
};

// The fallthrough for every op without a kernel at the key. A fallback
// already there was registered by another shared object including this
// header; registering a second one would throw.
inline void ensure_fallthrough() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (c10::Dispatcher::singleton().hasBackendFallbackForDispatchKey(kModeKey)) return;
    static torch::Library fallthrough(torch::Library::IMPL, "_", kModeKey, __FILE__, __LINE__);
    fallthrough.fallback(torch::CppFunction::makeFallthrough());
  });
}

// Whether aten::<name> has a kernel at the key already (another shared
// object's, which reads the same process-wide registries).
inline bool has_kernel(const char* name) {
  auto op = c10::Dispatcher::singleton().findOp(c10::OperatorName(std::string("aten::") + name, ""));
  return op && op->hasKernelForDispatchKey(kModeKey);
}

// Entries by tensor identity, each holding its tensor weakly: while the
// entry lives the TensorImpl's memory stays allocated (intrusive_ptr frees
// it only once the weak count is 0), so no new tensor can take its address;
// an entry whose tensor has died reads as absent and is dropped.
template <class V>
class ByTensor {
 public:
  using Weak = c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>;
  V* find(const at::Tensor& t) {
    if (!t.defined()) return nullptr;
    auto it = map_.find(t.unsafeGetTensorImpl());
    if (it == map_.end()) return nullptr;
    if (it->second.first.expired()) {
      map_.erase(it);
      return nullptr;
    }
    return &it->second.second;
  }
  void put(const at::Tensor& t, V v) {
    map_.insert_or_assign(t.unsafeGetTensorImpl(), std::make_pair(Weak(t.getIntrusivePtr()), std::move(v)));
  }
  void erase(const at::Tensor& t) { map_.erase(t.unsafeGetTensorImpl()); }
  bool empty() const { return map_.empty(); }
  void sweep() {
    for (auto it = map_.begin(); it != map_.end();) it = it->second.first.expired() ? map_.erase(it) : std::next(it);
  }

 private:
  std::map<const c10::TensorImpl*, std::pair<Weak, V>> map_;
};

}  // namespace mode_key_detail

// While a node whose ops smp acts on runs: the mode key is on.
class ModeScope {
 public:
  explicit ModeScope(bool active) {
    if (active) guard_ = std::make_unique<c10::impl::IncludeDispatchKeyGuard>(mode_key_detail::kModeKey);
  }
  ModeScope(const ModeScope&) = delete;
  ModeScope& operator=(const ModeScope&) = delete;

 private:
  std::unique_ptr<c10::impl::IncludeDispatchKeyGuard> guard_;
};

}  // namespace smp::sdk
