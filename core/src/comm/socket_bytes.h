// What this process has written into its TCP sockets, read from the kernel
// (TCP_INFO), so Gloo's traffic is counted where it moves rather than from
// the algorithm's formula.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <vector>

namespace smp {

// One connected TCP socket of this process; the inode tells a reused fd apart.
struct SocketRef {
  int fd = -1;
  ino_t inode = 0;
};

// Every connected TCP socket this process has open now, but those with
// `skip_port` at either end.
std::vector<SocketRef> connected_tcp_sockets(int skip_port = -1);

// The sockets in `after` that are not in `before`.
std::vector<SocketRef> opened_between(const std::vector<SocketRef>& before, const std::vector<SocketRef>& after);

// Bytes handed to these sockets so far: sent (less retransmissions) plus still
// queued. A socket closed since (its fd gone or reused) counts nothing.
int64_t bytes_written(const std::vector<SocketRef>& sockets);

}  // namespace smp
