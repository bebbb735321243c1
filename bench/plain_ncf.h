// The plain LibTorch reference for `smp-bench ncf`: the same NeuMF model (GMF
// and MLP towers, one logit), the same training instances (the ncf adapter's
// own Interactions), BCE, global-norm clipping and AdamW, written directly with
// at:: ops in one process. Run as `smp-bench plain-ncf`.
#pragma once

#include "plain_gpt.h"  // PlainOptions

#include <nlohmann/json.hpp>

namespace bench {

// Trains train.steps steps of the config's NCF model; a summary shaped like
// smp's (losses, step_seconds excluding the first, interactions_per_s).
nlohmann::json run_plain_ncf(const PlainOptions& o);

}  // namespace bench
