// A launcher's connection to the elastic rendezvous (server.h): connects,
// retrying while the rendezvous starts; pings it every second; says the
// rendezvous is lost when it has been silent for the keepalive.
#pragma once

#include "messages.h"

#include <stdexcept>
#include <string>
#include <vector>

namespace smp::rdzv {

struct Lost : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class Client {
 public:
  Client(std::string host, int port, double keepalive_s);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Connects, retrying for up to timeout_s; throws Lost naming the endpoint.
  void connect(double timeout_s);
  // Throws Lost when the message cannot be written.
  void send(const Message& m);
  int fd() const { return fd_; }
  // What arrived (pings taken here); throws Lost when the rendezvous closed,
  // refused or sent what is not a message.
  std::vector<Message> receive();
  // A ping each second; throws Lost when the rendezvous was silent past the keepalive.
  void tick();
  // This end's address: where this node's rank 0 listens when it is node 0.
  std::string local_address() const;
  std::string endpoint() const { return host_ + ":" + std::to_string(port_); }

 private:
  std::string host_;
  int port_;
  double keepalive_s_;
  int fd_ = -1;
  std::string pending_;
  double last_heard_ = 0, last_ping_ = 0;
};

}  // namespace smp::rdzv
