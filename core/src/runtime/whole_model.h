// The model's whole tensors, put together on every rank from each rank's
// slices of them (the train state's "model/" entries): tp and ep shards, ZeRO
// ranges and the stages of other pipeline ranks. What Runtime::model_state_dict
// returns, as FSDP's full state dict does.
#pragma once

#include <smp/state_types.h>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <string>
#include <utility>
#include <vector>

namespace smp {

class Communicator;

// Collective over `world`: every rank passes its own entries (all of them;
// those not named "model/..." are ignored) and gets every parameter and
// buffer whole, by name without the "model/" prefix, sorted by name, on `device`.
std::vector<std::pair<std::string, at::Tensor>> whole_model(const std::vector<StateEntry>& entries, Communicator& world,
                                                            const c10::Device& device);

}  // namespace smp
