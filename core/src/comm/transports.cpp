#include "comm/transports.h"

#include "comm/shm_collectives.h"
#include "comm/shm_mailbox.h"

namespace smp {

Transports::Transports() = default;
Transports::Transports(Transports&&) noexcept = default;
Transports& Transports::operator=(Transports&&) noexcept = default;
Transports::~Transports() = default;

bool Transports::native_reduce_scatter(const at::Tensor& in, int64_t rows) const {
  return in.is_cuda() && nccl && nccl->has_reduce_scatter() && rows % size == 0;
}

std::string Transports::name(const std::string& op, const c10::Device& device) const {
  if (!gloo) return "local";
  if (device.is_cuda()) {
    if (nccl) return nccl->name();
    return name(op, c10::Device(c10::kCPU)) + " (through host memory)";
  }
  if ((op == "allreduce" || op == "allgather" || op == "reduce_scatter" || op == "alltoall") && via_shm(device))
    return "shm";
  if ((op == "send" || op == "recv") && mailbox && device.is_cpu()) return "shm";
  return gloo->name();
}

}  // namespace smp
