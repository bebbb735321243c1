// smp-launch: starts the ranks of one node and watches them (see supervisor.h).
//
//   smp-launch --nproc-per-node N [--nnodes M --node-rank R --master-addr A
//              --master-port P] [--max-restarts K] [--threads-per-rank T]
//              [--kill-timeout S] [--log-dir D] [--tee] [--worker PATH]
//              [--] <worker args...>
//
// Everything after the launcher's own options is passed to the worker verbatim.
#include "supervisor.h"

#include <CLI/CLI.hpp>

#include <iostream>

int main(int argc, char** argv) {
  smp::launch::LaunchOptions o;
  CLI::App app{"smp-launch: spawn and supervise the ranks of one node (c10d rendezvous over MASTER_ADDR:MASTER_PORT)",
               "smp-launch"};
  app.prefix_command();  // the first unknown argument and everything after it go to the worker
  app.add_option("--nproc-per-node", o.nproc_per_node, "ranks (processes) on this node")->check(CLI::PositiveNumber);
  app.add_option("--nnodes", o.nnodes, "number of nodes")->check(CLI::PositiveNumber);
  app.add_option("--node-rank", o.node_rank, "this node's index in [0, nnodes)")->check(CLI::NonNegativeNumber);
  auto* addr = app.add_option("--master-addr", o.master_addr, "address of the node hosting rank 0 (default 127.0.0.1)");
  auto* port = app.add_option("--master-port", o.master_port, "rendezvous port (default 29500; 0 picks a free one)")
                   ->check(CLI::Range(0, 65535));
  app.add_option("--max-restarts", o.max_restarts, "restart the local group up to K times after a failure")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--threads-per-rank", o.threads_per_rank,
                 "OMP_NUM_THREADS for each rank (default: the environment's, else 1 when nproc > 1)")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--bind-cores", o.bind_cores,
               "pin each local rank to its own cores (--threads-per-rank each, default an even split)");
  app.add_option("--kill-timeout", o.kill_timeout_s, "seconds between SIGTERM and SIGKILL when stopping (default 30)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--log-dir", o.log_dir, "write each captured rank's output to <dir>/rank-R.out");
  app.add_flag("--tee", o.tee, "also echo every rank's output, prefixed with [rank R]");
  app.add_option("--worker", o.worker, "the worker executable (default: smp-worker next to smp-launch)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  o.master_addr_given = addr->count() > 0;
  o.master_port_given = port->count() > 0;
  o.worker_args = app.remaining();
  if (!o.worker_args.empty() && o.worker_args.front() == "--") o.worker_args.erase(o.worker_args.begin());
  if (o.worker.empty()) o.worker = smp::launch::default_worker_path();
  if (o.node_rank >= o.nnodes) {
    std::cerr << "smp-launch: --node-rank " << o.node_rank << " must be below --nnodes " << o.nnodes << "\n";
    return 2;
  }
  const std::string external = smp::launch::external_launcher();
  if (!external.empty()) return smp::launch::exec_under_external(o, external);
  return smp::launch::supervise(o);
}
