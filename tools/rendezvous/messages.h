// The elastic rendezvous's wire format: one JSON object per line, each at
// most kMaxLine bytes, with a "t" naming its type. Read from a socket a peer
// controls: bounded before it is parsed, every field checked by type and
// range, refused with the field's name (never a crash, never silently taken).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace smp::rdzv {

inline constexpr size_t kMaxLine = 4096;     // a message, newline excluded
inline constexpr size_t kMaxName = 128;      // a node's name (a launcher's, at most kMaxName - 8: room for "#k")
inline constexpr size_t kMaxMembers = 16;    // names a round message lists (for messages; the rest are counted)
inline constexpr size_t kMaxWhy = 1024;      // a reason
inline constexpr int kMaxNodes = 4096;       // --nnodes MAX

struct Refused : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// One message. Which fields are set depends on `type`:
//   launcher -> rendezvous:
//     hello      name, nproc, port, min_nodes, max_nodes, max_restarts, grow_now, job
//                                                          (joins; ready at once)
//     ready      port                                     (its workers stopped)
//     committed  step                                     (its rank 0 committed a checkpoint)
//     failed     round, why                               (its workers failed)
//     done       round                                    (its workers finished the job)
//     ping
//   rendezvous -> launcher:
//     round      round, node_rank, nnodes, nproc, world, master_addr, port,
//                name (this node's), members (the first kMaxMembers), reason,
//                previous_world                           (start the workers)
//     stop       round, why                               (stop them: the job re-forms)
//     refuse     why                                      (end: the job cannot go on)
//     finish                                              (the job finished)
//     ping
struct Message {
  std::string type;
  std::string name, why, master_addr, reason;
  int nproc = 0, port = 0, min_nodes = 0, max_nodes = 0, max_restarts = 0;
  bool grow_now = false;
  std::string job;  // what every node must agree on: a digest of its worker's arguments and job file
  int round = 0, node_rank = 0, nnodes = 0, world = 0, previous_world = 0;
  int64_t step = 0;
  std::vector<std::string> members;
};

// The line for a message (no newline).
std::string encode(const Message& m);

// A line (without its newline) as a message; throws Refused naming what is wrong.
Message decode(const std::string& line);

// Splits what arrived into complete lines; `pending` keeps a partial one.
// Throws Refused when a line (complete or not) passes kMaxLine.
std::vector<std::string> take_lines(std::string& pending, const char* data, size_t n);

}  // namespace smp::rdzv
