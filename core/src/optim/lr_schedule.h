// The learning-rate schedule: linear warm-up, then cosine decay to min_lr.
// (The optimizers themselves are plugins: ABI 2.3's optimizer kinds, the
// standard ones in plugins/optim.)
#pragma once

#include <cstdint>

namespace smp {

struct LrSchedule {
  double lr = 3e-4, min_lr = 3e-5;
  int64_t warmup = 0, total = 1;
  double at(int64_t step) const;  // step counts from 0
};

}  // namespace smp
