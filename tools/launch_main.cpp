// smp-launch: starts the ranks of one node and watches them (see supervisor.h).
//
//   smp-launch --nproc-per-node N [--nnodes M --node-rank R --master-addr A
//              --master-port P] [--max-restarts K] [--threads-per-rank T]
//              [--kill-timeout S] [--log-dir D] [--tee] [--worker PATH]
//              [--plan CLUSTER] [--] <worker args...>
//   smp-launch --nproc-per-node N --nnodes MIN:MAX --rdzv-endpoint HOST:PORT
//              [--rdzv-timeout S] [--rdzv-settle S] [--rdzv-keepalive S]
//              [--elastic-grow checkpoint|now] [--node-name NAME] ... <worker args...>
//   smp-launch --rdzv-server --nnodes MIN:MAX --rdzv-endpoint HOST:PORT
//
// --nnodes MIN:MAX (torchrun's syntax) makes the job elastic: the nodes meet
// at a rendezvous, which the launcher able to bind --rdzv-endpoint serves
// (or `smp-launch --rdzv-server` on a machine that is not a worker); the job
// starts when MIN are there (--rdzv-settle later, at once with MAX), re-forms
// on the nodes left when one is lost, and grows back when one returns (at the
// next committed checkpoint; at once with --elastic-grow now). Each world runs
// the job's [elastic.layouts] entry for its size, else the plan for
// parallel.cluster when parallel.layout = "auto", else the job's own layout
// with parallel.dp derived; it resumes from the last committed checkpoint.
//
// --plan CLUSTER runs the layout smp-plan predicts fastest on that cluster
// (a preset name or a file) for the job (--plugin, --config, --set) on
// --nproc-per-node x --nnodes ranks: its --set lines are added to the job's.
// A job with parallel.layout = "auto" does the same for its parallel.cluster
// (planned_layout.h).
//
// The launcher's own options are taken wherever they stand before a `--`;
// every other argument, and everything after `--`, goes to the worker in
// order (so `smp-launch --nproc-per-node 8 --plugin gpt.so --estimate-memory`
// estimates, and `--max-restarts 1` may follow the worker's options).
#include "planned_layout.h"
#include "rendezvous/server.h"
#include "supervisor.h"

#include <smp/process_env.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <iostream>
#include <string>
#include <vector>

namespace {

// The launcher's options, and whether each takes a value.
const std::vector<std::pair<std::string, bool>> kOwnOptions = {
    {"--nproc-per-node", true}, {"--nnodes", true},       {"--node-rank", true},   {"--master-addr", true},
    {"--master-port", true},    {"--max-restarts", true}, {"--threads-per-rank", true},
    {"--bind-cores", false},    {"--kill-timeout", true}, {"--log-dir", true},     {"--tee", false},
    {"--worker", true},         {"--estimate-memory", false}, {"--device-memory", true},
    {"--plan", true},           {"--help", false},          {"-h", false},
    {"--rdzv-endpoint", true},  {"--rdzv-timeout", true},   {"--rdzv-settle", true},
    {"--rdzv-keepalive", true}, {"--elastic-grow", true},   {"--node-name", true},
    {"--rdzv-server", false}};

// --nnodes: N, or MIN:MAX (elastic). Throws naming the option.
void parse_nnodes(const std::string& text, smp::launch::LaunchOptions& o) {
  auto number = [&](const std::string& t, int most) {
    if (t.empty() || t.size() > 7 || t.find_first_not_of("0123456789") != std::string::npos)
      throw std::runtime_error("--nnodes " + text + ": expected N or MIN:MAX (numbers of nodes)");
    const int n = std::stoi(t);
    if (n < 1 || n > most)
      throw std::runtime_error("--nnodes " + text + ": a number of nodes in [1, " + std::to_string(most) + "]");
    return n;
  };
  const auto colon = text.find(':');
  if (colon == std::string::npos) {
    o.nnodes = number(text, smp::kMaxWorldSize);
    return;
  }
  o.elastic = true;
  o.min_nodes = number(text.substr(0, colon), smp::rdzv::kMaxNodes);  // an elastic job's nodes meet at one rendezvous
  o.max_nodes = number(text.substr(colon + 1), smp::rdzv::kMaxNodes);
  if (o.min_nodes > o.max_nodes) throw std::runtime_error("--nnodes " + text + ": MIN is above MAX");
  o.nnodes = o.max_nodes;
}

// Splits argv into the launcher's arguments (argv[0] first) and the worker's.
void split_arguments(int argc, char** argv, std::vector<std::string>& own, std::vector<std::string>& worker) {
  own.push_back(argv[0]);
  int i = 1;
  for (; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--") {
      ++i;
      break;
    }
    const std::string name = a.substr(0, a.find('='));
    auto known = std::find_if(kOwnOptions.begin(), kOwnOptions.end(), [&](const auto& o) { return o.first == name; });
    if (known == kOwnOptions.end()) {
      worker.push_back(a);
      continue;
    }
    own.push_back(a);
    if (known->second && a.find('=') == std::string::npos && i + 1 < argc) own.push_back(argv[++i]);
  }
  for (; i < argc; ++i) worker.push_back(argv[i]);
}

}  // namespace

