// The Communicator's parts live beside this file, one job each:
//   c10d_communicator   the ops: checks, then the transport's call
//   transports          which transport carries an op (shm, gloo, nccl, host copies)
//   byte_accounting     what the ops moved, counted once (CommStats; the formulas)
//   staging             contiguous copies and CUDA tensors' host copies
//   reduce_scatter_emulation  reduce-scatter as an all-to-all where Gloo has none
//   comm_work           Work objects and the one error message of a failed op
//   c10d_rendezvous     the job's store, communicator setup, barriers, shutdown
#include "comm/communicator.h"

namespace smp {

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Max: return "max";
    case ReduceOp::Min: return "min";
    case ReduceOp::Product: return "product";
  }
  return "?";
}

}  // namespace smp
