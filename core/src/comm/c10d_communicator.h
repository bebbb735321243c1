// smp::Communicator over one group's transports (transports.h decides which
// carries an op, byte_accounting.h counts it, comm_work.h reports failures).
#pragma once

#include "comm/comm_work.h"
#include "comm/communicator.h"
#include "comm/transports.h"

#include <memory>

namespace smp {

std::unique_ptr<Communicator> make_c10d_communicator(std::shared_ptr<const GroupContext> ctx, Transports transports);

}  // namespace smp
