// Runs a callback once an asynchronous operation has finished, on one
// watcher thread per process (the ABI's on-ready callbacks): it polls each
// pending Work's ready(), which never blocks, and fires in completion order.
#pragma once

#include "comm/communicator.h"

#include <functional>
#include <memory>

namespace smp {

// `fire` runs on the watcher thread once work->ready(); it must not block.
void watch_until_ready(std::shared_ptr<Work> work, std::function<void()> fire);

}  // namespace smp
