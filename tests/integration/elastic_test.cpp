// Elastic runs (smp-launch --nnodes MIN:MAX): a host lost mid-run, the job
// re-planned on the host left and grown back when the host returns, with the
// training of a run never interrupted; and the refusals, by name.
//
// The hosts are two network namespaces (two_hosts.h), 2 ranks each; GPT with
// SGD (an update proportional to the gradient: a wrong scale after a change
// of data-parallel degree shows) at pp 2 x dp 2 on 4 ranks, pp 1 x dp 2 on 2
// (the job's [elastic.layouts]). Host B is lost after the first checkpoint
// (its link cut, every process in it killed: no goodbye); host A's launcher
// hears of it from the rendezvous's keepalive, the job continues on A from
// the last committed checkpoint, B's launcher is started again and the job
// grows back to 4 ranks at the next checkpoint.
#include "job_runner.h"
#include "equivalence.h"
#include "reference_check.h"
#include "two_hosts.h"

#include <smp/process_env.h>

#include <gtest/gtest.h>

#include <boost/filesystem.hpp>

#include <chrono>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <thread>

namespace smp::testing {
namespace {

namespace fs = boost::filesystem;
using Clock = std::chrono::steady_clock;

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string temp_path(const std::string& pattern) {
  return (fs::temp_directory_path() / fs::unique_path(pattern)).string();
}

// The job file: the equivalence GPT with a layout for each world it may run on.
std::string elastic_job() {
  const std::string path = temp_path("smp-elastic-job-%%%%-%%%%.toml");
  std::ofstream(path) << read_text(source_path("tests/integration/data/gpt-equiv.toml"))
                      << "\n[elastic.layouts]\n4 = { pp = 2, dp = 2, microbatches = 4 }\n"
                         "2 = { pp = 1, dp = 2, microbatches = 2 }\n";
  return path;
}

const std::vector<std::string> kJob = {"train.steps=120",       "train.log_every=1",  "train.optimizer=\"sgd\"",
                                       "train.lr=0.05",         "train.val_batches=0", "run.checkpoint_every=10",
                                       "comm.shm_mb=0",         "run.dump_parameters=true"};

bool wait_until(const std::function<bool()>& ready, int seconds) {
  const auto deadline = Clock::now() + std::chrono::seconds(seconds);
  while (Clock::now() < deadline) {
    if (ready()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

int64_t latest_step(const std::string& dir) {
  const std::string latest = read_text(dir + "/checkpoints/latest");
  const auto dash = latest.find('-');
  return dash == std::string::npos ? -1 : std::atoll(latest.c_str() + dash + 1);
}

// Every logged loss of metrics.jsonl, by step (a recomputed step twice).
std::map<int64_t, std::vector<double>> logged_losses(const std::string& dir) {
  std::map<int64_t, std::vector<double>> out;
  std::ifstream in(dir + "/metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.value("event", "") == "step") out[j["step"].get<int64_t>()].push_back(j["loss"].get<double>());
  }
  return out;
}

// The scenario; with `snapshot_every` > 0 from in-memory snapshots alone (no
// checkpoint on disk at all), else from the checkpoints every 10 steps.
void lose_a_host_and_get_it_back(int snapshot_every) {
  if (::geteuid() != 0) SMP_REFERENCE_UNAVAILABLE() << "needs root to make network namespaces (ip netns)";
  if (sh("command -v ip") != 0) SMP_REFERENCE_UNAVAILABLE() << "no 'ip' (iproute2) to make network namespaces";
  TwoHosts hosts;
  if (!hosts.ok()) SMP_REFERENCE_UNAVAILABLE() << "ip netns / veth could not be set up here (no CAP_NET_ADMIN?)";

  const std::string plugin = plugin_path("gpt"), config = elastic_job();
  std::vector<std::string> job = kJob;
  const std::string memory = (fs::path("/dev/shm") / fs::unique_path("smp-elastic-memory-%%%%-%%%%")).string();
  if (snapshot_every > 0)
    job = with(job, {"run.checkpoint_every=0", "run.snapshot_every=" + std::to_string(snapshot_every),
                     "run.snapshot_dir=\"" + memory + "\""});
  const JobResult whole = run_job(4, plugin, config, with(job, {"parallel.pp=2"}));
  ASSERT_EQ(whole.exit_code, 0) << whole.output;

  const std::string dir = temp_path("smp-elastic-%%%%-%%%%");
  fs::create_directories(dir);
  const std::string endpoint = hosts.master() + ":" + std::to_string(29000 + ::getpid() % 1000);
  auto command = [&](int host) {
    std::string cmd = "ip netns exec " + hosts.ns(host) + " " + quote(std::string(SMP_BIN_DIR) + "/smp-launch") +
                      " --nproc-per-node 2 --nnodes 1:2 --rdzv-endpoint " + endpoint +
                      " --rdzv-keepalive 4 --rdzv-timeout 120 --kill-timeout 2 --node-name " + (host ? "b" : "a") +
                      " --plugin " + quote(plugin) + " --config " + quote(config);
    for (const auto& s : job) cmd += " --set " + quote(s);
    return cmd + " --set " + quote("run.dir=\"" + dir + "\"");
  };
  HostRun a, b, b_again;
  a.start(command(0));
  ASSERT_TRUE(wait_until([&] { return a.text().find("serving the rendezvous") != std::string::npos; }, 30)) << a.text();
  b.start(command(1));

  // A step after the first checkpoint (or the second snapshot): host B is lost.
  const bool past_checkpoint = wait_until([&] {
    if (snapshot_every > 0) return a.text().find("step " + std::to_string(2 * snapshot_every + 2) + "/") != std::string::npos;
    const int64_t c = latest_step(dir);
    return c >= 10 && a.text().find("step " + std::to_string(c + 2) + "/") != std::string::npos;
  }, 240);
  const std::string before = "host a:\n" + a.text() + "\nhost b:\n" + b.text();
  ASSERT_TRUE(past_checkpoint) << before;
  hosts.link(false);
  hosts.kill_all(1);
  const auto lost_at = Clock::now();
  // Its memory is gone with it (the hosts share this machine's /dev/shm).
  if (snapshot_every > 0)
    for (const auto& run : fs::directory_iterator(memory)) fs::remove_all(run.path() / "b");
  b.join();
  const bool shrunk = wait_until([&] { return a.text().find("elastic: round 1") != std::string::npos; }, 120);
  const double shrink_s = std::chrono::duration<double>(Clock::now() - lost_at).count();
  hosts.link(true);
  ASSERT_TRUE(shrunk) << "host a:\n" << a.text();
  // Host B returns.
  b_again.start(command(1));
  const auto back_at = Clock::now();
  const bool grown = wait_until([&] { return a.text().find("elastic: round 2") != std::string::npos; }, 120);
  const double grow_s = std::chrono::duration<double>(Clock::now() - back_at).count();
  if (!grown) hosts.kill_all(0), hosts.kill_all(1);
  a.join();
  b_again.join();
  const std::string both = "host a:\n" + a.text() + "\nhost b, again:\n" + b_again.text();
  ASSERT_TRUE(grown) << both;
  std::printf("[ elastic] first step on 2 ranks %.2f s after host b was lost; on 4 again %.2f s after it returned\n",
              shrink_s, grow_s);
  EXPECT_EQ(a.exit_code(), 0) << both;
  EXPECT_EQ(b_again.exit_code(), 0) << both;
  // The re-formations, as the launcher of host a said them.
  const std::string text = a.text();
  EXPECT_NE(text.find("round 1: node 0 of 1, world 2 (was 4), layout parallel.dp=2 parallel.microbatches=2 "
                      "parallel.pp=1; lost node b (silent for"),
            std::string::npos)
      << both;
  EXPECT_NE(text.find("round 2: node 0 of 2, world 4 (was 2), layout parallel.dp=2 parallel.microbatches=4 "
                      "parallel.pp=2; b joined: admitted at the checkpoint of step"),
            std::string::npos)
      << both;
  EXPECT_NE(text.find("layout pp=1 tp=1 dp=2 world=2"), std::string::npos) << both;
  // The returning host is told the world it joins, with the one before.
  EXPECT_NE(b_again.text().find("round 2: node 1 of 2, world 4 (was 2)"), std::string::npos) << both;

  // Every step's loss, each time it was computed, as the uninterrupted run's;
  // no step missing; the steps after a checkpoint recomputed, and only those.
  const std::vector<double> reference = losses_of(whole);
  ASSERT_EQ(reference.size(), 120u);
  const auto logged = logged_losses(dir);
  const Bounds bounds;
  int recomputed = 0;
  for (int64_t step = 1; step <= 120; ++step) {
    auto it = logged.find(step);
    ASSERT_NE(it, logged.end()) << "step " << step << " is missing from metrics.jsonl";
    recomputed += static_cast<int>(it->second.size()) - 1;
    for (double loss : it->second)
      EXPECT_NEAR(loss, reference[step - 1], bounds.loss_rtol * std::abs(reference[step - 1])) << "step " << step;
  }
  EXPECT_EQ(logged.size(), 120u);
  if (snapshot_every == 0) EXPECT_GT(recomputed, 0) << "host b was lost after a checkpoint: its steps since are computed again";
  std::printf("[ elastic] %d steps recomputed in all\n", recomputed);
  // Per change: how far the steps went back (a rewind in the log's order).
  std::vector<int64_t> rewinds;
  {
    std::ifstream in(dir + "/metrics.jsonl");
    std::string line;
    int64_t last = 0;
    while (std::getline(in, line)) {
      const auto j = nlohmann::json::parse(line, nullptr, false);
      if (!j.is_object() || j.value("event", "") != "step") continue;
      const int64_t step = j["step"].get<int64_t>();
      if (step <= last) rewinds.push_back(last - (step - 1));
      last = step;
    }
  }
  EXPECT_LE(rewinds.size(), 2u);
  for (int64_t lost : rewinds) {
    std::printf("[ elastic] a change recomputed %lld steps\n", static_cast<long long>(lost));
    if (snapshot_every > 0) EXPECT_LE(lost, snapshot_every) << "at most run.snapshot_every steps are lost";
  }
  // From memory: no checkpoint on disk at all, every load from the snapshots,
  // and the returning host sent what it lacked.
  if (snapshot_every > 0) {
    EXPECT_FALSE(fs::exists(dir + "/checkpoints/latest"));
    size_t loads = 0;
    for (size_t at = text.find("loaded checkpoint "); at != std::string::npos; at = text.find("loaded checkpoint ", at + 1)) {
      ++loads;
      EXPECT_EQ(text.compare(at + 18, memory.size(), memory), 0) << text.substr(at, 200);
    }
    EXPECT_EQ(loads, 2u) << both;
    EXPECT_NE(text.find("whole on every machine (0 bytes sent"), std::string::npos) << both;  // host a held it all
    const auto grown_load = text.find("whole on every machine (", text.find("round 2:"));
    ASSERT_NE(grown_load, std::string::npos) << both;
    EXPECT_NE(text.compare(grown_load + 24, 2, "0 "), 0) << "host b was sent its parts: " << text.substr(grown_load, 120);
    fs::remove_all(memory);
  }

  // Where training ended, and what it changed (from the same initial
  // parameters: the seed's), as in the uninterrupted run.
  std::string problem;
  const auto p_ref = assemble_parameters(whole.run_dir, 0, &problem);
  const auto p0 = assemble_parameters(whole.run_dir, 0, &problem, "parameters-initial");
  const auto p = assemble_parameters(dir, 1e-6, &problem);
  ASSERT_EQ(problem, "");
  ASSERT_EQ(p.size(), p_ref.size());
  double gap = 0, norm = 0, worst = 0;
  for (const auto& [name, t] : p_ref) {
    ASSERT_TRUE(p.count(name)) << name;
    const at::Tensor u = p.at(name) - p0.at(name), u_ref = t - p0.at(name);
    gap += (u - u_ref).pow(2).sum().item<double>();
    norm += u_ref.pow(2).sum().item<double>();
    worst = std::max(worst, (p.at(name) - t).abs().max().item<double>());
  }
  EXPECT_GT(norm, 0);
  EXPECT_LE(std::sqrt(gap / norm), bounds.update_rtol);
  EXPECT_LE(worst, bounds.param_abs_tol);
  std::printf("[ elastic] updates %.2e off (relative), parameters %.2e off at most\n", std::sqrt(gap / norm), worst);

  // The run's record: both re-formations in summary.json and metrics.jsonl.
  const auto summary = nlohmann::json::parse(read_text(dir + "/summary.json"));
  ASSERT_TRUE(summary.contains("elastic")) << summary.dump(1).substr(0, 2000);
  ASSERT_EQ(summary["elastic"]["reformations"].size(), 2u) << summary["elastic"].dump(1);
  EXPECT_EQ(summary["elastic"]["reformations"][0]["world"], 2);
  EXPECT_EQ(summary["elastic"]["reformations"][1]["world"], 4);
  EXPECT_TRUE(summary["elastic"]["reformations"][1].contains("first_step_seconds"));
  fs::remove_all(dir);
  fs::remove(config);
}

TEST(Elastic, ALostHostIsPlannedAroundAndTheJobGrowsBackWithTheSameTraining) { lose_a_host_and_get_it_back(0); }

// The same from in-memory snapshots every 5 steps: no disk, at most 5 steps lost.
TEST(Elastic, FromMemorySnapshotsNoDiskIsReadAndAtMostKStepsAreLost) { lose_a_host_and_get_it_back(5); }

// One launcher on this machine for the refusals (no namespaces needed).
std::string local_launch(const std::string& extra, const std::string& config, const std::string& dir) {
  return std::string(SMP_BIN_DIR) + "/smp-launch --nproc-per-node 1 --kill-timeout 2 --rdzv-endpoint 127.0.0.1:" +
         std::to_string(find_free_port()) + " --node-name a " + extra + " --plugin " + quote(plugin_path("gpt")) +
         " --config " + quote(config) + " --set train.steps=3 --set comm.shm_mb=0 --set " +
         quote("run.dir=\"" + dir + "\"");
}

TEST(Elastic, TooFewNodesBeforeTheTimeoutAreRefusedNamingTheNodesPresent) {
  const std::string dir = temp_path("smp-elastic-min-%%%%-%%%%");
  HostRun run;
  run.start(local_launch("--nnodes 2:3 --rdzv-timeout 2", source_path("tests/integration/data/gpt-equiv.toml"), dir) +
            " --set run.checkpoint_every=1");
  run.join();
  EXPECT_EQ(run.exit_code(), 1) << run.text();
  EXPECT_NE(run.text().find("only 1 of the 2 nodes --nnodes 2:3 needs joined within 2 s (--rdzv-timeout); "
                            "present: a"),
            std::string::npos)
      << run.text();
}

TEST(Elastic, AJobThatWritesNoCheckpointIsRefused) {
  const std::string dir = temp_path("smp-elastic-ckpt-%%%%-%%%%");
  HostRun run;
  run.start(local_launch("--nnodes 1:2", source_path("tests/integration/data/gpt-equiv.toml"), dir));
  run.join();
  EXPECT_EQ(run.exit_code(), 2) << run.text();
  EXPECT_NE(run.text().find("an elastic job (--nnodes MIN:MAX) re-forms from its last committed checkpoint, and "
                            "run.checkpoint_every is 0 (its default): set it, e.g. --set run.checkpoint_every=100, or keep snapshots in "
                            "memory (run.snapshot_every)"),
            std::string::npos)
      << run.text();
}

TEST(Elastic, AWorldWithNoLayoutOrNoneThatFitsIsRefusedByName) {
  const std::string dir = temp_path("smp-elastic-fit-%%%%-%%%%");
  // The job's list has no layout for 1 rank.
  const std::string listed = elastic_job();
  HostRun run;
  run.start(local_launch("--nnodes 1:2 --rdzv-settle 0", listed, dir) + " --set run.checkpoint_every=1");
  run.join();
  EXPECT_EQ(run.exit_code(), 2) << run.text();
  EXPECT_NE(run.text().find("round 0, 1 ranks on 1 nodes: no layout for a world of 1 ranks: " + listed +
                            " lists [elastic.layouts] for 2, 4 only"),
            std::string::npos)
      << run.text();
  // parallel.layout = "auto" on a cluster whose accelerators hold 0.92 MB:
  // the model fits on 2 ranks, not on 1.
  const std::string cluster = temp_path("smp-elastic-cluster-%%%%-%%%%.toml");
  std::string text = read_text(source_path("configs/clusters/dgx-a100-80gb.toml"));
  text.replace(text.find("memory_gb = 80"), 14, "memory_gb = 0.00092");
  std::ofstream(cluster) << text;
  std::string job_text = read_text(source_path("tests/integration/data/gpt-equiv.toml"));
  job_text.replace(job_text.find("microbatches = 4"), 16, "layout = \"auto\"\ncluster = \"" + cluster + "\"");
  const std::string planned = temp_path("smp-elastic-auto-%%%%-%%%%.toml");
  std::ofstream(planned) << job_text;
  HostRun plan;
  plan.start(local_launch("--nnodes 1:2 --rdzv-settle 0", planned, dir) + " --set run.checkpoint_every=1");
  plan.join();
  EXPECT_EQ(plan.exit_code(), 2) << plan.text();
  EXPECT_NE(plan.text().find("round 0, 1 ranks on 1 nodes: a world of 1 ranks on " + cluster +
                             ": no layout fits 0.00092 GB per accelerator"),
            std::string::npos)
      << plan.text();
  for (const auto& f : {listed, cluster, planned}) fs::remove(f);
  fs::remove_all(dir);
}

// The rendezvous alone (smp-launch --rdzv-server), on a machine that trains
// nothing: a node's job meets there and finishes, and the server ends with it.
TEST(Elastic, AStandaloneRendezvousServesAJobAndEndsWithIt) {
  const std::string dir = temp_path("smp-elastic-server-%%%%-%%%%");
  const std::string endpoint = "127.0.0.1:" + std::to_string(find_free_port());
  HostRun server, node;
  server.start(std::string(SMP_BIN_DIR) + "/smp-launch --rdzv-server --nnodes 1:1 --rdzv-endpoint " + endpoint);
  ASSERT_TRUE(wait_until([&] { return server.text().find("serving the rendezvous") != std::string::npos; }, 30))
      << server.text();
  node.start(std::string(SMP_BIN_DIR) + "/smp-launch --nproc-per-node 1 --nnodes 1:1 --rdzv-endpoint " + endpoint +
             " --node-name solo --plugin " + quote(plugin_path("gpt")) + " --config " +
             quote(source_path("tests/integration/data/gpt-equiv.toml")) +
             " --set train.steps=2 --set run.checkpoint_every=1 --set " + quote("run.dir=\"" + dir + "\""));
  node.join();
  server.join();
  EXPECT_EQ(node.exit_code(), 0) << node.text();
  EXPECT_EQ(server.exit_code(), 0) << server.text();
  EXPECT_NE(server.text().find("round 0: world 1 on solo (start)"), std::string::npos) << server.text();
  EXPECT_NE(server.text().find("round 0 finished the job"), std::string::npos) << server.text();
  fs::remove_all(dir);
}

// A machine lost before the first checkpoint is committed: the job stops,
// saying there is no checkpoint to re-form from, rather than start over.
TEST(Elastic, ALossBeforeTheFirstCheckpointStopsTheJobSayingSo) {
  const std::string dir = temp_path("smp-elastic-early-%%%%-%%%%");
  const std::string endpoint = "127.0.0.1:" + std::to_string(find_free_port());
  auto command = [&](const std::string& name) {
    return std::string(SMP_BIN_DIR) + "/smp-launch --nproc-per-node 1 --nnodes 1:2 --kill-timeout 2 --rdzv-endpoint " +
           endpoint + " --node-name " + name + " --plugin " + quote(plugin_path("gpt")) + " --config " +
           quote(source_path("tests/integration/data/gpt-equiv.toml")) +
           " --set train.steps=100000 --set train.log_every=1 --set run.checkpoint_every=100000 --set comm.shm_mb=0 --set " +
           quote("run.dir=\"" + dir + "\"");
  };
  HostRun a, b;
  a.start(command("a"));
  ASSERT_TRUE(wait_until([&] { return a.text().find("serving the rendezvous") != std::string::npos; }, 30)) << a.text();
  b.start("exec " + command("b"));
  ASSERT_TRUE(wait_until([&] { return a.text().find("] step 2/") != std::string::npos; }, 120)) << a.text();
  sh("pkill -9 -f " + quote("node-name b --plugin"));
  b.join();
  a.join();
  EXPECT_EQ(a.exit_code(), 1) << a.text();
  EXPECT_NE(a.text().find("run.resume = \"latest\": no checkpoint in " + dir + "/checkpoints"), std::string::npos)
      << a.text();
  EXPECT_NE(a.text().find("the rendezvous ended the job"), std::string::npos) << a.text();
  fs::remove_all(dir);
}

}  // namespace
}  // namespace smp::testing
