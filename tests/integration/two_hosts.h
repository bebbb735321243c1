// Two "hosts" on one machine: two network namespaces joined by a veth pair
// (10.231.<n>.1 and .2), torn down on exit, and smp-launch run in either with
// its output collected as it comes. The multi-host tests' setup (network
// partitions, elastic runs); needs root (ip netns).
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>

namespace smp::testing {

inline int sh(const std::string& cmd) { return std::system((cmd + " >/dev/null 2>&1").c_str()); }
inline std::string quote(const std::string& s) { return "'" + s + "'"; }

class TwoHosts {
 public:
  TwoHosts() {
    const std::string id = std::to_string(::getpid() % 100000);
    a_ = "smp-pa-" + id, b_ = "smp-pb-" + id, va_ = "smpva" + id, vb_ = "smpvb" + id;
    const std::string net = "10.231." + std::to_string(::getpid() % 250 + 1) + ".";
    addr_a_ = net + "1", addr_b_ = net + "2";
    ok_ = sh("ip netns add " + a_) == 0 && sh("ip netns add " + b_) == 0 &&
          sh("ip link add " + va_ + " type veth peer name " + vb_) == 0 && sh("ip link set " + va_ + " netns " + a_) == 0 &&
          sh("ip link set " + vb_ + " netns " + b_) == 0 && sh("ip -n " + a_ + " addr add " + addr_a_ + "/24 dev " + va_) == 0 &&
          sh("ip -n " + b_ + " addr add " + addr_b_ + "/24 dev " + vb_) == 0 && sh("ip -n " + a_ + " link set lo up") == 0 &&
          sh("ip -n " + b_ + " link set lo up") == 0 && link(true);
  }
  ~TwoHosts() {
    kill_all(1);
    kill_all(0);
    sh("ip netns del " + a_);
    sh("ip netns del " + b_);
  }
  TwoHosts(const TwoHosts&) = delete;
  TwoHosts& operator=(const TwoHosts&) = delete;
  bool ok() const { return ok_; }
  bool link(bool up) { return sh("ip -n " + a_ + " link set " + va_ + (up ? " up" : " down")) == 0 &&
                              (!up || sh("ip -n " + b_ + " link set " + vb_ + " up") == 0); }
  const std::string& ns(int host) const { return host == 0 ? a_ : b_; }
  const std::string& addr(int host) const { return host == 0 ? addr_a_ : addr_b_; }
  const std::string& master() const { return addr_a_; }
  // Every process in a host's namespace, at once (the machine is gone).
  void kill_all(int host) { sh("ip netns pids " + ns(host) + " | xargs -r kill -9"); }

 private:
  std::string a_, b_, va_, vb_, addr_a_, addr_b_;
  bool ok_ = false;
};

// One launcher's run in a host: its output as it comes, its exit code at the end.
class HostRun {
 public:
  HostRun() = default;
  HostRun(const HostRun&) = delete;
  HostRun& operator=(const HostRun&) = delete;
  ~HostRun() { join(); }
  void start(const std::string& command) {
    thread_ = std::thread([this, command] {
      FILE* pipe = popen((command + " 2>&1").c_str(), "r");
      std::array<char, 4096> buf{};
      while (pipe && fgets(buf.data(), buf.size(), pipe)) {
        std::lock_guard<std::mutex> lock(mu_);
        output_ += buf.data();
      }
      const int status = pipe ? pclose(pipe) : -1;
      exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      finished_ = true;
    });
  }
  void join() {
    if (thread_.joinable()) thread_.join();
  }
  std::string text() {
    std::lock_guard<std::mutex> lock(mu_);
    return output_;
  }
  bool finished() const { return finished_; }
  int exit_code() const { return exit_code_; }

 private:
  std::thread thread_;
  std::mutex mu_;
  std::string output_;
  std::atomic<int> exit_code_{-1};
  std::atomic<bool> finished_{false};
};

}  // namespace smp::testing
