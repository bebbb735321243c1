#include "server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <stdexcept>

namespace smp::rdzv {

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void say(const std::string& line) {
  const std::string s = "smp-rendezvous: " + line + "\n";
  ssize_t ignored = ::write(STDERR_FILENO, s.data(), s.size());
  (void)ignored;
}

volatile sig_atomic_t g_stop = 0;
void on_term(int) { g_stop = 1; }

struct Connection {
  int fd = -1;
  std::string pending;
};

// A message out, whole or not at all: they are small, and a peer that does
// not read them for a second is as good as lost.
bool send_line(int fd, const Message& m) {
  const std::string line = encode(m) + "\n";
  size_t done = 0;
  const auto deadline = now_s() + 1.0;
  while (done < line.size()) {
    const ssize_t n = ::send(fd, line.data() + done, line.size() - done, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EINTR) && now_s() < deadline) {
      pollfd p{fd, POLLOUT, 0};
      ::poll(&p, 1, 50);
      continue;
    }
    return false;
  }
  return true;
}

}  // namespace

std::pair<std::string, int> parse_endpoint(const std::string& endpoint) {
  const auto colon = endpoint.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == endpoint.size())
    throw std::runtime_error("--rdzv-endpoint " + endpoint + ": expected HOST:PORT");
  std::string host = endpoint.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  const std::string port_text = endpoint.substr(colon + 1);
  if (port_text.size() > 5 || port_text.find_first_not_of("0123456789") != std::string::npos)
    throw std::runtime_error("--rdzv-endpoint " + endpoint + ": the port is not a number in [1, 65535]");
  const int port = std::stoi(port_text);
  if (port < 1 || port > 65535) throw std::runtime_error("--rdzv-endpoint " + endpoint + ": the port is not in [1, 65535]");
  if (host.size() > 253) throw std::runtime_error("--rdzv-endpoint: the host name is longer than 253 characters");
  // Every launcher could bind a wildcard: each would serve a rendezvous of its own.
  if (host == "0.0.0.0" || host == "::" || host == "*")
    throw std::runtime_error("--rdzv-endpoint " + endpoint + ": the address of the machine that serves the "
                             "rendezvous, not a wildcard (every launcher could bind that one)");
  return {host, port};
}

int listen_on(const std::string& addr, int port, std::string* error, bool* in_use) {
  *in_use = false;
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  const std::string service = std::to_string(port);
  if (const int rc = ::getaddrinfo(addr.c_str(), service.c_str(), &hints, &res); rc != 0) {
    *error = "cannot resolve " + addr + ": " + ::gai_strerror(rc);
    return -1;
  }
  int fd = -1;
  for (addrinfo* a = res; a; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 64) == 0) break;
    const int e = errno;
    ::close(fd);
    fd = -1;
    if (e == EADDRINUSE || e == EADDRNOTAVAIL) *in_use = true;
    *error = addr + ":" + service + ": " + std::strerror(e);
  }
  ::freeaddrinfo(res);
  return fd;
}

