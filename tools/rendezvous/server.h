// The elastic rendezvous on TCP: a listening socket, a connection per node's
// smp-launch, the decisions of membership.h. It runs as its own process: in
// the launcher that could bind --rdzv-endpoint (forked at start, it dies with
// that launcher), or alone (`smp-launch --rdzv-server`), on a machine that is
// not a worker. Either way it is the job's single point of failure, as
// torchrun's c10d rendezvous store is.
#pragma once

#include "membership.h"

#include <string>

namespace smp::rdzv {

// A socket listening on addr:port, or -1 with `error` set. `in_use` says the
// address is another's (bound already, or not an address of this host): then
// this launcher is a client only.
int listen_on(const std::string& addr, int port, std::string* error, bool* in_use);

// Serves until the job ends (every node finished: 0; refused: 1) or SIGTERM
// (then 1). Logs its decisions to stderr, prefixed "smp-rendezvous: ".
int serve(int listen_fd, const MembershipOptions& options);

// "host:port" -> host, port; throws std::runtime_error naming --rdzv-endpoint.
std::pair<std::string, int> parse_endpoint(const std::string& endpoint);

}  // namespace smp::rdzv
