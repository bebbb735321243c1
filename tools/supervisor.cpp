// smp-launch's supervisor. One thread: a poll() loop over the workers' output
// pipes and a self-pipe fed by the signal handlers (SIGCHLD, SIGINT, SIGTERM,
// SIGHUP). Every worker runs in its own process group, so tearing down a rank
// also takes whatever it spawned, and dies with the launcher (PR_SET_PDEATHSIG).
#include "supervisor.h"

#include "planned_layout.h"
#include "rendezvous/client.h"
#include "rendezvous/server.h"

#include <smp/process_env.h>

#include <nlohmann/json.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <deque>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

extern char** environ;

namespace smp::launch {

namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kKeepLines = 200;  // per rank
constexpr size_t kShowLines = 20;   // printed for the failing rank

int g_signal_pipe[2] = {-1, -1};

void on_signal(int sig) {
  int saved = errno;
  unsigned char b = static_cast<unsigned char>(sig);
  ssize_t ignored = ::write(g_signal_pipe[1], &b, 1);
  (void)ignored;
  errno = saved;
}

void say(const std::string& line) {
  std::string s = "smp-launch: " + line + "\n";
  ssize_t ignored = ::write(STDERR_FILENO, s.data(), s.size());
  (void)ignored;
}

std::string signal_name(int sig) {
  switch (sig) {
    case SIGKILL: return "SIGKILL";
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGSEGV: return "SIGSEGV";
    case SIGABRT: return "SIGABRT";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGILL: return "SIGILL";
    case SIGHUP: return "SIGHUP";
    case SIGPIPE: return "SIGPIPE";
    case SIGQUIT: return "SIGQUIT";
    default: {
      const char* d = ::strsignal(sig);
      return "signal " + std::to_string(sig) + (d ? std::string(" (") + d + ")" : "");
    }
  }
}

std::optional<std::string> getenv_str(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return std::nullopt;
  return std::string(v);
}

void set_cloexec_nonblock(int fd, bool nonblock) {
  ::fcntl(fd, F_SETFD, ::fcntl(fd, F_GETFD) | FD_CLOEXEC);
  if (nonblock) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
}

// A free port, or -1 (the caller reports it).
int free_port_or_none(const std::string& addr) {
  try {
    return smp::find_free_port(addr);
  } catch (const std::exception&) {
    return -1;
  }
}

bool mkdirs(const std::string& path) {
  std::string cur;
  for (size_t i = 0; i <= path.size(); ++i) {
    if (i == path.size() || path[i] == '/') {
      if (!cur.empty() && ::mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST) return false;
    }
    if (i < path.size()) cur += path[i];
  }
  return true;
}

// The environment for one worker: ours, with the launcher's variables replaced.
std::vector<std::string> make_env(const std::map<std::string, std::string>& vars) {
  std::vector<std::string> env;
  for (char** e = environ; e && *e; ++e) {
    std::string kv(*e);
    std::string k = kv.substr(0, kv.find('='));
    if (!vars.count(k)) env.push_back(kv);
  }
  for (const auto& [k, v] : vars) env.push_back(k + "=" + v);
  return env;
}

std::vector<char*> c_array(std::vector<std::string>& v) {
  std::vector<char*> out;
  for (auto& s : v) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

struct Rank {
  int global = 0, local = 0;
  pid_t pid = -1;
  bool running = false;
  int out_fd = -1;  // read end of its stdout+stderr pipe; -1 for rank 0 (terminal) without --log-dir
  bool echo = false;  // rank 0 under --log-dir: what it prints is copied to the launcher's stdout as it comes
  std::string partial;
  std::deque<std::string> lines;
  int log_fd = -1;
  bool exited = false;
  int code = 0, signal = 0;  // exit status
  // Progress (SMP_HEARTBEAT_FD): the worker says its run.hang_timeout_s, then
  // beats after each step; a rank silent for longer than that has hung.
  int beat_fd = -1;
  double hang_timeout_s = 0;
  std::chrono::steady_clock::time_point last_beat;
  std::string beat_partial;
};

class Supervisor {
 public:
  explicit Supervisor(const LaunchOptions& o)
      : o_(o), nnodes_(o.nnodes), node_rank_(o.node_rank), master_addr_(o.master_addr) {}

  int run() {
    if (::pipe(g_signal_pipe) != 0) {
      say(std::string("pipe: ") + std::strerror(errno));
      return 1;
    }
    set_cloexec_nonblock(g_signal_pipe[0], true);
    set_cloexec_nonblock(g_signal_pipe[1], true);
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    for (int s : {SIGCHLD, SIGINT, SIGTERM, SIGHUP}) ::sigaction(s, &sa, nullptr);
    ::signal(SIGPIPE, SIG_IGN);

    if (!o_.log_dir.empty() && !mkdirs(o_.log_dir)) {
      say("cannot create the log directory " + o_.log_dir + ": " + std::strerror(errno));
      return 1;
    }
    if (o_.bind_cores && !plan_core_binding()) return 2;
    if (o_.elastic) return run_elastic();
    // The port: --master-port, else MASTER_PORT, else on one node a free one
    // (torchrun's standalone mode: two jobs on one machine do not collide),
    // else 29500, which every node must agree on.
    int port = o_.master_port;
    if (!o_.master_port_given) {
      if (const auto env = getenv_str("MASTER_PORT")) {
        try {
          port = std::stoi(*env);
        } catch (const std::exception&) {
          say("MASTER_PORT='" + *env + "' is not a port number");
          return 2;
        }
      } else if (o_.nnodes == 1) {
        port = 0;
      }
    }
    if (port == 0) {
      if (o_.nnodes > 1) {
        say("--master-port 0 (pick a free port) only works with one node: every node must be given the same port");
        return 2;
      }
      port = free_port_or_none(o_.master_addr);
      if (port <= 0) {
        say("could not find a free port on " + o_.master_addr);
        return 1;
      }
      say("MASTER_PORT=" + std::to_string(port));
    }
    port_ = port;

    const int attempts = o_.max_restarts + 1;
    int rc = 0;
    for (int attempt = 0; attempt < attempts; ++attempt) {
      if (attempt > 0)
        say("restarting the local workers (restart " + std::to_string(attempt) + " of " +
            std::to_string(o_.max_restarts) + ")");
      rc = run_once(attempt);
      if (rc == 0 || interrupted_) break;
    }
    return rc;
  }

 private:
  // --bind-cores: rank i gets cores [i*k, (i+1)*k) of the launcher's own affinity mask.
  bool plan_core_binding() {
    cpu_set_t mine;
    CPU_ZERO(&mine);
    if (::sched_getaffinity(0, sizeof mine, &mine) != 0) {
      say(std::string("--bind-cores: sched_getaffinity: ") + std::strerror(errno));
      return false;
    }
    std::vector<int> cores;
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &mine)) cores.push_back(c);
    const int n = o_.nproc_per_node;
    const int k = o_.threads_per_rank > 0 ? o_.threads_per_rank : static_cast<int>(cores.size()) / n;
    if (k < 1 || static_cast<size_t>(n) * k > cores.size()) {
      say("--bind-cores: " + std::to_string(n) + " ranks x " + std::to_string(std::max(k, 1)) +
          " cores each need " + std::to_string(n * std::max(k, 1)) + " cores, but this launcher may use " +
          std::to_string(cores.size()));
      return false;
    }
    core_sets_.assign(n, {});
    for (int i = 0; i < n; ++i) {
      CPU_ZERO(&core_sets_[i]);
      for (int j = 0; j < k; ++j) CPU_SET(cores[i * k + j], &core_sets_[i]);
    }
    std::string desc;
    for (int i = 0; i < n; ++i) desc += (i ? ", " : "") + std::to_string(cores[i * k]) + (k > 1 ? "-" + std::to_string(cores[i * k + k - 1]) : "");
    say("binding local ranks to cores " + desc);
    return true;
  }

