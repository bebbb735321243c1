// A parameter's placements as a module declared them through the ABI
// (smp_placement), read into the core's Placements (mesh/placement.h), which
// checks them against the mesh.
#pragma once

#include <smp/abi.h>
#include <smp/mesh.h>

#include "mesh/placement.h"

#include <cstddef>
#include <cstdint>
#include <string>

namespace smp {

// Throws smp::Error (prefixed with `where`) for a null array, a struct smaller
// than ABI 2.0's, an unknown kind, or anything Placements::checked refuses.
Placements placements_from_abi(const smp_placement* p, size_t n, int64_t ndim, const std::string& where,
                               const DeviceMesh* mesh = nullptr);

}  // namespace smp
