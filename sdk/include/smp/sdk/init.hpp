// Parameter initialisation for plugins: <smp/common/init.hpp> (shared with the
// core, which fills deferred parameters with the same code), plus the check that
// its draw kinds are the C ABI's.
#pragma once

#include <smp/abi.h>
#include <smp/common/init.hpp>

static_assert(smp::sdk::InitKind::kNormal == SMP_PARAM_INIT_NORMAL &&
                  smp::sdk::InitKind::kConstant == SMP_PARAM_INIT_CONSTANT,
              "smp/common/init.hpp's draw kinds must be the ABI's smp_param_init_kind values");
