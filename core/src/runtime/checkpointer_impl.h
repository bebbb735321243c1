// What a public smp::Checkpointer reaches: the runtime's Checkpointing and
// train state (both owned by the runtime) and where create() resumed.
#pragma once

#include <smp/checkpointer.h>

#include <memory>

namespace smp {

class Checkpointing;
class TrainState;

struct Checkpointer::Impl {
  std::unique_ptr<Checkpointing> checkpoints;  // waits for its pending save when it goes
  TrainState* state = nullptr;
  ResumePoint resumed;
  bool asked = false;        // run.resume or run.checkpoint_dir given
  bool resume_done = false;  // resume_if_asked() ran
};

}  // namespace smp
