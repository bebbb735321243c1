// The ABI's opaque smp_comm: a borrowed pointer to a core Communicator.
#pragma once

namespace smp {
class Communicator;
}

struct smp_comm {
  smp::Communicator* comm;
};