  int run_once(int attempt) {
    ranks_.assign(o_.nproc_per_node, Rank{});
    first_failure_ = -1;
    stopping_ = false;
    for (int i = 0; i < o_.nproc_per_node; ++i) {
      ranks_[i].local = i;
      ranks_[i].global = node_rank_ * o_.nproc_per_node + i;
      if (!spawn(ranks_[i], attempt)) {
        stop_all("could not start rank " + std::to_string(ranks_[i].global));
        first_failure_ = first_failure_ < 0 ? i : first_failure_;
        break;
      }
    }
    loop();
    // Nothing may outlive the attempt: sweep every rank's process group.
    for (auto& r : ranks_)
      if (r.pid > 0) ::kill(-r.pid, SIGKILL);
    for (auto& r : ranks_) drain(r, /*final=*/true);
    for (auto& r : ranks_) {
      if (r.out_fd >= 0) ::close(r.out_fd);
      if (r.log_fd >= 0) ::close(r.log_fd);
      if (r.beat_fd >= 0) ::close(r.beat_fd);
      r.out_fd = r.log_fd = r.beat_fd = -1;
    }
    if (first_failure_ >= 0) {
      const Rank& f = ranks_[first_failure_];
      if (f.global != 0) show_tail(f);
      else say("(rank 0's output is above)");
    }
    if (interrupted_) return 128 + interrupt_signal_;
    if (first_failure_ < 0) return 0;
    const Rank& f = ranks_[first_failure_];
    if (f.signal) return 128 + f.signal;
    return f.code ? f.code : 1;
  }

