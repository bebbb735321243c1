// Whether a pipeline Schedule completes under NCCL's point-to-point rules.
// Pure C++ (no LibTorch), beside the simulator, which calls it.
#pragma once

#include "schedule/schedule.h"

#include <string>

namespace smp {

// NCCL's point-to-point rules, which simulate() (buffered sends) does not model:
// a send completes only when the peer's matching receive runs (the worst case,
// a message larger than NCCL's buffers), the k-th send from a to b matches the
// k-th receive on b from a (no tags), and the ops of a stream run one at a
// time in posted order. The host never waits for a send before the step ends
// (c10d's isend) and waits for a receive before its next action (the executor
// uses what it received). An activation's header travels ahead on the host
// path (Gloo, effectively buffered for its 2 KiB), so it changes nothing here.
//
// Which ops share a stream:
//   OnePerPair: c10d's send/recv on one process group, one NCCL communicator
//     (and stream) per pair of ranks carrying both directions;
//   OnePerRank: every op of a rank in one stream (one communicator for the
//     group, as c10d's coalesced ops use);
//   OnePerDirection: one stream per pair and direction, what smp's pipelines
//     use (two process groups, "pp" for messages to a higher pp rank and
//     "pp.down" for messages to a lower one). A stream then holds only sends
//     or only receives, each waits only for its counterpart, so a schedule
//     that completes with buffered sends completes here: no cycle through a
//     stream is possible.
// Returns "" when the schedule completes, else the deadlock, naming for every
// rank what its host waits for and what its streams are stuck at.
//   OnePerGroup: smp's two groups as LibTorch >= 2.3 runs them once a group
//     is connected at start (eagerConnectSingleDevice): unbatched send/recv
//     are then serialized with every other op of the group on its one stream,
//     so rank r's "pp" stream holds its receives from r-1 and its sends to
//     r+1 in posted order, and "pp.down" the reverse.
enum class NcclStreams { OnePerPair, OnePerRank, OnePerDirection, OnePerGroup };
std::string check_nccl_order(const Schedule& schedule, NcclStreams streams);

}  // namespace smp
