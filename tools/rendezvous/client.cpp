#include "client.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

namespace smp::rdzv {

namespace {
double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

Client::Client(std::string host, int port, double keepalive_s)
    : host_(std::move(host)), port_(port), keepalive_s_(keepalive_s) {}

Client::~Client() {
  if (fd_ >= 0) ::close(fd_);
}

void Client::connect(double timeout_s) {
  const double deadline = now_s() + timeout_s;
  std::string last = "no answer";
  while (true) {
    addrinfo hints{}, *res = nullptr;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    const int rc = ::getaddrinfo(host_.c_str(), std::to_string(port_).c_str(), &hints, &res);
    if (rc != 0) {
      last = std::string("cannot resolve ") + host_ + ": " + ::gai_strerror(rc);
    } else {
      for (addrinfo* a = res; a && fd_ < 0; a = a->ai_next) {
        const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, 0);
        if (fd < 0) continue;
        if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
          fd_ = fd;
        } else {
          last = std::strerror(errno);
          ::close(fd);
        }
      }
      ::freeaddrinfo(res);
    }
    if (fd_ >= 0) break;
    if (now_s() >= deadline)
      throw Lost("could not reach the rendezvous at " + endpoint() + " within " + std::to_string(int(timeout_s)) +
                 " s (--rdzv-timeout): " + last);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  int one = 1;
  ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  last_heard_ = last_ping_ = now_s();
}

void Client::send(const Message& m) {
  const std::string line = encode(m) + "\n";
  size_t done = 0;
  while (done < line.size()) {
    const ssize_t n = ::send(fd_, line.data() + done, line.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw Lost("the rendezvous at " + endpoint() + " cannot be written to: " + std::strerror(errno));
    done += static_cast<size_t>(n);
  }
}

std::vector<Message> Client::receive() {
  std::vector<Message> out;
  char buf[8192];
  while (true) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, 0) <= 0) break;
    const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) break;
    if (n == 0) throw Lost("the rendezvous at " + endpoint() + " closed the connection");
    if (n < 0) throw Lost("the rendezvous at " + endpoint() + ": " + std::strerror(errno));
    last_heard_ = now_s();
    try {
      for (const std::string& line : take_lines(pending_, buf, static_cast<size_t>(n))) {
        Message m = decode(line);
        if (m.type != "ping") out.push_back(std::move(m));
      }
    } catch (const Refused& e) {
      throw Lost("the rendezvous at " + endpoint() + " sent what smp-launch refuses: " + e.what());
    }
    if (static_cast<size_t>(n) < sizeof buf) break;
  }
  return out;
}

void Client::tick() {
  const double now = now_s();
  if (now - last_heard_ > keepalive_s_)
    throw Lost("the rendezvous at " + endpoint() + " was silent for " + std::to_string(int(now - last_heard_)) +
               " s (keepalive " + std::to_string(int(keepalive_s_)) + " s)");
  if (now - last_ping_ >= 1.0) {
    last_ping_ = now;
    Message ping;
    ping.type = "ping";
    send(ping);
  }
}

std::string Client::local_address() const {
  sockaddr_storage me{};
  socklen_t len = sizeof me;
  char host[NI_MAXHOST] = "127.0.0.1";
  if (::getsockname(fd_, reinterpret_cast<sockaddr*>(&me), &len) == 0)
    ::getnameinfo(reinterpret_cast<sockaddr*>(&me), len, host, sizeof host, nullptr, 0, NI_NUMERICHOST);
  return host;
}

}  // namespace smp::rdzv