  bool spawn(Rank& r, int attempt) {
    int fds[2] = {-1, -1};
    // Rank 0 of the job keeps the terminal; every other rank is captured.
    // Under --log-dir rank 0 is captured as well, into its file and, as it
    // comes, to the launcher's stdout (its stdin stays the terminal's).
    const bool to_terminal = r.global == 0;
    const bool captured = !to_terminal || !o_.log_dir.empty();
    r.echo = to_terminal && captured;
    if (captured) {
      if (::pipe(fds) != 0) {
        say(std::string("pipe: ") + std::strerror(errno));
        return false;
      }
      set_cloexec_nonblock(fds[0], true);
    }
    if (!o_.log_dir.empty()) {
      std::string path = o_.log_dir + "/rank-" + std::to_string(r.global) + ".out";
      r.log_fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
      if (r.log_fd < 0) say("cannot open " + path + ": " + std::strerror(errno));
    }

    std::map<std::string, std::string> vars = {
        {"RANK", std::to_string(r.global)},
        {"LOCAL_RANK", std::to_string(r.local)},
        {"WORLD_SIZE", std::to_string(nnodes_ * o_.nproc_per_node)},
        {"LOCAL_WORLD_SIZE", std::to_string(o_.nproc_per_node)},
        {"GROUP_RANK", std::to_string(node_rank_)},
        {"MASTER_ADDR", master_addr_},
        {"MASTER_PORT", std::to_string(port_)},
        {"SMP_LAUNCHED", "1"},
        {"SMP_RESTART_COUNT", std::to_string(attempt)},
        {"SMP_MAX_RESTARTS", std::to_string(o_.max_restarts)},
    };
    if (o_.threads_per_rank > 0) vars["OMP_NUM_THREADS"] = std::to_string(o_.threads_per_rank);
    else if (!getenv_str("OMP_NUM_THREADS") && o_.nproc_per_node > 1) vars["OMP_NUM_THREADS"] = "1";
    for (const auto& [k, v] : round_env_) vars[k] = v;
    int beat[2] = {-1, -1};
    if (::pipe(beat) == 0) {
      set_cloexec_nonblock(beat[0], true);
      vars["SMP_HEARTBEAT_FD"] = std::to_string(beat[1]);
    }
    std::vector<std::string> env = make_env(vars);
    std::vector<std::string> args = {o_.worker};
    args.insert(args.end(), o_.worker_args.begin(), o_.worker_args.end());
    for (const std::string& set : round_sets_) args.insert(args.end(), {"--set", set});
    std::vector<char*> argv = c_array(args), envp = c_array(env);
    const pid_t parent = ::getpid();

    // Signals stay blocked across fork() until the child has dropped our
    // handlers: a SIGTERM sent to a just-forked child must not run on_signal
    // there (it would write to our self-pipe and look like the launcher's own).
    sigset_t all, old;
    sigfillset(&all);
    ::sigprocmask(SIG_BLOCK, &all, &old);
    pid_t pid = ::fork();
    if (pid < 0) {
      ::sigprocmask(SIG_SETMASK, &old, nullptr);
      say(std::string("fork: ") + std::strerror(errno));
      if (fds[0] >= 0) ::close(fds[0]), ::close(fds[1]);
      if (beat[0] >= 0) ::close(beat[0]), ::close(beat[1]);
      return false;
    }
    if (pid == 0) {
      // Child: default signals, own process group, die with the launcher.
      struct sigaction dfl {};
      dfl.sa_handler = SIG_DFL;
      sigemptyset(&dfl.sa_mask);
      for (int s : {SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGPIPE}) ::sigaction(s, &dfl, nullptr);
      ::close(g_signal_pipe[0]);
      ::close(g_signal_pipe[1]);
      ::setpgid(0, 0);
      ::sigprocmask(SIG_SETMASK, &old, nullptr);
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);
      if (!core_sets_.empty()) ::sched_setaffinity(0, sizeof(cpu_set_t), &core_sets_[r.local]);
      if (captured) {
        ::dup2(fds[1], STDOUT_FILENO);
        ::dup2(fds[1], STDERR_FILENO);
        ::close(fds[1]);
      }
      if (!to_terminal) {
        int devnull = ::open("/dev/null", O_RDONLY);
        if (devnull >= 0) ::dup2(devnull, STDIN_FILENO), ::close(devnull);
      }
      ::execvpe(argv[0], argv.data(), envp.data());
      std::string m = "smp-launch: cannot execute " + o_.worker + ": " + std::strerror(errno) + "\n";
      ssize_t ignored = ::write(STDERR_FILENO, m.data(), m.size());
      (void)ignored;
      ::_exit(127);
    }
    ::setpgid(pid, pid);  // also here, so kill(-pid) works at once
    ::sigprocmask(SIG_SETMASK, &old, nullptr);
    if (captured) {
      ::close(fds[1]);
      r.out_fd = fds[0];
    }
    if (beat[0] >= 0) {
      ::close(beat[1]);
      r.beat_fd = beat[0];
      r.last_beat = Clock::now();
    }
    r.pid = pid;
    r.running = true;
    return true;
  }

  int live() const {
    int n = 0;
    for (const auto& r : ranks_) n += r.running;
    return n;
  }

  void loop() {
    while (live() > 0 || any_pipe_open()) {
      if (live() == 0) {
        // Every rank is gone; read what is left (grandchildren may hold the pipe).
        break;
      }
      std::vector<pollfd> pfds;
      pfds.push_back({g_signal_pipe[0], POLLIN, 0});
      std::vector<Rank*> owners;
      for (auto& r : ranks_)
        if (r.out_fd >= 0) {
          pfds.push_back({r.out_fd, POLLIN, 0});
          owners.push_back(&r);
        }
      const size_t beats_from = pfds.size();
      std::vector<Rank*> beaters;
      for (auto& r : ranks_)
        if (r.beat_fd >= 0) {
          pfds.push_back({r.beat_fd, POLLIN, 0});
          beaters.push_back(&r);
        }
      const size_t rdzv_at = pfds.size();
      if (client_) pfds.push_back({client_->fd(), POLLIN, 0});
      int timeout_ms = 500;
      if (stopping_) {
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(kill_deadline_ - Clock::now()).count();
        timeout_ms = static_cast<int>(std::max<long long>(0, std::min<long long>(left, 500)));
      }
      int n = ::poll(pfds.data(), pfds.size(), timeout_ms);
      if (n < 0 && errno != EINTR) {
        say(std::string("poll: ") + std::strerror(errno));
        break;
      }
      if (n > 0) {
        if (pfds[0].revents & POLLIN) handle_signals();
        for (size_t i = 1; i < beats_from; ++i)
          if (pfds[i].revents & (POLLIN | POLLHUP | POLLERR)) drain(*owners[i - 1], false);
        for (size_t i = beats_from; i < rdzv_at; ++i)
          if (pfds[i].revents & (POLLIN | POLLHUP | POLLERR)) read_beats(*beaters[i - beats_from]);
      }
      if (client_) hear_rendezvous();
      reap();
      check_progress();
      if (stopping_ && !killed_ && Clock::now() >= kill_deadline_ && live() > 0) {
        std::string who;
        for (const auto& r : ranks_)
          if (r.running) who += (who.empty() ? "" : ", ") + std::to_string(r.global);
        say("ranks " + who + " still running " + fmt_seconds(o_.kill_timeout_s) + " after SIGTERM: sending SIGKILL");
        for (auto& r : ranks_)
          if (r.running) ::kill(-r.pid, SIGKILL);
        killed_ = true;
      }
    }
  }

  // "timeout <s>" and "beat" lines from a worker's heartbeat pipe.
  void read_beats(Rank& r) {
    char buf[4096];
    while (true) {
      const ssize_t n = ::read(r.beat_fd, buf, sizeof buf);
      if (n > 0) {
        r.beat_partial.append(buf, static_cast<size_t>(n));
        size_t nl;
        while ((nl = r.beat_partial.find('\n')) != std::string::npos) {
          const std::string line = r.beat_partial.substr(0, nl);
          r.beat_partial.erase(0, nl + 1);
          if (line.rfind("timeout ", 0) == 0) r.hang_timeout_s = std::atof(line.c_str() + 8);
          if (line.rfind("step ", 0) == 0) on_step(std::atoll(line.c_str() + 5));
          if (line.rfind("committed ", 0) == 0) on_committed(std::atoll(line.c_str() + 10));
          r.last_beat = Clock::now();
        }
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n == 0) {  // the worker closed it (exiting): no more checks
        ::close(r.beat_fd);
        r.beat_fd = -1;
        r.hang_timeout_s = 0;
      }
      return;
    }
  }

  // A rank silent for longer than its run.hang_timeout_s has hung: it fails the
  // group like a rank that died (a restart if allowed). Its peers, waiting on
  // it in a collective, go silent too: all silent ranks are named, the one
  // silent longest first, and its last lines are shown.
  void check_progress() {
    if (stopping_) return;
    std::vector<std::pair<double, size_t>> silent;  // seconds, rank index
    for (size_t i = 0; i < ranks_.size(); ++i) {
      const Rank& r = ranks_[i];
      if (!r.running || r.hang_timeout_s <= 0) continue;
      const double s = std::chrono::duration<double>(Clock::now() - r.last_beat).count();
      if (s > r.hang_timeout_s) silent.emplace_back(s, i);
    }
    if (silent.empty()) return;
    std::sort(silent.rbegin(), silent.rend());
    std::string who;
    for (const auto& [s, i] : silent)
      who += (who.empty() ? "" : ", ") + std::string("rank ") + std::to_string(ranks_[i].global) + " (pid " +
             std::to_string(ranks_[i].pid) + ")";
    const Rank& first = ranks_[silent.front().second];
    if (first_failure_ < 0) first_failure_ = static_cast<int>(silent.front().second);
    stop_all(who + " made no progress for " + fmt_seconds(std::floor(silent.front().first)) +
             " (run.hang_timeout_s = " + fmt_seconds(first.hang_timeout_s) + "): treating the job as failed");
  }

  bool any_pipe_open() const {
    for (const auto& r : ranks_)
      if (r.out_fd >= 0) return true;
    return false;
  }

  static std::string fmt_seconds(double s) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%gs", s);
    return buf;
  }

  void handle_signals() {
    unsigned char buf[64];
    ssize_t n;
    while ((n = ::read(g_signal_pipe[0], buf, sizeof(buf))) > 0) {
      for (ssize_t i = 0; i < n; ++i) {
        int sig = buf[i];
        if (sig == SIGCHLD) continue;  // reap() runs after every wakeup
        if (!interrupted_) {
          interrupted_ = true;
          interrupt_signal_ = sig;
          say("received " + signal_name(sig) + ": forwarding it to the workers");
          for (auto& r : ranks_)
            if (r.running) ::kill(-r.pid, sig);
          begin_stop();
        } else {
          say("received " + signal_name(sig) + " again: killing the workers");
          for (auto& r : ranks_)
            if (r.running) ::kill(-r.pid, SIGKILL);
          killed_ = true;
        }
      }
    }
  }

  void begin_stop() {
    if (stopping_) return;
    stopping_ = true;
    killed_ = false;
    kill_deadline_ = Clock::now() + std::chrono::milliseconds(static_cast<long long>(o_.kill_timeout_s * 1000));
  }

  void stop_all(const std::string& why) {
    if (stopping_) return;
    int n = live();
    if (n > 0) say(why + ": stopping the other " + std::to_string(n) + " rank(s) (SIGTERM, SIGKILL after " +
                   fmt_seconds(o_.kill_timeout_s) + ")");
    for (auto& r : ranks_)
      if (r.running) ::kill(-r.pid, SIGTERM);
    begin_stop();
  }

  void reap() {
    while (true) {
      int status = 0;
      pid_t pid = ::waitpid(-1, &status, WNOHANG);
      if (pid <= 0) break;
      for (size_t i = 0; i < ranks_.size(); ++i) {
        Rank& r = ranks_[i];
        if (r.pid != pid || !r.running) continue;
        r.running = false;
        r.exited = true;
        if (WIFEXITED(status)) r.code = WEXITSTATUS(status);
        if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
        const bool failed = r.code != 0 || r.signal != 0;
        const std::string who = "rank " + std::to_string(r.global) + " (pid " + std::to_string(pid) + ")";
        if (!failed) break;
        const std::string how =
            r.signal ? "was killed by signal " + signal_name(r.signal) : "exited with code " + std::to_string(r.code);
        if (!stopping_) {
          say(who + " " + how);
          if (first_failure_ < 0) first_failure_ = static_cast<int>(i);
          stop_all("rank " + std::to_string(r.global) + " failed");
        } else if (r.signal == SIGTERM || r.signal == SIGKILL || (interrupted_ && r.signal == interrupt_signal_)) {
          say(who + " stopped (" + signal_name(r.signal) + ")");
        } else {
          say(who + " " + how + " (while stopping)");
        }
        break;
      }
    }
  }

  // Reads what is available from a rank's pipe into its ring buffer / log file.
  void drain(Rank& r, bool final) {
    if (r.out_fd < 0) return;
    char buf[65536];
    while (true) {
      ssize_t n = ::read(r.out_fd, buf, sizeof(buf));
      if (n > 0) {
        if (r.log_fd >= 0) {
          ssize_t ignored = ::write(r.log_fd, buf, static_cast<size_t>(n));
          (void)ignored;
        }
        if (r.echo) {
          ssize_t ignored = ::write(STDOUT_FILENO, buf, static_cast<size_t>(n));
          (void)ignored;
        }
        r.partial.append(buf, static_cast<size_t>(n));
        size_t start = 0, nl;
        while ((nl = r.partial.find('\n', start)) != std::string::npos) {
          add_line(r, r.partial.substr(start, nl - start));
          start = nl + 1;
        }
        r.partial.erase(0, start);
        if (r.partial.size() > 65536) {
          add_line(r, r.partial);
          r.partial.clear();
        }
        continue;
      }
      if (n == 0) {  // EOF
        if (!r.partial.empty()) add_line(r, r.partial), r.partial.clear();
        ::close(r.out_fd);
        r.out_fd = -1;
        return;
      }
      if (errno == EINTR) continue;
      if (final && !r.partial.empty()) add_line(r, r.partial), r.partial.clear();
      return;  // EAGAIN
    }
  }

  void add_line(Rank& r, const std::string& line) {
    if (o_.tee && !r.echo) {  // rank 0's lines are shown as they are
      std::string s = "[rank " + std::to_string(r.global) + "] " + line + "\n";
      ssize_t ignored = ::write(STDOUT_FILENO, s.data(), s.size());
      (void)ignored;
    }
    r.lines.push_back(line);
    if (r.lines.size() > kKeepLines) r.lines.pop_front();
  }

  void show_tail(const Rank& r) {
    if (r.lines.empty()) {
      say("rank " + std::to_string(r.global) + " printed nothing");
      return;
    }
    size_t from = r.lines.size() > kShowLines ? r.lines.size() - kShowLines : 0;
    std::string out = "smp-launch: last " + std::to_string(r.lines.size() - from) + " line(s) of rank " +
                      std::to_string(r.global) + (o_.log_dir.empty() ? "" : " (all in " + o_.log_dir + "/rank-" +
                                                                                std::to_string(r.global) + ".out)") +
                      ":\n";
    for (size_t i = from; i < r.lines.size(); ++i) out += "  [rank " + std::to_string(r.global) + "] " + r.lines[i] + "\n";
    ssize_t ignored = ::write(STDERR_FILENO, out.data(), out.size());
    (void)ignored;
  }

  // ---- elastic runs ----

  static double unix_now() {
    timespec ts{};
    ::clock_gettime(CLOCK_REALTIME, &ts);
    return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
  }

  // What the rendezvous said while the workers ran.
  void hear_rendezvous() {
    try {
      // What waited (a stop read with this round's start), then what came;
      // read before the silence is judged: pings may wait in the socket.
      std::vector<rdzv::Message> arrived(std::make_move_iterator(inbox_.begin()), std::make_move_iterator(inbox_.end()));
      inbox_.clear();
      for (rdzv::Message& m : client_->receive()) arrived.push_back(std::move(m));
      client_->tick();
      for (rdzv::Message& m : arrived) {
        if (m.type == "round") {  // for the next round (this one is ending)
          inbox_.push_back(std::move(m));
          continue;
        }
        if (m.type == "stop" && m.round != round_) continue;  // an earlier round's, which this node left
        if (m.type == "stop") {
          rdzv_stopped_ = true;
          if (noticed_unix_ < 0) noticed_unix_ = unix_now();
          if (!stopping_ && live() == 0) continue;
          say("the job re-forms: " + m.why);
          stop_all("round " + std::to_string(round_) + " stops");
        } else if (m.type == "refuse") {
          refused_ = m.why;
          stop_all("the rendezvous ended the job: " + m.why);
        }
      }
    } catch (const rdzv::Lost& e) {
      rdzv_lost_ = e.what();
      client_.reset();
      stop_all(rdzv_lost_);
    }
  }

  // A rank's "step N": the first of a round says how long the change took.
  void on_step(long long step) {
    if (!o_.elastic || first_step_seen_) return;
    first_step_seen_ = true;
    if (history_.empty() || history_.back()["round"] != round_) return;
    nlohmann::json& entry = history_.back();
    entry["resumed_step"] = step - 1;
    entry["first_step_seconds"] = unix_now() - entry["noticed_unix"].get<double>();
    char secs[32];
    std::snprintf(secs, sizeof secs, "%.2f", entry["first_step_seconds"].get<double>());
    say("elastic: round " + std::to_string(round_) + " (world " + std::to_string(entry["previous_world"].get<int>()) +
        " -> " + std::to_string(entry["world"].get<int>()) + "): first step (step " + std::to_string(step) + ") " +
        secs + " s after the change was noticed, resumed at step " + std::to_string(step - 1));
  }

  // Rank 0 committed a checkpoint: the rendezvous admits waiting nodes there.
  void on_committed(long long step) {
    if (!client_ || stopping_) return;
    rdzv::Message m;
    m.type = "committed";
    m.step = step;
    try {
      client_->send(m);
    } catch (const rdzv::Lost& e) {
      rdzv_lost_ = e.what();
      client_.reset();
      stop_all(rdzv_lost_);
    }
  }

  // Waits for the rendezvous's next word (ping and keepalive meanwhile), or a signal.
  std::optional<rdzv::Message> next_message() {
    while (true) {
      // One message at a time, in order: a round and the stop that follows
      // it may come in one read.
      if (!inbox_.empty()) {
        rdzv::Message m = std::move(inbox_.front());
        inbox_.pop_front();
        return m;
      }
      std::vector<pollfd> pfds{{g_signal_pipe[0], POLLIN, 0}, {client_->fd(), POLLIN, 0}};
      const int n = ::poll(pfds.data(), pfds.size(), 250);
      if (n > 0 && (pfds[0].revents & POLLIN)) {
        unsigned char buf[64];
        ssize_t got;
        while ((got = ::read(g_signal_pipe[0], buf, sizeof buf)) > 0)
          for (ssize_t i = 0; i < got; ++i)
            if (buf[i] != SIGCHLD) {
              interrupted_ = true;
              interrupt_signal_ = buf[i];
              say("received " + signal_name(buf[i]) + " while between rounds: leaving the job");
              return std::nullopt;
            }
        while (::waitpid(-1, nullptr, WNOHANG) > 0) {
        }
      }
      for (rdzv::Message& m : client_->receive()) inbox_.push_back(std::move(m));
      client_->tick();
    }
  }

  int ready_port() {
    const int p = free_port_or_none(client_->local_address());
    if (p <= 0) throw rdzv::Lost("could not find a free port on " + client_->local_address());
    return p;
  }

  // The job's end for this node; the launcher that serves the rendezvous
  // serves it until the job ends, though this node has left it.
  int run_elastic() {
    const int rc = join_elastic();
    // Told to leave (its workers failed too often) while the job goes on
    // elsewhere: serve on. Any other end of this launcher ends its rendezvous.
    if (server_pid_ > 0 && told_to_leave_ && !interrupted_) {
      if (::waitpid(server_pid_, nullptr, WNOHANG) == 0) {
        say("this node left the job; serving its rendezvous until the job ends");
        while (::waitpid(server_pid_, nullptr, 0) < 0 && errno == EINTR) {
        }
      }
    } else if (server_pid_ > 0) {
      ::kill(server_pid_, SIGTERM);
    }
    return rc;
  }

  int join_elastic() {
    const auto [host, rport] = rdzv::parse_endpoint(o_.rdzv_endpoint);
    // The launcher that can bind the endpoint serves the rendezvous, in a
    // process of its own that dies with this one (as torchrun's agent hosts
    // its c10d store); the others are its clients only.
    std::string bind_error;
    bool in_use = false;
    const int listen_fd = rdzv::listen_on(host, rport, &bind_error, &in_use);
    if (listen_fd >= 0) {
      const pid_t parent = ::getpid();
      const pid_t pid = ::fork();
      if (pid == 0) {
        // The launcher's handlers write to its self-pipe: none of them here.
        struct sigaction dfl {};
        dfl.sa_handler = SIG_DFL;
        sigemptyset(&dfl.sa_mask);
        for (int sig : {SIGCHLD, SIGINT, SIGTERM, SIGHUP}) ::sigaction(sig, &dfl, nullptr);
        ::prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (::getppid() != parent) ::_exit(1);
        ::close(g_signal_pipe[0]);
        ::close(g_signal_pipe[1]);
        ::_exit(rdzv::serve(listen_fd, membership_options()));
      }
      ::close(listen_fd);
      if (pid < 0) {
        say(std::string("fork: ") + std::strerror(errno));
        return 1;
      }
      say("serving the rendezvous on " + o_.rdzv_endpoint + " (pid " + std::to_string(pid) + ")");
      server_pid_ = pid;
    } else if (!in_use) {
      say("--rdzv-endpoint " + o_.rdzv_endpoint + ": " + bind_error);
      return 2;
    }
    client_ = std::make_unique<rdzv::Client>(host, rport, o_.rdzv_keepalive_s);
    char hostname[256] = "node";
    ::gethostname(hostname, sizeof hostname - 1);
    const std::string name = (o_.node_name.empty() ? std::string(hostname) : o_.node_name).substr(0, rdzv::kMaxName - 8);
    try {
      client_->connect(o_.rdzv_timeout_s);
      rdzv::Message hello;
      hello.type = "hello";
      hello.name = name;
      hello.nproc = o_.nproc_per_node;
      hello.port = ready_port();
      hello.min_nodes = o_.min_nodes;
      hello.max_nodes = o_.max_nodes;
      hello.max_restarts = o_.max_restarts;
      hello.grow_now = o_.grow_now;
      hello.job = job_digest(o_.worker_args);
      client_->send(hello);
      say(name + " joined the rendezvous at " + o_.rdzv_endpoint + " (--nnodes " + std::to_string(o_.min_nodes) + ":" +
          std::to_string(o_.max_nodes) + ")");
      while (true) {
        const std::optional<rdzv::Message> m = next_message();
        if (!m) return 128 + interrupt_signal_;
        if (m->type == "refuse") {
          say("the rendezvous ended the job: " + m->why);
          told_to_leave_ = true;
          return 1;
        }
        if (m->type == "finish") return 0;
        if (m->type == "stop") {
          // This node's workers finished the job while another's failed: it
          // is ready at once. A stop for a round this node already left
          // (its workers failed, it said ready) is the one it caused.
          if (m->round != done_round_) continue;
          done_round_ = -1;
          rdzv::Message ready;
          ready.type = "ready";
          ready.port = ready_port();
          client_->send(ready);
          continue;
        }
        if (m->type != "round") continue;
        const int rc = run_round(*m);
        if (rc >= 0) return rc;
      }
    } catch (const rdzv::Lost& e) {
      say(std::string(e.what()) + ": the rendezvous is the job's single point of failure (--rdzv-endpoint " +
          o_.rdzv_endpoint + ")");
      return 1;
    }
  }

  // One round: the workers of this node for the world the rendezvous formed.
  // Returns the launcher's exit code when the job ends here, else -1 (the
  // next round follows).
  int run_round(const rdzv::Message& m) {
    const int previous_world = m.previous_world;  // the rendezvous's word: a node that just joined has none
    round_ = m.round;
    nnodes_ = m.nnodes;
    node_rank_ = m.node_rank;
    master_addr_ = m.master_addr;
    port_ = m.port;
    std::vector<std::string> layout;
    try {
      layout = elastic_layout(m.world, o_.worker_args);
    } catch (const std::exception& e) {
      say("round " + std::to_string(m.round) + ", " + std::to_string(m.world) + " ranks on " +
          std::to_string(m.nnodes) + " nodes: " + e.what());
      return 2;
    }
    round_sets_ = layout;
    // Every round after the first continues from the last committed
    // checkpoint (or memory snapshot), never from nothing nor from a folder
    // the job named for its start: one without a checkpoint is refused there,
    // by name, on every node alike.
    if (m.round > 0) round_sets_.push_back("run.resume=\"latest\"");
    std::string desc;
    for (const auto& set : layout) desc += " " + set;
    say("round " + std::to_string(m.round) + ": node " + std::to_string(m.node_rank) + " of " +
        std::to_string(m.nnodes) + ", world " + std::to_string(m.world) +
        (m.round > 0 ? " (was " + std::to_string(previous_world) + ")" : "") + ", layout" +
        (desc.empty() ? " as the job gives it" : desc) + (m.round > 0 ? "; " + m.reason : ""));
    if (m.round > 0) {
      nlohmann::json entry = {{"round", m.round},   {"reason", m.reason}, {"previous_world", previous_world},
                              {"world", m.world},   {"nodes", m.members}, {"layout", layout},
                              {"noticed_unix", noticed_unix_ >= 0 ? noticed_unix_ : unix_now()}};
      history_.push_back(entry);
    }
    // Bounded as the worker reads it (64 KiB): the oldest entries go first.
    while (history_.size() > 1 && nlohmann::json(history_).dump().size() > 60000) history_.erase(history_.begin());
    round_env_ = {{"SMP_RESTART_COUNT", std::to_string(m.round)},
                  {"SMP_NODE_NAME", m.name},  // as the rendezvous knows it: names its memory snapshots
                  {"SMP_ELASTIC", nlohmann::json({{"round", m.round}, {"reformations", history_}}).dump()}};
    noticed_unix_ = -1;
    first_step_seen_ = false;
    rdzv_stopped_ = false;
    refused_.clear();
    const int rc = run_once(m.round);
    if (!client_) {  // the rendezvous was lost while the workers ran
      say(rdzv_lost_ + ": the rendezvous is the job's single point of failure (--rdzv-endpoint " + o_.rdzv_endpoint +
          ")");
      return 1;
    }
    if (!refused_.empty()) {
      told_to_leave_ = true;
      return 1;
    }
    if (interrupted_) return rc;
    rdzv::Message reply;
    if (rc == 0 && !rdzv_stopped_) {
      reply.type = "done";
      reply.round = m.round;
      client_->send(reply);
      done_round_ = m.round;
      return -1;  // "finish" (or a stop, if another node failed at the end) follows
    }
    if (!rdzv_stopped_) {  // this node's workers failed
      if (noticed_unix_ < 0) noticed_unix_ = unix_now();
      reply.type = "failed";
      reply.round = m.round;
      reply.why = first_failure_ >= 0 ? "rank " + std::to_string(ranks_[first_failure_].global) + " failed" : "";
      client_->send(reply);
    }
    reply = rdzv::Message{};
    reply.type = "ready";
    reply.port = ready_port();
    client_->send(reply);
    return -1;
  }

  rdzv::MembershipOptions membership_options() const {
    rdzv::MembershipOptions m;
    m.min_nodes = o_.min_nodes, m.max_nodes = o_.max_nodes;
    m.settle_s = o_.rdzv_settle_s, m.join_timeout_s = o_.rdzv_timeout_s, m.keepalive_s = o_.rdzv_keepalive_s;
    m.max_restarts = o_.max_restarts, m.grow_now = o_.grow_now;
    return m;
  }

  const LaunchOptions& o_;
  int nnodes_ = 1, node_rank_ = 0;  // this round's
  std::string master_addr_;
  std::vector<std::string> round_sets_;            // --set lines added for this round's layout
  std::map<std::string, std::string> round_env_;   // variables added for this round
  std::unique_ptr<rdzv::Client> client_;
  std::deque<rdzv::Message> inbox_;
  pid_t server_pid_ = -1;  // the rendezvous this launcher serves, if it does
  bool told_to_leave_ = false;  // the rendezvous refused this node (the job may go on without it)  // what the rendezvous said that is yet to be acted on
  int round_ = 0, done_round_ = -1;
  bool rdzv_stopped_ = false, first_step_seen_ = false;
  double noticed_unix_ = -1;  // when this node learned the running round must end
  std::string refused_, rdzv_lost_;
  std::vector<nlohmann::json> history_;  // the re-formations so far (SMP_ELASTIC)
  int port_ = 0;
  std::vector<Rank> ranks_;
  std::vector<cpu_set_t> core_sets_;  // per local rank, with --bind-cores
  int first_failure_ = -1;
  bool stopping_ = false, killed_ = false;
  bool interrupted_ = false;
  int interrupt_signal_ = 0;
  Clock::time_point kill_deadline_;
};

}  // namespace

