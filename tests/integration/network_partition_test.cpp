// A network partition between two hosts: two network namespaces joined by a
// veth pair, one smp-launch "node" in each (Gloo over TCP between them:
// comm.shm_mb = 0, as on two machines). After the first checkpoint the link
// goes down; the ranks' collectives stall, run.hang_timeout_s ends the job on
// both nodes within that timeout + 10 s naming the silent rank, the link comes
// back, and --max-restarts 1 starts both nodes' workers again from the newest
// checkpoint: the run ends with the parameters of the run never cut.
// Needs root (ip netns); skips otherwise, saying why.
#include "job_runner.h"
#include "reference_check.h"
#include "two_hosts.h"

#include <gtest/gtest.h>

#include <boost/filesystem.hpp>

#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

namespace smp::testing {
namespace {

namespace fs = boost::filesystem;
using Clock = std::chrono::steady_clock;

const std::vector<std::string> kJob = {"parallel.dp=2",          "train.steps=60",  "train.log_every=20",
                                       "run.checkpoint_every=10", "comm.shm_mb=0",   "run.dump_parameters=true"};

TEST(NetworkPartition, BothNodesStopWithinTheHangTimeoutAndResumeWithNothingLost) {
  if (::geteuid() != 0) SMP_REFERENCE_UNAVAILABLE() << "needs root to make network namespaces (ip netns)";
  if (sh("command -v ip") != 0) SMP_REFERENCE_UNAVAILABLE() << "no 'ip' (iproute2) to make network namespaces";
  TwoHosts hosts;
  if (!hosts.ok()) SMP_REFERENCE_UNAVAILABLE() << "ip netns / veth could not be set up here (no CAP_NET_ADMIN?)";

  const std::string plugin = plugin_path("gpt"), config = source_path("tests/integration/data/gpt-equiv.toml");
  const JobResult whole = run_job(2, plugin, config, kJob);
  ASSERT_EQ(whole.exit_code, 0) << whole.output;

  const std::string dir = (fs::temp_directory_path() / fs::unique_path("smp-partition-%%%%-%%%%")).string();
  fs::create_directories(dir);
  constexpr double kHang = 10;
  const int port = 29000 + ::getpid() % 1000;
  std::array<HostRun, 2> nodes;
  for (int n = 0; n < 2; ++n) {
    std::string cmd = "ip netns exec " + hosts.ns(n) + " " + quote(std::string(SMP_BIN_DIR) + "/smp-launch") +
                      " --nnodes 2 --node-rank " + std::to_string(n) + " --nproc-per-node 1 --master-addr " +
                      hosts.master() + " --master-port " + std::to_string(port) +
                      " --max-restarts 1 --kill-timeout 2 --plugin " + quote(plugin) + " --config " + quote(config);
    for (const auto& s : kJob) cmd += " --set " + quote(s);
    cmd += " --set run.hang_timeout_s=" + std::to_string(static_cast<int>(kHang)) + " --set run.dir=" + quote(dir);
    nodes[n].start(cmd);
  }

  // The first checkpoint committed: cut the link, and wait for a launcher to stop its group.
  const fs::path latest = fs::path(dir) / "checkpoints" / "latest";
  auto deadline = Clock::now() + std::chrono::seconds(180);
  while (Clock::now() < deadline && !fs::exists(latest) && !nodes[0].finished() && !nodes[1].finished())
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const bool cut = fs::exists(latest) && hosts.link(false);
  const auto cut_at = Clock::now();
  double stopped_after = -1;
  deadline = cut_at + std::chrono::seconds(static_cast<int>(kHang) + 60);
  while (cut && Clock::now() < deadline && stopped_after < 0) {
    for (auto& n : nodes)
      if (n.text().find("restarting the local workers") != std::string::npos)
        stopped_after = std::chrono::duration<double>(Clock::now() - cut_at).count();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  hosts.link(true);
  // No cut, or no stop after it: end whatever still runs rather than wait for it.
  if (!cut || stopped_after < 0) sh("pkill -f " + quote("run.dir=" + dir));
  for (auto& n : nodes) n.join();
  const std::string both = "node 0:\n" + nodes[0].text() + "\nnode 1:\n" + nodes[1].text();
  ASSERT_TRUE(cut) << "no checkpoint to cut after\n" << both;
  ASSERT_GE(stopped_after, 0) << "no launcher stopped its group after the cut\n" << both;
  std::printf("[ cut    ] a launcher stopped its group %.2f s after the link went down (run.hang_timeout_s = %g)\n",
              stopped_after, kHang);
  // Each node on its own: its launcher saw its rank make no progress (the
  // hang timeout, not a collective's timeout), named it and restarted its
  // workers. The time is reported above, not asserted: the detection's own
  // words say which path stopped the group. Rank 0 logs the checkpoint it
  // loaded (rank 1 logs only warnings); that both resumed from it, the
  // parameters below show (dp replicas equal, and equal to the uncut run's).
  for (int n = 0; n < 2; ++n) {
    SCOPED_TRACE("node " + std::to_string(n));
    const std::string text = nodes[n].text();
    EXPECT_NE(text.find("made no progress for"), std::string::npos) << both;
    EXPECT_NE(text.find(") made no progress"), std::string::npos) << "the silent rank is not named\n" << both;
    EXPECT_NE(text.find("restarting the local workers (restart 1 of 1)"), std::string::npos) << both;
    EXPECT_EQ(nodes[n].exit_code(), 0) << both;
  }
  EXPECT_NE(nodes[0].text().find("loaded checkpoint"), std::string::npos) << both;
  // Nothing lost: the parameters of the run never cut.
  std::string problem;
  const auto a = assemble_parameters(whole.run_dir, 0, &problem), b = assemble_parameters(dir, 0, &problem);
  ASSERT_EQ(problem, "");
  ASSERT_EQ(a.size(), b.size());
  ASSERT_FALSE(a.empty());
  for (const auto& [name, t] : a) EXPECT_TRUE(at::equal(t, b.at(name))) << name;
}

}  // namespace
}  // namespace smp::testing
