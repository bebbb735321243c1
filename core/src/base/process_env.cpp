// ProcessEnv: rank, world and master from smp-launch, SLURM or Open MPI variables.
// No LibTorch: smp-launch compiles this file too, so the launcher and the
// worker read Slurm and Open MPI the same way.
#include <smp/error.h>
#include <smp/process_env.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

namespace smp {

namespace {

std::optional<std::string> env(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return std::nullopt;
  return std::string(v);
}

int env_int(const char* name, int min_value) {
  auto v = env(name);
  if (!v) throw Error(std::string("environment: ") + name + " is not set");
  char* end = nullptr;
  errno = 0;
  long x = std::strtol(v->c_str(), &end, 10);
  if (errno || end == v->c_str() || *end != '\0' || x < min_value || x > 1 << 30)
    throw Error(std::string("environment: ") + name + "=\"" + *v + "\" is not an integer >= " +
                std::to_string(min_value));
  return static_cast<int>(x);
}

int env_int_or(const char* name, int min_value, int fallback) {
  return env(name) ? env_int(name, min_value) : fallback;
}

// SLURM_TASKS_PER_NODE looks like "4(x2),3": the first count is this job's
// tasks per node on homogeneous allocations.
int leading_int(const std::string& s, int fallback) {
  char* end = nullptr;
  long x = std::strtol(s.c_str(), &end, 10);
  return end == s.c_str() || x < 1 ? fallback : static_cast<int>(x);
}

void check(const ProcessEnv& e, const char* rank_var, const char* world_var) {
  if (e.rank >= e.world_size)
    throw Error(std::string("environment: ") + rank_var + "=" + std::to_string(e.rank) + " is not below " +
                world_var + "=" + std::to_string(e.world_size));
  if (e.local_rank >= e.local_world_size && e.local_world_size > 0)
    throw Error("environment: local rank " + std::to_string(e.local_rank) + " is not below the local world size " +
                std::to_string(e.local_world_size));
  if (e.master_port < 1 || e.master_port > 65535)
    throw Error("environment: MASTER_PORT=" + std::to_string(e.master_port) + " is not a TCP port (1..65535)");
}

}  // namespace

int find_free_port(const std::string& addr) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw Error(std::string("find_free_port: socket: ") + std::strerror(errno));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = 0;
  if (::inet_pton(AF_INET, addr.c_str(), &sa.sin_addr) != 1) sa.sin_addr.s_addr = htonl(INADDR_ANY);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
    int err = errno;
    ::close(fd);
    throw Error("find_free_port: bind " + addr + ":0: " + std::strerror(err));
  }
  socklen_t len = sizeof(sa);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  ::close(fd);
  return ntohs(sa.sin_port);
}

ProcessEnv ProcessEnv::from_environment() {
  ProcessEnv e;
  if (env("RANK")) {
    e.source = env("SMP_LAUNCHED") ? "smp-launch" : "env";
    e.rank = env_int("RANK", 0);
    e.world_size = env_int("WORLD_SIZE", 1);
    e.local_rank = env_int_or("LOCAL_RANK", 0, e.rank);
    e.local_world_size = env_int_or("LOCAL_WORLD_SIZE", 1, e.world_size);
    e.master_addr = env("MASTER_ADDR").value_or("127.0.0.1");
    e.master_port = env_int_or("MASTER_PORT", 1, 29500);
    check(e, "RANK", "WORLD_SIZE");
    return e;
  }
  if (env("SLURM_PROCID") && env("SLURM_NTASKS")) return from_slurm();
  if (env("OMPI_COMM_WORLD_RANK") && env("OMPI_COMM_WORLD_SIZE")) return from_open_mpi();
  e.source = "single";
  e.master_addr = env("MASTER_ADDR").value_or("127.0.0.1");
  e.master_port = env("MASTER_PORT") ? env_int("MASTER_PORT", 1) : find_free_port(e.master_addr);
  return e;
}

ProcessEnv ProcessEnv::from_slurm() {
  ProcessEnv e;
  e.source = "slurm";
  e.rank = env_int("SLURM_PROCID", 0);
  e.world_size = env_int("SLURM_NTASKS", 1);
  e.local_rank = env_int_or("SLURM_LOCALID", 0, 0);
  if (auto v = env("SLURM_NTASKS_PER_NODE")) e.local_world_size = leading_int(*v, 1);
  else if (auto t = env("SLURM_TASKS_PER_NODE")) e.local_world_size = leading_int(*t, 1);
  else e.local_world_size = e.world_size;
  if (auto a = env("MASTER_ADDR")) e.master_addr = *a;
  else if (auto a2 = env("SLURM_LAUNCH_NODE_IPADDR")) e.master_addr = *a2;
  else if (e.world_size == e.local_world_size) e.master_addr = "127.0.0.1";
  else throw Error("environment: under SLURM with several nodes, set MASTER_ADDR (SLURM_LAUNCH_NODE_IPADDR is not set)");
  // Every task of the job derives the same port from the job id.
  int derived = 29500;
  if (auto j = env("SLURM_JOB_ID")) derived = 20000 + static_cast<int>(std::strtoul(j->c_str(), nullptr, 10) % 20000);
  e.master_port = env_int_or("MASTER_PORT", 1, derived);
  check(e, "SLURM_PROCID", "SLURM_NTASKS");
  return e;
}

ProcessEnv ProcessEnv::from_open_mpi() {
  ProcessEnv e;
  e.source = "mpi";
  e.rank = env_int("OMPI_COMM_WORLD_RANK", 0);
  e.world_size = env_int("OMPI_COMM_WORLD_SIZE", 1);
  e.local_rank = env_int_or("OMPI_COMM_WORLD_LOCAL_RANK", 0, 0);
  e.local_world_size = env_int_or("OMPI_COMM_WORLD_LOCAL_SIZE", 1, e.world_size);
  if (auto a = env("MASTER_ADDR")) e.master_addr = *a;
  else if (e.world_size == e.local_world_size) e.master_addr = "127.0.0.1";
  else throw Error("environment: under mpirun with several nodes, set MASTER_ADDR (e.g. mpirun -x MASTER_ADDR=host)");
  e.master_port = env_int_or("MASTER_PORT", 1, 29500);
  check(e, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE");
  return e;
}

int threads_per_rank(int configured) {
  if (configured > 0) return configured;
  auto omp = env("OMP_NUM_THREADS");
  return omp ? leading_int(*omp, 0) : 0;
}

}  // namespace smp