int supervise(const LaunchOptions& options) { return Supervisor(options).run(); }

int serve_rendezvous(const LaunchOptions& o) {
  try {
    const auto [host, port] = rdzv::parse_endpoint(o.rdzv_endpoint);
    std::string error;
    bool in_use = false;
    const int fd = rdzv::listen_on(host, port, &error, &in_use);
    if (fd < 0) {
      say("--rdzv-server: " + error);
      return 1;
    }
    rdzv::MembershipOptions m;
    m.min_nodes = o.min_nodes, m.max_nodes = o.max_nodes;
    m.settle_s = o.rdzv_settle_s, m.join_timeout_s = o.rdzv_timeout_s, m.keepalive_s = o.rdzv_keepalive_s;
    m.max_restarts = o.max_restarts, m.grow_now = o.grow_now;
    say("serving the rendezvous on " + o.rdzv_endpoint + " for --nnodes " + std::to_string(o.min_nodes) + ":" +
        std::to_string(o.max_nodes));
    return rdzv::serve(fd, m);
  } catch (const std::exception& e) {
    say(e.what());
    return 2;
  }
}

std::string external_launcher() {
  if (getenv_str("SMP_LAUNCHED")) return "";
  if (getenv_str("SLURM_PROCID") && getenv_str("SLURM_NTASKS")) return "slurm";
  if (getenv_str("OMPI_COMM_WORLD_RANK") && getenv_str("OMPI_COMM_WORLD_SIZE")) return "mpi";
  return "";
}

