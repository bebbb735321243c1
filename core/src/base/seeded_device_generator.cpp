#include "base/seeded_device_generator.h"

#ifdef SMP_WITH_CUDA
#include <ATen/Context.h>
#endif

#include <mutex>

namespace smp {

SeededDeviceGenerator::SeededDeviceGenerator(const c10::Device& device, uint64_t seed) {
#ifdef SMP_WITH_CUDA
  if (!device.is_cuda()) return;
  gen_ = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(gen_.mutex());
  saved_ = gen_.get_state();  // seed and Philox offset
  gen_.set_current_seed(seed);  // the offset back to 0: the call draws what any layout's would
#else
  (void)device;
  (void)seed;
#endif
}

SeededDeviceGenerator::~SeededDeviceGenerator() {
  if (!gen_.defined()) return;
  std::lock_guard<std::mutex> lock(gen_.mutex());
  gen_.set_state(saved_);
}

}  // namespace smp
