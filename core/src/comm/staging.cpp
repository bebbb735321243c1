#include "comm/staging.h"

#include "comm/comm_work.h"

#include <ATen/ATen.h>

namespace smp {

Staged stage(const at::Tensor& t) {
  if (t.is_contiguous()) return {t, false};
  return {t.contiguous(), true};
}

std::function<void()> write_back(at::Tensor target, const Staged& result, at::Tensor keep_alive) {
  return [target, src = result.t, copied = result.copied, keep = std::move(keep_alive)]() mutable {
    if (copied) target.copy_(src);
  };
}

std::shared_ptr<Work> copied_back(std::shared_ptr<Work> op, at::Tensor device_out, at::Tensor host_out,
                                  at::Tensor keep) {
  return std::make_shared<ThenWork>(std::move(op), [device_out, host_out, keep]() mutable {
    device_out.copy_(host_out);
  });
}

at::Tensor host_like(const at::Tensor& t) { return at::empty(t.sizes(), t.options().device(c10::kCPU)); }

}  // namespace smp