int exec_under_external(const LaunchOptions& o, const std::string& which) {
  // Command-line master address/port win over the environment; the rest is
  // the worker's own reading of Slurm / Open MPI (core/src/base/process_env.cpp).
  if (o.master_addr_given) ::setenv("MASTER_ADDR", o.master_addr.c_str(), 1);
  if (o.master_port_given && o.master_port > 0) ::setenv("MASTER_PORT", std::to_string(o.master_port).c_str(), 1);
  smp::ProcessEnv e;
  try {
    e = which == "slurm" ? smp::ProcessEnv::from_slurm() : smp::ProcessEnv::from_open_mpi();
  } catch (const std::exception& err) {
    say(std::string("running under ") + which + ": " + err.what() + " (or give --master-addr / --master-port)");
    return 2;
  }
  std::map<std::string, std::string> vars = {
      {"RANK", std::to_string(e.rank)},
      {"WORLD_SIZE", std::to_string(e.world_size)},
      {"LOCAL_RANK", std::to_string(e.local_rank)},
      {"LOCAL_WORLD_SIZE", std::to_string(e.local_world_size)},
      {"MASTER_ADDR", e.master_addr},
      {"MASTER_PORT", std::to_string(e.master_port)},
      {"SMP_LAUNCHED", "1"},
      {"SMP_LAUNCH_SOURCE", which}};
  if (o.threads_per_rank > 0) vars["OMP_NUM_THREADS"] = std::to_string(o.threads_per_rank);
  else if (!getenv_str("OMP_NUM_THREADS") && e.local_world_size > 1) vars["OMP_NUM_THREADS"] = "1";
  if (e.rank == 0)
    say("running under " + which + " (" + std::to_string(e.world_size) +
        " tasks): executing the worker directly as each task's rank (--nproc-per-node/--nnodes are ignored)");
  std::vector<std::string> env = make_env(vars);
  std::vector<std::string> args = {o.worker};
  args.insert(args.end(), o.worker_args.begin(), o.worker_args.end());
  std::vector<char*> argv = c_array(args), envp = c_array(env);
  ::execvpe(argv[0], argv.data(), envp.data());
  say("cannot execute " + o.worker + ": " + std::strerror(errno));
  return 127;
}

std::string default_worker_path() {
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "smp-worker";
  std::string self(buf, static_cast<size_t>(n));
  auto slash = self.rfind('/');
  return (slash == std::string::npos ? std::string(".") : self.substr(0, slash)) + "/smp-worker";
}

}  // namespace smp::launch
