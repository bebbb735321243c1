// Check 4 of tsan_races (races.cpp): the asynchronous checkpoint writer
// (core/src/checkpoint/checkpoint.{h,cpp}, host_snapshot.{h,cpp}).
//
// As the runtime drives it (runtime.cpp, runtime/checkpointing.cpp): at the
// end of a step the training thread asks for a background save of the live
// state; the writer thread copies it (HostSnapshot), then writes and commits
// the folder (rank 0 of a world of one: the manifest, `latest`, pruning to
// `keep`). Meanwhile the training thread runs the next step: it reads the
// parameters, waits for the snapshot before the update (wait_for_snapshot),
// changes them in place, and saves again (which waits for the last save);
// every few steps it waits for the commit (wait, as the training loop does at
// its end). Last, a writer destroyed with a save in flight (its destructor
// waits). The update writes the parameters from this file's instrumented code,
// so that TSan sees it against the writer's instrumented reads (CRC-32C, the
// file's write()) should the writer ever read the live tensors.
//
// Each committed checkpoint must hold the state as it was when its save was
// asked for, not as the update left it.
#include "checkpoint/checkpoint.h"

#include <ATen/ATen.h>
#include <boost/filesystem.hpp>

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

namespace tsan_races {

namespace {

namespace fs = boost::filesystem;

constexpr int64_t kNumel = 1 << 14;

struct State {
  std::vector<at::Tensor> params;
  at::Tensor step = at::zeros({}, at::kLong);
  std::vector<smp::StateEntry> entries() const {
    std::vector<smp::StateEntry> out;
    for (size_t i = 0; i < params.size(); ++i) {
      smp::StateEntry e;
      e.name = "model/p" + std::to_string(i);
      e.global_shape = e.block_shape = {kNumel};
      e.offsets = {0};
      e.local = params[i];
      e.owner = true;
      out.push_back(e);
    }
    smp::StateEntry s;
    s.name = "train/step";
    s.local = step.clone();
    s.owner = true;
    out.push_back(s);
    return out;
  }
  // The optimizer's update, in place: every value becomes `v`.
  void update(float v) {
    for (auto& p : params) {
      float* d = p.data_ptr<float>();
      for (int64_t i = 0; i < kNumel; ++i) d[i] = v + static_cast<float>(i % 7);
    }
    step.fill_(static_cast<int64_t>(v));
  }
  // The forward and backward passes read the parameters.
  double read() const {
    double s = 0;
    for (const auto& p : params) {
      const float* d = p.data_ptr<float>();
      for (int64_t i = 0; i < kNumel; i += 64) s += d[i];
    }
    return s;
  }
};

std::string folder_of(const fs::path& dir, int step) {
  char name[32];
  std::snprintf(name, sizeof name, "step-%08d", step);
  return (dir / name).string();
}

// What a committed checkpoint must hold: noted, not thrown, so that the
// threads go on and TSan sees what they do after a fault.
std::vector<std::string> faults;

void expect_saved(const std::string& folder, float v) {
  try {
    const nlohmann::json m = smp::read_manifest(folder);
    const std::vector<std::string> problems = smp::verify_checkpoint(folder, m);
    if (!problems.empty()) throw std::runtime_error(folder + ": " + problems.front());
    const at::Tensor p = smp::read_global_tensor(folder, m, "model/p1", at::kFloat);
    const at::Tensor want = at::arange(kNumel, at::kFloat).remainder_(7).add_(v);
    if (!at::equal(p, want))
      throw std::runtime_error(folder + " holds model/p1 = " + std::to_string(p[0].item<float>()) +
                               "..., not the state when the save was asked for (" + std::to_string(v) + "...)");
  } catch (const std::exception& e) {
    faults.push_back(e.what());
  }
}

}  // namespace

void checkpoint_writer() {
  char tmpl[] = "/tmp/smp-tsan-ckpt-XXXXXX";
  if (!mkdtemp(tmpl)) {
    std::perror("tsan_races: mkdtemp");
    std::exit(2);
  }
  const fs::path dir(tmpl);
  State state;
  for (int i = 0; i < 3; ++i) state.params.push_back(at::empty({kNumel}, at::kFloat));
  state.update(0);
  smp::CheckpointWriter::Options o;
  o.timeout_s = 60;
  o.token = 0x75a9;
  const int steps = 8;
  double sink = 0;
  {
    smp::CheckpointWriter writer(o);
    for (int step = 1; step <= steps; ++step) {
      sink += state.read();          // forward and backward: while the last save copies
      writer.wait_for_snapshot();    // the runtime's hook before the update
      state.update(static_cast<float>(step));
      if (step % 2 == 0) {
        writer.save(folder_of(dir, step), state.entries(), {{"step", step}}, /*async=*/true, /*keep=*/2,
                    /*update_latest=*/true);
        // The metrics line: what this call blocked for (this thread's own).
        if (writer.last_blocking_seconds() < 0) std::abort();
      }
      if (step == 4) {
        writer.wait();  // the commit, before going on
        expect_saved(folder_of(dir, 4), 4);
      }
    }
    writer.wait();
    expect_saved(smp::find_checkpoint(dir.string()), static_cast<float>(steps));
    if (fs::exists(folder_of(dir, 2))) faults.push_back("keep = 2 left step 2 in place");
  }
  // A writer destroyed with its save in flight: the destructor waits for it.
  state.update(steps + 1);
  {
    smp::CheckpointWriter writer(o);
    writer.save(folder_of(dir, steps + 1), state.entries(), {{"step", steps + 1}}, /*async=*/true, 0, false);
    writer.wait_for_snapshot();
    state.update(steps + 2);
  }
  expect_saved(folder_of(dir, steps + 1), static_cast<float>(steps + 1));
  fs::remove_all(dir);
  if (sink < 0) std::abort();
  for (const auto& f : faults) std::fprintf(stderr, "tsan_races: checkpoint writer: %s\n", f.c_str());
  if (!faults.empty()) std::exit(3);
  std::printf("tsan_races: checkpoint writer done: %d background saves, each the state it was asked for\n",
              steps / 2 + 1);
}

}  // namespace tsan_races