int serve(int listen_fd, const MembershipOptions& options) {
  struct sigaction sa {};
  sa.sa_handler = on_term;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGTERM, &sa, nullptr);
  ::sigaction(SIGINT, &sa, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
  ::fcntl(listen_fd, F_SETFL, ::fcntl(listen_fd, F_GETFL) | O_NONBLOCK);
  Membership members(options);
  members.start(now_s());
  std::map<int, Connection> conns;  // by id
  int next_id = 1;
  double last_ping = 0;
  // A connection per node and some to spare, within the descriptors this
  // process may open (raised to the hard limit: a job of thousands of nodes).
  rlimit files{};
  ::getrlimit(RLIMIT_NOFILE, &files);
  files.rlim_cur = files.rlim_max;
  ::setrlimit(RLIMIT_NOFILE, &files);
  ::getrlimit(RLIMIT_NOFILE, &files);
  const size_t max_conns = std::min<size_t>(static_cast<size_t>(2 * options.max_nodes + 16),
                                            files.rlim_cur > 64 ? static_cast<size_t>(files.rlim_cur - 32) : 32);

  auto close_conn = [&](int id) {
    auto it = conns.find(id);
    if (it == conns.end()) return;
    ::close(it->second.fd);
    conns.erase(it);
    members.forget(id);  // ids are not reused: what the rules kept of it goes
  };
  auto deliver = [&](const std::vector<Outgoing>& out) {
    std::vector<int> failed;
    for (const Outgoing& o : out) {
      auto it = conns.find(o.to);
      if (it != conns.end() && !send_line(it->second.fd, o.message)) failed.push_back(o.to);
    }
    for (const std::string& line : members.take_log()) say(line);
    for (int id : members.take_dropped()) close_conn(id);
    return failed;
  };
  auto handle = [&](std::vector<Outgoing> out) {
    // A node that cannot be written to is lost; losing it may say more.
    for (int round = 0; round < 64 && !out.empty(); ++round) {
      const std::vector<int> failed = deliver(out);
      out.clear();
      for (int id : failed) {
        auto more = members.lost(id, "its connection failed", now_s());
        out.insert(out.end(), more.begin(), more.end());
        close_conn(id);
      }
    }
    deliver(out);
  };

  while (!g_stop && !members.ended()) {
    std::vector<pollfd> pfds{{listen_fd, POLLIN, 0}};
    std::vector<int> ids;
    for (const auto& [id, c] : conns) {
      pfds.push_back({c.fd, POLLIN, 0});
      ids.push_back(id);
    }
    const int n = ::poll(pfds.data(), pfds.size(), 200);
    if (n < 0 && errno != EINTR) {
      say(std::string("poll: ") + std::strerror(errno));
      return 1;
    }
    const double now = now_s();
    if (n > 0 && (pfds[0].revents & POLLIN)) {
      while (true) {
        sockaddr_storage peer{};
        socklen_t len = sizeof peer;
        const int fd = ::accept4(listen_fd, reinterpret_cast<sockaddr*>(&peer), &len, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) {
          // Out of descriptors: the connection waits in the backlog; not a busy loop.
          if (errno == EMFILE || errno == ENFILE) ::poll(nullptr, 0, 100);
          break;
        }
        if (conns.size() >= max_conns) {  // bounded: a flood of connections is not held
          ::close(fd);
          continue;
        }
        int one = 1;
        ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        char host[NI_MAXHOST] = "127.0.0.1";
        ::getnameinfo(reinterpret_cast<sockaddr*>(&peer), len, host, sizeof host, nullptr, 0, NI_NUMERICHOST);
        const int id = next_id++;
        conns[id] = Connection{fd, ""};
        members.connected(id, host, now);
      }
    }
    for (size_t i = 1; i < pfds.size(); ++i) {
      if (!(pfds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      const int id = ids[i - 1];
      auto it = conns.find(id);
      if (it == conns.end()) continue;
      char buf[8192];
      const ssize_t got = ::recv(it->second.fd, buf, sizeof buf, 0);
      if (got < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      if (got <= 0) {
        handle(members.lost(id, got == 0 ? "its launcher's connection closed" : std::string("its connection failed: ") +
                                                                                 std::strerror(errno),
                            now));
        close_conn(id);
        continue;
      }
      std::vector<Outgoing> out;
      try {
        for (const std::string& line : take_lines(it->second.pending, buf, static_cast<size_t>(got))) {
          const Message m = decode(line);
          auto more = members.receive(id, m, now);
          out.insert(out.end(), more.begin(), more.end());
        }
      } catch (const Refused& e) {
        Message r;
        r.type = "refuse";
        r.why = std::string("the rendezvous refused a message: ") + e.what();
        send_line(it->second.fd, r);
        auto more = members.lost(id, std::string("sent ") + e.what(), now);
        out.insert(out.end(), more.begin(), more.end());
        close_conn(id);
      }
      handle(out);
    }
    handle(members.tick(now));
    if (now - last_ping >= 1.0) {
      last_ping = now;
      Message ping;
      ping.type = "ping";
      std::vector<int> failed;
      for (const auto& [id, c] : conns)
        if (!send_line(c.fd, ping)) failed.push_back(id);
      for (int id : failed) {
        handle(members.lost(id, "its connection failed", now));
        close_conn(id);
      }
    }
  }
  for (const auto& [id, c] : conns) ::close(c.fd);
  ::close(listen_fd);
  if (g_stop) return 1;
  return members.ended().value_or(1);
}

}  // namespace smp::rdzv
