// Test helpers: run smp-launch as a real child process, capture its output.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace smp_test {

// Variables that would make smp-launch think it runs under srun/mpirun or is a worker.
inline const std::vector<std::string>& launcher_vars() {
  static const std::vector<std::string> v = {
      "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_JOB_ID", "SLURM_NTASKS_PER_NODE",
      "SLURM_TASKS_PER_NODE", "SLURM_LAUNCH_NODE_IPADDR", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
      "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", "RANK", "WORLD_SIZE", "LOCAL_RANK",
      "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "SMP_LAUNCHED", "OMP_NUM_THREADS", "SMP_RESTART_COUNT"};
  return v;
}

inline int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa));
  socklen_t len = sizeof(sa);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  ::close(fd);
  return ntohs(sa.sin_port);
}

inline std::string temp_dir(const std::string& tag) {
  std::string tmpl = (std::getenv("TMPDIR") ? std::string(std::getenv("TMPDIR")) : std::string("/tmp")) +
                     "/smp-rt-" + tag + "-XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  char* d = ::mkdtemp(buf.data());
  return d ? std::string(d) : std::string("/tmp");
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct Child {
  pid_t pid = -1;
  std::string out_path;
  std::chrono::steady_clock::time_point start;
};

struct Result {
  int exit_code = -1;  // -1 when killed by a signal
  int signal = 0;
  bool timed_out = false;
  double seconds = 0;
  std::string output;
};

// Starts argv with stdout+stderr to a file, in its own process group, with the
// launcher variables removed from the environment and `env` added.
inline Child start(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env = {}) {
  Child c;
  static int counter = 0;
  c.out_path = temp_dir("out") + "/output-" + std::to_string(++counter) + ".txt";
  c.start = std::chrono::steady_clock::now();
  c.pid = ::fork();
  if (c.pid == 0) {
    ::setpgid(0, 0);
    int fd = ::open(c.out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    for (const auto& k : launcher_vars()) ::unsetenv(k.c_str());
    for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    std::perror("execv");
    ::_exit(127);
  }
  return c;
}

// Waits up to timeout_s; kills the child's process group on timeout.
inline Result wait(const Child& c, double timeout_s) {
  Result r;
  int status = 0;
  const auto deadline = c.start + std::chrono::milliseconds(static_cast<long>(timeout_s * 1000));
  while (true) {
    pid_t p = ::waitpid(c.pid, &status, WNOHANG);
    if (p == c.pid) break;
    if (std::chrono::steady_clock::now() > deadline) {
      r.timed_out = true;
      ::kill(-c.pid, SIGKILL);
      ::kill(c.pid, SIGKILL);
      ::waitpid(c.pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - c.start).count();
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
  r.output = read_file(c.out_path);
  return r;
}

inline Result run(const std::vector<std::string>& argv, double timeout_s,
                  const std::map<std::string, std::string>& env = {}) {
  return wait(start(argv, env), timeout_s);
}

inline bool process_gone(pid_t pid) { return ::kill(pid, 0) != 0 && errno == ESRCH; }

inline bool contains(const std::string& hay, const std::string& needle) {
  return hay.find(needle) != std::string::npos;
}

#ifdef SMP_BIN_DIR
// smp-launch running `worker` with `worker_args` on nproc ranks of one node,
// on a port that was free a moment ago (a caller retries when another program
// took it meanwhile: "Address already in use" in the output).
inline Result smp_launch(int nproc, const std::string& worker, const std::vector<std::string>& worker_args,
                         double timeout_s = 600) {
  std::vector<std::string> argv = {std::string(SMP_BIN_DIR) + "/smp-launch", "--nproc-per-node", std::to_string(nproc),
                                   "--master-port", std::to_string(free_port()), "--worker", worker, "--"};
  argv.insert(argv.end(), worker_args.begin(), worker_args.end());
  return run(argv, timeout_s);
}
#endif

#if defined(SMP_LAUNCH_BIN) && defined(SMP_COMM_WORKER)
// smp-launch running the comm test worker on one node: its own options
// (launcher_args) first, then what goes to every worker.
inline std::vector<std::string> launch_comm_worker(int nproc, int port, const std::vector<std::string>& worker_args,
                                                   const std::vector<std::string>& launcher_args = {}) {
  std::vector<std::string> argv = {SMP_LAUNCH_BIN, "--nproc-per-node", std::to_string(nproc), "--master-port",
                                   std::to_string(port), "--worker", SMP_COMM_WORKER};
  argv.insert(argv.end(), launcher_args.begin(), launcher_args.end());
  argv.insert(argv.end(), worker_args.begin(), worker_args.end());
  return argv;
}
#endif

}  // namespace smp_test
