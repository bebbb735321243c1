#include "plugin/placement_abi.h"

#include <smp/error.h>

#include "plugin/struct_size.h"

#include <vector>

namespace smp {

Placements placements_from_abi(const smp_placement* p, size_t n, int64_t ndim, const std::string& where,
                               const DeviceMesh* mesh) {
  if (n > 0 && !p) throw Error(where + ": " + std::to_string(n) + " placements but a null array");
  std::vector<DeclaredPlacement> declared;
  for (size_t i = 0; i < n; ++i) {
    const smp_placement& s = p[i];
    require_struct_size(&s, SMP_PLACEMENT_STRUCT_SIZE, "2.0", where + ": placement " + std::to_string(i));
    DeclaredPlacement d;
    d.axis = s.axis ? s.axis : "";
    d.dim = s.dim;
    switch (s.kind) {
      case SMP_PLACEMENT_REPLICATE: d.kind = PlacementKind::Replicate; break;
      case SMP_PLACEMENT_PARTIAL_GRAD: d.kind = PlacementKind::Partial; break;
      case SMP_PLACEMENT_SHARD: d.kind = PlacementKind::Shard; break;
      default:
        throw Error(where + ": unknown placement kind " + std::to_string(static_cast<int>(s.kind)) + " on axis '" +
                    d.axis + "'");
    }
    declared.push_back(std::move(d));
  }
  return Placements::checked(declared, ndim, where, mesh);
}

}  // namespace smp
