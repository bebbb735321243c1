// The checkpoint commit waits for the ranks through the rendezvous, not the
// file system: two ranks as threads over a real store write one checkpoint
// that loads whole; a part whose rank never says it is written keeps rank 0
// from committing (even with the part's files in place), and the failure names
// the rank, the checkpoint and run.timeout_s.
#include "checkpoint/checkpoint.h"
#include "comm/communicator.h"

#include <smp/error.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <boost/filesystem.hpp>

#include "proc_util.h"

#include <functional>
#include <thread>

namespace {

namespace fs = boost::filesystem;
using namespace std::chrono_literals;

// Rows [4r, 4r + 4) of an 8 x 3 matrix, owned by rank r.
std::vector<smp::StateEntry> rank_part(int r) {
  smp::StateEntry e;
  e.name = "model/w";
  e.global_shape = {8, 3};
  e.offsets = {4 * r, 0};
  e.block_shape = {4, 3};
  e.local = at::arange(12, at::kFloat).view({4, 3}) + 100.0f * r;
  e.owner = true;
  return {e};
}

fs::path fresh_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("smp-commit-" + name + "-" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// f(rank, writer, rendezvous) on two threads joined to one job.
void two_writers(double timeout_s,
                 const std::function<void(int, smp::CheckpointWriter&, smp::Rendezvous&)>& f) {
  const int port = smp_test::free_port();
  std::string errors[2];
  std::thread ranks[2];
  for (int r = 0; r < 2; ++r)
    ranks[r] = std::thread([&, r] {
      try {
        smp::CheckpointWriter::Options o;
        o.rank = r;
        o.world = 2;
        o.timeout_s = timeout_s;
        o.token = 0x5eed;
        o.rendezvous = smp::Rendezvous::connect("127.0.0.1", port, r, 2, 30s);
        smp::CheckpointWriter w(o);
        f(r, w, *o.rendezvous);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : ranks) t.join();
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
}

TEST(CheckpointCommitTest, TwoRanksCommitOneCheckpointThatLoadsWhole) {
  const fs::path dir = fresh_dir("whole");
  const std::string folder = (dir / "step-00000001").string();
  two_writers(30, [&](int r, smp::CheckpointWriter& w, smp::Rendezvous&) {
    w.save(folder, rank_part(r), {{"step", 1}}, /*async=*/r == 1, /*keep=*/0, /*update_latest=*/false);
    w.wait();
  });
  ASSERT_TRUE(fs::exists(fs::path(folder) / "manifest.json"));
  const nlohmann::json manifest = smp::read_manifest(folder);
  EXPECT_EQ(manifest["files"].size(), 2u);
  EXPECT_TRUE(smp::verify_checkpoint(folder, manifest).empty());
  const at::Tensor whole = smp::read_global_tensor(folder, manifest, "model/w", at::kFloat);
  const at::Tensor want = at::cat({rank_part(0)[0].local, rank_part(1)[0].local});
  EXPECT_TRUE(at::equal(whole, want));
  fs::remove_all(dir);
}

// Rank 1's part is on disk (its index copied in by hand) but rank 1 never says
// so: a commit that polled the file system would take it; this one waits for
// rank 1 and fails at run.timeout_s, leaving no checkpoint.
TEST(CheckpointCommitTest, RankZeroWaitsForTheRanksNotForTheirFiles) {
  const fs::path dir = fresh_dir("unannounced");
  const std::string folder = (dir / "step-00000002").string();
  std::string error;
  two_writers(0.5, [&](int r, smp::CheckpointWriter& w, smp::Rendezvous& rdv) {
    if (r == 1) {
      // Its part of another folder (what it arrives for is that folder's save).
      w.save((dir / "elsewhere").string(), rank_part(1), {{"step", 2}}, false, 0, false);
      rdv.set("written", "1");
      return;
    }
    rdv.get("written");
    const fs::path tmp = folder + ".tmp-0000000000005eed";
    fs::create_directories(tmp);
    for (const char* f : {"rank-00001.json", "rank-00001.safetensors"})
      fs::copy_file(dir / "elsewhere.tmp-0000000000005eed" / f, tmp / f);
    try {
      w.save(folder, rank_part(0), {{"step", 2}}, false, 0, false);
    } catch (const smp::Error& e) {
      error = e.what();
    }
  });
  EXPECT_NE(error.find("checkpoint: timed out after 500 ms waiting for every rank's part of " + folder +
                       "; missing: world rank 1 (run.timeout_s = 0.5"),
            std::string::npos)
      << error;
  EXPECT_FALSE(fs::exists(fs::path(folder) / "manifest.json"));
  fs::remove_all(dir);
}

}  // namespace