int main(int argc, char** argv) {
  smp::launch::LaunchOptions o;
  std::vector<std::string> own_args, worker_args;
  split_arguments(argc, argv, own_args, worker_args);
  CLI::App app{"smp-launch: spawn and supervise the ranks of one node (c10d rendezvous over MASTER_ADDR:MASTER_PORT)",
               "smp-launch"};
  // Each bounded in the int it is read into, and their product below (in int64_t).
  auto* nproc = app.add_option("--nproc-per-node", o.nproc_per_node, "ranks (processes) on this node")
                    ->check(CLI::Range(1, smp::kMaxLocalWorldSize));
  std::string nnodes = "1";
  app.add_option("--nnodes", nnodes, "number of nodes, or MIN:MAX for an elastic job (see --rdzv-endpoint)");
  auto* node_rank = app.add_option("--node-rank", o.node_rank, "this node's index in [0, nnodes)")->check(CLI::NonNegativeNumber);
  app.add_option("--rdzv-endpoint", o.rdzv_endpoint,
                 "elastic jobs: HOST:PORT of the rendezvous (the launcher that can bind it serves it)");
  app.add_option("--rdzv-timeout", o.rdzv_timeout_s,
                 "elastic jobs: seconds to reach the rendezvous and for MIN nodes to be there (default 600)")
      ->check(CLI::Range(1.0, 1e6));
  app.add_option("--rdzv-settle", o.rdzv_settle_s,
                 "elastic jobs: once MIN nodes are there, seconds the first round waits for more (default 5)")
      ->check(CLI::Range(0.0, 1e6));
  app.add_option("--rdzv-keepalive", o.rdzv_keepalive_s,
                 "elastic jobs: a node (or the rendezvous) silent this long is lost (default 15)")
      ->check(CLI::Range(2.0, 1e6));
  std::string grow = "checkpoint";
  app.add_option("--elastic-grow", grow,
                 "elastic jobs: admit a returning node at the next committed checkpoint (checkpoint, the default) "
                 "or at once from the last one (now)")
      ->check(CLI::IsMember({"checkpoint", "now"}));
  app.add_option("--node-name", o.node_name, "elastic jobs: this node's name in messages (default: the host name)");
  bool rdzv_server = false;
  app.add_flag("--rdzv-server", rdzv_server,
               "run only the rendezvous of an elastic job on --rdzv-endpoint, on a machine that is not a worker");
  auto* addr = app.add_option("--master-addr", o.master_addr, "address of the node hosting rank 0 (default 127.0.0.1)");
  auto* port = app.add_option("--master-port", o.master_port, "rendezvous port (default: MASTER_PORT, else a free one on a single node, else 29500; 0 picks a free one)")
                   ->check(CLI::Range(0, 65535));
  app.add_option("--max-restarts", o.max_restarts, "restart the local group up to K times after a failure")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--threads-per-rank", o.threads_per_rank,
                 "OMP_NUM_THREADS for each rank (default: the environment's, else 1 when nproc > 1)")
      ->check(CLI::Range(0, 65536));
  app.add_flag("--bind-cores", o.bind_cores,
               "pin each local rank to its own cores (--threads-per-rank each, default an even split)");
  app.add_option("--kill-timeout", o.kill_timeout_s, "seconds between SIGTERM and SIGKILL when stopping (default 30)")
      ->check(CLI::Range(0.0, 1e6));  // made milliseconds: bounded so that cannot overflow (NaN: checked below)
  app.add_option("--log-dir", o.log_dir,
                 "write each rank's output (stdout and stderr) to <dir>/rank-R.out; rank 0's is still shown, on stdout");
  app.add_flag("--tee", o.tee, "also echo every rank's output, prefixed with [rank R]");
  app.add_option("--worker", o.worker, "the worker executable (default: smp-worker next to smp-launch)");
  bool estimate = false;
  std::string device_memory;
  app.add_flag("--estimate-memory", estimate,
               "print each rank's estimated memory for the job's layout (--nproc-per-node x --nnodes ranks, or "
               "the config's pp * tp * dp) and exit: one process, no training, nothing allocated at full size");
  app.add_option("--device-memory", device_memory, "with --estimate-memory: say whether it fits, e.g. 80GB");
  std::string plan_cluster;
  app.add_option("--plan", plan_cluster,
                 "run the layout smp-plan predicts fastest on this cluster (a preset or a file) for the job");
  try {
    std::vector<char*> own_argv;
    for (auto& a : own_args) own_argv.push_back(a.data());
    app.parse(static_cast<int>(own_argv.size()), own_argv.data());
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    parse_nnodes(nnodes, o);
  } catch (const std::exception& e) {
    std::cerr << "smp-launch: " << e.what() << "\n";
    return 2;
  }
  o.grow_now = grow == "now";
  if (o.elastic || rdzv_server) {
    std::string why;
    if (!o.elastic) why = "--rdzv-server serves an elastic job: give --nnodes MIN:MAX";
    else if (o.rdzv_endpoint.empty()) why = "an elastic job (--nnodes MIN:MAX) needs --rdzv-endpoint HOST:PORT";
    else if (node_rank->count() > 0) why = "--node-rank: an elastic job's rendezvous gives each node its rank";
    else if (!plan_cluster.empty()) why = "--plan: an elastic job plans each world itself (parallel.layout = \"auto\")";
    else if (!std::isfinite(o.rdzv_timeout_s) || !std::isfinite(o.rdzv_settle_s) || !std::isfinite(o.rdzv_keepalive_s))
      why = "--rdzv-timeout, --rdzv-settle and --rdzv-keepalive take seconds";
    if (why.empty()) {
      try {
        smp::rdzv::parse_endpoint(o.rdzv_endpoint);
      } catch (const std::exception& e) {
        why = e.what();
      }
    }
    if (!why.empty()) {
      std::cerr << "smp-launch: " << why << "\n";
      return 2;
    }
    if (rdzv_server) {
      if (!worker_args.empty()) {
        std::cerr << "smp-launch: --rdzv-server runs no workers; it was given " << worker_args.front() << "\n";
        return 2;
      }
      return smp::launch::serve_rendezvous(o);
    }
  }
  if (static_cast<int64_t>(o.nproc_per_node) * o.nnodes > smp::kMaxWorldSize) {
    std::cerr << "smp-launch: --nproc-per-node " << o.nproc_per_node << " x --nnodes " << o.nnodes << " = "
              << static_cast<int64_t>(o.nproc_per_node) * o.nnodes << " ranks, more than the " << smp::kMaxWorldSize
              << " a job may have\n";
    return 2;
  }
  if (!o.log_dir.empty() && ::access(o.log_dir.c_str(), F_OK) == 0) {
    struct stat st {};
    if (::stat(o.log_dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {  // ranks' logs went nowhere, silently
      std::cerr << "smp-launch: --log-dir " << o.log_dir << " exists and is not a folder\n";
      return 2;
    }
  }
  if (!std::isfinite(o.kill_timeout_s)) {  // CLI::Range lets NaN through
    std::cerr << "smp-launch: --kill-timeout " << o.kill_timeout_s << ": expected seconds in [0, 1e6]\n";
    return 2;
  }
  o.master_addr_given = addr->count() > 0;
  o.master_port_given = port->count() > 0;
  try {
    if (o.elastic && !estimate) smp::launch::check_elastic_job(worker_args);
    std::string why = "--plan " + plan_cluster;
    if (o.elastic) {
      // Each world is planned when it forms (planned_layout.h: elastic_layout).
    } else if (plan_cluster.empty()) {
      plan_cluster = smp::launch::auto_layout_cluster(worker_args);
      why = "parallel.layout = \"auto\" for " + plan_cluster;
    }
    if (!plan_cluster.empty()) {
      for (const auto& s : smp::launch::planned_layout(plan_cluster, o.nproc_per_node * o.nnodes, worker_args, why))
        worker_args.insert(worker_args.end(), {"--set", s});
      // The run records that the planner chose (the worker refuses "auto").
      worker_args.insert(worker_args.end(), {"--set", "parallel.layout=\"planned\""});
    }
  } catch (const std::exception& e) {
    std::cerr << "smp-launch: " << e.what() << "\n";
    return 2;
  }
  o.worker_args = worker_args;
  if (o.worker.empty()) o.worker = smp::launch::default_worker_path();
  if (!device_memory.empty() && !estimate) {
    std::cerr << "smp-launch: --device-memory goes with --estimate-memory\n";
    return 2;
  }
  if (estimate) {
    std::vector<std::string> args = {o.worker, "--estimate-memory"};
    if (!device_memory.empty()) args.insert(args.end(), {"--device-memory", device_memory});
    if (nproc->count() > 0 || o.nnodes > 1)
      args.insert(args.end(), {"--world-size", std::to_string(o.nproc_per_node * o.nnodes)});
    args.insert(args.end(), o.worker_args.begin(), o.worker_args.end());
    std::vector<char*> argv_exec;
    for (auto& a : args) argv_exec.push_back(a.data());
    argv_exec.push_back(nullptr);
    ::execv(o.worker.c_str(), argv_exec.data());
    std::cerr << "smp-launch: cannot run " << o.worker << ": " << std::strerror(errno) << "\n";
    return 1;
  }
  if (o.node_rank >= o.nnodes) {
    std::cerr << "smp-launch: --node-rank " << o.node_rank << " must be below --nnodes " << o.nnodes << "\n";
    return 2;
  }
  const std::string external = smp::launch::external_launcher();
  if (!external.empty()) return smp::launch::exec_under_external(o, external);
  return smp::launch::supervise(o);
}
