#include "comm/socket_bytes.h"

#include <dirent.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <linux/tcp.h>

#include <cstddef>
#include <cstdlib>

namespace smp {

namespace {

constexpr unsigned kTcpEstablished = 1;  // the kernel's TCP_ESTABLISHED (not in <linux/tcp.h>)

// The kernel's tcp_info, or false when fd is not a TCP socket. Kernels before
// 4.19 fill less of it; their missing counters read as zero.
bool tcp_info_of(int fd, ::tcp_info* info) {
  *info = {};
  socklen_t len = sizeof(*info);
  return ::getsockopt(fd, IPPROTO_TCP, TCP_INFO, info, &len) == 0;
}

// The port of one end of a TCP socket (IPv4 or IPv6), or -1.
int port_of(int fd, int (*end)(int, sockaddr*, socklen_t*)) {
  sockaddr_storage a{};
  socklen_t len = sizeof(a);
  if (end(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) return -1;
  if (a.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(&a)->sin_port);
  if (a.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(&a)->sin6_port);
  return -1;
}

bool same_socket(const SocketRef& s) {
  struct stat st {};
  return ::fstat(s.fd, &st) == 0 && S_ISSOCK(st.st_mode) && st.st_ino == s.inode;
}

}  // namespace

std::vector<SocketRef> connected_tcp_sockets(int skip_port) {
  std::vector<SocketRef> out;
  DIR* dir = ::opendir("/proc/self/fd");
  if (!dir) return out;
  const int own = ::dirfd(dir);
  while (const dirent* e = ::readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd == own) continue;
    struct stat st {};
    if (::fstat(static_cast<int>(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    ::tcp_info info;
    if (!tcp_info_of(static_cast<int>(fd), &info) || info.tcpi_state != kTcpEstablished) continue;
    if (skip_port >= 0 && (port_of(static_cast<int>(fd), ::getsockname) == skip_port ||
                           port_of(static_cast<int>(fd), ::getpeername) == skip_port))
      continue;
    out.push_back({static_cast<int>(fd), st.st_ino});
  }
  ::closedir(dir);
  return out;
}

std::vector<SocketRef> opened_between(const std::vector<SocketRef>& before, const std::vector<SocketRef>& after) {
  std::vector<SocketRef> out;
  for (const SocketRef& a : after) {
    bool old = false;
    for (const SocketRef& b : before) old = old || (a.fd == b.fd && a.inode == b.inode);
    if (!old) out.push_back(a);
  }
  return out;
}

int64_t bytes_written(const std::vector<SocketRef>& sockets) {
  int64_t total = 0;
  for (const SocketRef& s : sockets) {
    ::tcp_info info;
    if (!same_socket(s) || !tcp_info_of(s.fd, &info)) continue;
    total += static_cast<int64_t>(info.tcpi_bytes_sent - info.tcpi_bytes_retrans) +
             static_cast<int64_t>(info.tcpi_notsent_bytes);
  }
  return total;
}

}  // namespace smp
