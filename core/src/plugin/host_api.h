// The core's side of the ABI: the host table handed to every plugin, and the
// conversions between handles and at::Tensor that the core uses internally.
#pragma once

#include <smp/abi.h>
#include <smp/mesh.h>

#include <ATen/core/Tensor.h>

#include <string>

namespace smp {

// The table passed to plugin entry points. Lives for the whole process.
const smp_host_api* host_api();

// New reference to a handle sharing storage and autograd history with t.
smp_tensor* make_tensor_handle(const at::Tensor& t);
// Borrowed: the tensor behind a handle.
const at::Tensor& tensor_of(const smp_tensor* t);

// A dimension's role as the ABI says it (SMP_AXIS_SPLITS_*; 0 for a derived axis).
uint32_t role_flag(AxisRole role);

// If err is non-null: frees it and returns "message (code NAME)"; else "".
std::string consume_error(smp_error* err);
// Throws smp::Error("<context>: <message>") and frees err when err is non-null.
void throw_if_error(smp_error* err, const std::string& context);

}  // namespace smp
