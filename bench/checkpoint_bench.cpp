#include "checkpoint_bench.h"

#include "jobs.h"

#include <boost/filesystem.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iostream>
#include <thread>

namespace bench {

namespace {

namespace fs = boost::filesystem;

constexpr size_t kGoalRounds = 10;  // a goal counts only on the median of this many rounds or more

double median(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::vector<double> blocking_of(const json& summary) {
  std::vector<double> out;
  for (const auto& s : summary["checkpoints"]["saved"]) out.push_back(s["blocking_seconds"].get<double>());
  return out;
}

double sum(const std::vector<double>& v, size_t from = 0) {
  double s = 0;
  for (size_t i = from; i < v.size(); ++i) s += v[i];
  return s;
}

}  // namespace

// The disk's sequential write throughput for files of these sizes written at
// once, one thread each (as the ranks write their shards): write + fsync.
double disk_write_bytes_per_s(const std::string& dir, const std::vector<int64_t>& sizes) {
  fs::create_directories(dir);
  std::vector<char> chunk(4 << 20, 'x');
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> writers;
  for (size_t i = 0; i < sizes.size(); ++i)
    writers.emplace_back([&, i] {
      const std::string path = dir + "/disk-probe-" + std::to_string(i);
      const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      for (int64_t left = sizes[i]; fd >= 0 && left > 0;) {
        const ssize_t w = ::write(fd, chunk.data(), static_cast<size_t>(std::min<int64_t>(left, chunk.size())));
        if (w <= 0) break;
        left -= w;
      }
      if (fd >= 0) {
        ::fsync(fd);
        ::close(fd);
      }
    });
  for (auto& w : writers) w.join();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  int64_t total = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    total += sizes[i];
    fs::remove(dir + "/disk-probe-" + std::to_string(i));
  }
  return static_cast<double>(total) / s;
}


json run_checkpoint_bench(const CheckpointBenchOptions& o) {
  const std::string work = (fs::temp_directory_path() / "smp-bench-checkpoint").string();
  fs::remove_all(work);
  fs::create_directories(work);
  auto job = [&](const std::string& label, int nproc, std::vector<std::string> extra) {
    Job j;
    j.label = label;
    j.nproc = nproc;
    j.config = o.config;
    j.overrides = o.overrides;
    j.overrides.insert(j.overrides.end(), extra.begin(), extra.end());
    return j;
  };
  const std::string every = "run.checkpoint_every=" + std::to_string(o.save_every);
  json rounds = json::array();
  std::vector<double> write_ratio, stall_ratio, reshard_ratio, sync_s, stall_s, load_same, load_reshard, disk_bps,
      write_bps;
  for (int r = 0; r < o.repeat; ++r) {
    const std::string ckpt = work + "/round-" + std::to_string(r);
    // The same job without saving, saving synchronously, and saving in the background.
    wait_for_quiet_cores(o.quiet_cores, o.job_wait_s, 0.5);  // before each job
    const JobResult none = run_job(job("no-save", 2, {"run.checkpoint_every=0"}));
    wait_for_quiet_cores(o.quiet_cores, o.job_wait_s, 0.5);
    const JobResult sync = run_job(job("sync", 2, {every, "run.checkpoint_async=false", "run.keep_checkpoints=1",
                                                   "run.checkpoint_dir=\"" + ckpt + "/sync\""}));
    wait_for_quiet_cores(o.quiet_cores, o.job_wait_s, 0.5);
    const JobResult async = run_job(job("async", 2, {every, "run.checkpoint_async=true", "run.keep_checkpoints=1",
                                                     "run.checkpoint_dir=\"" + ckpt + "/async\""}));
    // Loading the last save: the same layout, and another (tp 2).
    wait_for_quiet_cores(o.quiet_cores, o.job_wait_s, 0.5);
    const JobResult same = run_job(job("load-same-layout", 2, {"run.resume=\"" + ckpt + "/sync\""}));
    wait_for_quiet_cores(o.quiet_cores, o.job_wait_s, 0.5);
    const JobResult reshard =
        run_job(job("load-resharded-tp2", 2, {"parallel.dp=1", "parallel.zero=0", "parallel.tp=2",
                                              "run.resume=\"" + ckpt + "/sync\""}));
    json round = {{"round", r}};
    bool ok = true;
    for (const JobResult* j : {&none, &sync, &async, &same, &reshard})
      if (j->exit_code != 0 || !j->summary.is_object()) {
        round["failed_output"] = j->output;
        ok = false;
      }
    if (!ok) {
      rounds.push_back(round);
      continue;
    }
    // Rank 0's shard and the other rank's, from the last sync save's manifest.
    std::vector<int64_t> sizes;
    const fs::path last = fs::path(ckpt) / "sync";
    for (const auto& d : fs::directory_iterator(last))
      if (fs::exists(d.path() / "manifest.json"))
        for (const auto& f : fs::directory_iterator(d.path()))
          if (f.path().extension() == ".safetensors") sizes.push_back(static_cast<int64_t>(fs::file_size(f.path())));
    const double disk = disk_write_bytes_per_s(work, sizes);
    const int64_t bytes = sync.summary["checkpoints"]["last_bytes"].get<int64_t>();
    const auto sync_blocking = blocking_of(sync.summary), async_blocking = blocking_of(async.summary);
    const double save_s = median(sync_blocking);
    // The stall of async saves: the run's steps and host copies against the same steps without saving.
    const auto& steps_none = none.step_seconds_each;
    const auto& steps_async = async.step_seconds_each;
    const double stall_total = sum(steps_async, 1) + sum(async_blocking) - sum(steps_none, 1);
    const double stall = stall_total / static_cast<double>(std::max<size_t>(1, async_blocking.size()));
    const double w = static_cast<double>(bytes) / save_s;
    const double l_same = same.summary["checkpoints"]["load_seconds"].get<double>();
    const double l_reshard = reshard.summary["checkpoints"]["load_seconds"].get<double>();
    round.update({{"checkpoint_bytes", bytes},
                  {"shard_bytes", sizes},
                  {"disk_write_bytes_per_s", disk},
                  {"sync_save_seconds_each", sync_blocking},
                  {"sync_save_seconds_median", save_s},
                  {"write_bytes_per_s", w},
                  {"write_over_disk", w / disk},
                  {"async_blocking_seconds_each", async_blocking},
                  {"step_seconds_each_no_save", steps_none},
                  {"step_seconds_each_async", steps_async},
                  {"step_seconds_each_sync", sync.step_seconds_each},
                  {"async_stall_seconds_per_save", stall},
                  {"async_stall_over_sync_save", stall / save_s},
                  {"load_seconds_same_layout", l_same},
                  {"load_seconds_resharded_tp2", l_reshard},
                  {"load_resharded_over_same", l_reshard / l_same}});
    rounds.push_back(round);
    write_ratio.push_back(w / disk);
    stall_ratio.push_back(stall / save_s);
    reshard_ratio.push_back(l_reshard / l_same);
    sync_s.push_back(save_s);
    stall_s.push_back(stall);
    load_same.push_back(l_same);
    load_reshard.push_back(l_reshard);
    disk_bps.push_back(disk);
    write_bps.push_back(w);
    std::cout << "round " << r << ": " << human_bytes(static_cast<double>(bytes)) << ", sync save " << fmt(save_s, 3)
              << " s (" << fmt(100 * w / disk, 1) << "% of the disk's " << human_bytes(disk)
              << "/s), async stall " << fmt(stall, 3) << " s (" << fmt(100 * stall / save_s, 1)
              << "% of a sync save), load " << fmt(l_same, 3) << " s, resharded " << fmt(l_reshard, 3) << " s\n";
  }
  fs::remove_all(work);
  auto range = [](const std::vector<double>& v) {
    return v.empty() ? json::array() : json::array({*std::min_element(v.begin(), v.end()), *std::max_element(v.begin(), v.end())});
  };
  const double wr = median(write_ratio), st = median(stall_ratio);
  json result;
  result["rounds"] = rounds;
  result["medians"] = {{"sync_save_seconds", median(sync_s)},
                       {"async_stall_seconds_per_save", median(stall_s)},
                       {"disk_write_bytes_per_s", median(disk_bps)},
                       {"write_bytes_per_s", median(write_bps)},
                       {"write_over_disk", wr},
                       {"async_stall_over_sync_save", st},
                       {"load_seconds_same_layout", median(load_same)},
                       {"load_seconds_resharded_tp2", median(load_reshard)},
                       {"load_resharded_over_same", median(reshard_ratio)}};
  result["ranges"] = {{"write_over_disk", range(write_ratio)},
                      {"async_stall_over_sync_save", range(stall_ratio)},
                      {"load_resharded_over_same", range(reshard_ratio)}};
  result["goals"] = {
      {"write_over_disk", {{"goal", ">= 0.70"}, {"median", wr}, {"rounds", write_ratio.size()}, {"min_rounds", kGoalRounds},
                           {"met", write_ratio.size() >= kGoalRounds && wr >= 0.70}}},
      {"async_stall_over_sync_save",
       {{"goal", "<= 0.10"}, {"median", st}, {"rounds", stall_ratio.size()}, {"min_rounds", kGoalRounds},
        {"met", stall_ratio.size() >= kGoalRounds && st <= 0.10}}}};
  return result;
}

}  // namespace bench
