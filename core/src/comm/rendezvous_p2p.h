// NCCL's point-to-point rules on the CPU (comm.p2p_semantics = "rendezvous"),
// so that a test sees a pipeline that would hang on GPUs.
//
// Gloo and the shared-memory mailbox buffer a send: it completes at once, and
// any order of sends and receives works. NCCL does not: a send completes only
// when the peer's matching receive runs, the k-th send from a to b matches the
// k-th receive on b from a whatever their tags, and a communicator runs its ops
// one at a time, in posted order, on one stream. (c10d makes a NCCL
// communicator per pair of ranks for send/recv, unless the group was connected
// at start, LibTorch >= 2.3: then every op of the group, send/recv included,
// runs on the group's one stream, the stricter of the two, emulated here.)
// This communicator wraps another and gives its send/recv those rules, on a
// thread that runs them in posted order:
//   * a send hands its tag and tensor to the wrapped transport, then waits for
//     the receiver's acknowledgement, sent once the matching receive ran;
//   * a receive takes the peer's next message (by sequence, not by tag) and
//     refuses one that carries another tag or size, which NCCL would silently
//     take, and tells the sender so;
//   * a host waiting past the communicator's timeout gets an error naming its
//     op, the op its stream is stuck at, and what is queued behind it.
// Collectives go to the wrapped communicator unchanged. The streams use the
// wrapped transport from threads of their own, so it must not wait on the
// store after it was made: Gloo, not the shared-memory mailbox, whose first
// receive from a peer waits for a store key while holding the store client
// that another stream's first send needs (shm_slot_bytes = 0).
#pragma once

#include "comm/communicator.h"

#include <chrono>
#include <functional>
#include <memory>
#include <string>

namespace smp {

// `describe_tag` names what a tag carries in messages ("" : the number only).
std::unique_ptr<Communicator> with_rendezvous_p2p(std::unique_ptr<Communicator> inner,
                                                  std::chrono::milliseconds timeout,
                                                  std::function<std::string(int)> describe_tag = nullptr);

}  // namespace smp
