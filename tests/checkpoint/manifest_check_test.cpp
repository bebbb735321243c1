// A checkpoint's manifest is checked against its folder and its own shapes
// before anything loads: each hostile edit below is refused, naming the
// manifest, the tensor or file and what cannot hold; the untouched
// checkpoint passes, and `smp-checkpoint verify`'s check finds a slice whose
// shard tensor is not what the manifest says, and a counter (the step, the
// optimizer's updates, the loss scaler's state) that no run could have written
// is refused by loading and by verify alike.
#include "checkpoint/checkpoint.h"
#include "checkpoint/manifest_check.h"

#include <smp/error.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <boost/filesystem.hpp>
#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <functional>
#include <string>

namespace {

namespace fs = boost::filesystem;

// A one-rank checkpoint of whole tensors: a matrix, a vector and a counter.
struct Saved {
  fs::path root, folder;
  nlohmann::json manifest;
};

Saved save_one() {
  Saved s;
  s.root = fs::temp_directory_path() / fs::unique_path("smp-manifest-%%%%-%%%%");
  s.folder = s.root / "step-00000001";
  std::vector<smp::StateEntry> entries = {
      smp::whole_tensor_entry("model/w", at::arange(12, at::kFloat).reshape({4, 3})),
      smp::whole_tensor_entry("model/v", at::arange(10, at::kFloat)),
      smp::whole_tensor_entry("train/step", at::full({}, 1, at::kLong))};
  smp::CheckpointWriter writer({});
  writer.save(s.folder.string(), entries, {{"step", 1}}, false, 0, false);
  std::ofstream(s.root.string() + "/latest") << "step-00000001\n";
  s.manifest = smp::read_manifest(s.folder.string());
  return s;
}

// The manifest as several ranks would write it: the matrix as two row blocks
// (tp's shards), the vector as two flat segments of one block (ZeRO's).
nlohmann::json split(nlohmann::json m) {
  const nlohmann::json file = m["tensors"]["model/w"]["slices"][0]["file"];
  auto slice = [&](std::vector<int64_t> off, std::vector<int64_t> block, int64_t flat, int64_t numel) {
    return nlohmann::json{{"file", file}, {"offsets", off}, {"block_shape", block}, {"flat_begin", flat}, {"numel", numel}};
  };
  m["tensors"]["model/w"]["slices"] = {slice({0, 0}, {2, 3}, -1, 6), slice({2, 0}, {2, 3}, -1, 6)};
  m["tensors"]["model/v"]["slices"] = {slice({0}, {10}, 0, 5), slice({0}, {10}, 5, 5)};
  return m;
}

// The manifest edited by `edit`, written back, must be refused with every part of `said`.
void expect_refused(const std::string& what, const std::function<void(nlohmann::json&)>& edit,
                    const std::vector<std::string>& said) {
  SCOPED_TRACE(what);
  Saved s = save_one();
  nlohmann::json m = split(s.manifest);
  edit(m);
  std::ofstream((s.folder / "manifest.json").string(), std::ios::trunc) << m.dump();
  try {
    smp::read_manifest(s.folder.string());
    ADD_FAILURE() << what << ": accepted";
  } catch (const smp::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find((s.folder / "manifest.json").string()), std::string::npos) << msg;
    for (const auto& part : said) EXPECT_NE(msg.find(part), std::string::npos) << "no '" << part << "' in: " << msg;
  }
  fs::remove_all(s.root);
}

// `call` must throw smp::Error saying every part of `said`.
void expect_error(const std::function<void()>& call, const std::vector<std::string>& said) {
  try {
    call();
    ADD_FAILURE() << "accepted";
  } catch (const smp::Error& e) {
    for (const auto& part : said) EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

nlohmann::json& slice(nlohmann::json& m, const std::string& tensor, int k) { return m["tensors"][tensor]["slices"][k]; }

TEST(ManifestCheck, TheCheckpointAsWrittenPasses) {
  Saved s = save_one();
  EXPECT_TRUE(smp::verify_checkpoint(s.folder.string(), s.manifest).empty());
  EXPECT_EQ(smp::find_checkpoint(s.root.string()), s.folder.string());
  // Blocks and flat segments, as tp and ZeRO write them, hold as well.
  std::ofstream((s.folder / "manifest.json").string(), std::ios::trunc) << split(s.manifest).dump();
  EXPECT_NO_THROW(smp::read_manifest(s.folder.string()));
  fs::remove_all(s.root);
}

TEST(ManifestCheck, FilesOutsideTheFolderAreRefused) {
  expect_refused("an absolute path", [](nlohmann::json& m) { m["files"][0]["name"] = "/etc/passwd"; },
                 {"files[0]", "'/etc/passwd'", "only a plain name inside"});
  expect_refused("a parent folder", [](nlohmann::json& m) { m["files"][0]["name"] = "../step-00000001/x"; },
                 {"files[0]", "'../step-00000001/x'"});
  expect_refused("a slice in an unlisted file",
                 [](nlohmann::json& m) { slice(m, "model/w", 0)["file"] = "rank-00001.safetensors"; },
                 {"tensor 'model/w' slice 0", "is not one of the manifest's files"});
  expect_refused("a file listed twice", [](nlohmann::json& m) { m["files"].push_back(m["files"][0]); },
                 {"files[1]", "listed twice"});
}

TEST(ManifestCheck, ALinkOutOfTheFolderIsRefused) {
  Saved s = save_one();
  const std::string shard = s.manifest["files"][0]["name"].get<std::string>();
  const fs::path outside = s.root / "elsewhere.safetensors";
  fs::rename(s.folder / shard, outside);
  fs::create_symlink(outside, s.folder / shard);
  expect_error([&] { smp::read_manifest(s.folder.string()); }, {"a link to", "outside"});
  fs::remove_all(s.root);
}

TEST(ManifestCheck, LatestNamingAFolderOutsideIsRefused) {
  Saved s = save_one();
  std::ofstream(s.root.string() + "/latest", std::ios::trunc) << "../" << s.root.filename().string() << "/step-00000001\n";
  expect_error([&] { smp::find_checkpoint(s.root.string()); }, {"latest", "only a plain name"});
  fs::remove_all(s.root);
}

TEST(ManifestCheck, SlicesThatDisagreeWithTheShapeAreRefused) {
  expect_refused("a block past the shape", [](nlohmann::json& m) { slice(m, "model/w", 1)["offsets"] = {3, 0}; },
                 {"tensor 'model/w' slice 1", "leaves the shape's 4 in dimension 0"});
  expect_refused("a negative offset", [](nlohmann::json& m) { slice(m, "model/w", 0)["offsets"] = {-1, 0}; },
                 {"tensor 'model/w' slice 0", "\"offsets\" has -1"});
  expect_refused("dimensions unlike the shape's", [](nlohmann::json& m) { slice(m, "model/w", 0)["block_shape"] = {2}; },
                 {"tensor 'model/w' slice 0", "need 2 dimensions"});
  expect_refused("more elements than the block",
                 [](nlohmann::json& m) { slice(m, "model/v", 1)["numel"] = 6; },
                 {"tensor 'model/v' slice 1", "6 elements from flat index 5 do not fit its block of 10"});
  expect_refused("a whole block with another count", [](nlohmann::json& m) { slice(m, "model/w", 0)["numel"] = 5; },
                 {"tensor 'model/w' slice 0", "5 elements from flat index -1"});
  expect_refused("an unknown dtype", [](nlohmann::json& m) { m["tensors"]["model/w"]["dtype"] = "F13"; },
                 {"tensor 'model/w'", "unknown dtype \"F13\""});
  expect_refused("a shape that overflows",
                 [](nlohmann::json& m) { m["tensors"]["model/w"]["shape"] = {int64_t{1} << 40, int64_t{1} << 40}; },
                 {"tensor 'model/w'", "overflows"});
  expect_refused("a negative step", [](nlohmann::json& m) { m["step"] = -3; }, {"\"step\" is -3"});
}

TEST(ManifestCheck, OverlapsAndGapsAreRefused) {
  expect_refused("two blocks that intersect", [](nlohmann::json& m) { slice(m, "model/w", 1)["offsets"] = {1, 0}; },
                 {"tensor 'model/w'", "slices 0 and 1 overlap (their blocks intersect)"});
  expect_refused("flat ranges that intersect", [](nlohmann::json& m) { slice(m, "model/v", 1)["flat_begin"] = 4; },
                 {"tensor 'model/v'", "slices 0 and 1 overlap (the same block, flat ranges intersecting)"});
  expect_refused("a slice gone", [](nlohmann::json& m) { m["tensors"]["model/w"]["slices"].erase(1); },
                 {"tensor 'model/w'", "hold 6 elements, the shape has 12", "a gap"});
  expect_refused("a shorter segment", [](nlohmann::json& m) { slice(m, "model/v", 1)["numel"] = 4; },
                 {"tensor 'model/v'", "hold 9 elements, the shape has 10"});
  expect_refused("a counter in two slices",
                 [](nlohmann::json& m) { m["tensors"]["train/step"]["slices"].push_back(slice(m, "train/step", 0)); },
                 {"tensor 'train/step'", "hold 2 elements, the shape has 1"});
}

// A slice written twice with the same CRC (older checkpoints under ZeRO 1-2
// did so from every dp rank) holds the same values: loaded as once. With
// another CRC the two disagree: an overlap.
TEST(ManifestCheck, TheSameSliceTwiceWithOneCrcIsOneSlice) {
  Saved s = save_one();
  nlohmann::json m = s.manifest;
  m["tensors"]["model/w"]["slices"].push_back(m["tensors"]["model/w"]["slices"][0]);
  std::ofstream((s.folder / "manifest.json").string(), std::ios::trunc) << m.dump();
  EXPECT_NO_THROW(smp::read_manifest(s.folder.string()));
  fs::remove_all(s.root);
  expect_refused("the same slice with another CRC",
                 [](nlohmann::json& m) {
                   nlohmann::json again = m["tensors"]["model/v"]["slices"][1];
                   again["crc32c"] = 7;
                   m["tensors"]["model/v"]["slices"].push_back(again);
                 },
                 {"tensor 'model/v'", "slices 1 and 2 overlap"});
}

// verify goes on to the shards: a slice whose tensor in its file has another
// element count (a manifest edited to match a shape it does not hold) is found.
TEST(ManifestCheck, VerifyComparesEachSliceWithItsShardTensor) {
  Saved s = save_one();
  nlohmann::json m = s.manifest;
  m["tensors"]["model/extra"] = {{"dtype", "F32"},
                                 {"shape", {3}},
                                 {"slices", {{{"file", m["files"][0]["name"]},
                                              {"offsets", {0}},
                                              {"block_shape", {3}},
                                              {"flat_begin", -1},
                                              {"numel", 3}}}}};
  const auto problems = smp::verify_checkpoint(s.folder.string(), m);
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_NE(problems[0].find("has no tensor 'model/extra'"), std::string::npos) << problems[0];
  fs::remove_all(s.root);
}

// Counters no run writes: each refused by the load, naming the checkpoint and
// the counter, and reported by verify; the same checkpoint with sane values loads.
TEST(ManifestCheck, CountersOutOfRangeAreRefused) {
  struct Case {
    std::string what;
    std::vector<std::pair<std::string, at::Tensor>> counters;
    int64_t manifest_step;
    std::vector<std::string> said;
  };
  const auto count = [](double v) { return at::full({}, v, at::kLong); };
  const auto real = [](double v) { return at::full({}, v, at::kDouble); };
  const std::vector<Case> cases = {
      {"sane", {{"train/step", count(7)}, {"optim/step", count(5)}, {"loss_scaler/scale", real(1024)},
                {"loss_scaler/good_steps", count(3)}, {"loss_scaler/skipped", count(2)}}, 7, {}},
      {"a negative step", {{"train/step", count(-3)}}, -1, {"counter 'train/step' is -3", "not a count"}},
      {"a fractional step", {{"train/step", real(2.5)}}, -1, {"counter 'train/step' is 2.5"}},
      {"another step than the manifest's", {{"train/step", count(4)}}, 5,
       {"counter 'train/step' is 4", "the manifest's \"step\" is 5"}},
      {"more updates than steps", {{"train/step", count(4)}, {"optim/step", count(9)}}, 4,
       {"counter 'optim/step' is 9", "more than the 4 steps"}},
      {"updates and skipped steps past the steps",
       {{"train/step", count(4)}, {"optim/step", count(3)}, {"loss_scaler/skipped", count(2)}}, 4,
       {"'optim/step' 3 and 'loss_scaler/skipped' 2 add up to more than the 4 steps"}},
      {"a zero loss scale", {{"train/step", count(4)}, {"loss_scaler/scale", real(0)}}, 4,
       {"counter 'loss_scaler/scale' is 0", "not a positive finite loss scale"}},
      {"an infinite loss scale", {{"train/step", count(4)}, {"loss_scaler/scale", real(INFINITY)}}, 4,
       {"counter 'loss_scaler/scale'", "not a positive finite loss scale"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const fs::path folder = fs::temp_directory_path() / fs::unique_path("smp-counters-%%%%-%%%%");
    std::vector<smp::StateEntry> saved, live;
    for (const auto& [name, value] : c.counters) {
      saved.push_back(smp::whole_tensor_entry(name, value));
      live.push_back(smp::whole_tensor_entry(name, at::zeros({}, value.scalar_type())));
    }
    nlohmann::json meta = nlohmann::json::object();
    if (c.manifest_step >= 0) meta["step"] = c.manifest_step;
    smp::CheckpointWriter({}).save(folder.string(), saved, meta, false, 0, false);
    const nlohmann::json manifest = smp::read_manifest(folder.string());
    const auto problems = smp::verify_checkpoint(folder.string(), manifest);
    if (c.said.empty()) {
      EXPECT_TRUE(problems.empty()) << problems.front();
      smp::load_entries(folder.string(), manifest, live, false);
      for (size_t k = 0; k < live.size(); ++k) EXPECT_TRUE(at::equal(live[k].local, saved[k].local)) << saved[k].name;
    } else {
      ASSERT_EQ(problems.size(), 1u);
      for (const auto& part : c.said) EXPECT_NE(problems[0].find(part), std::string::npos) << problems[0];
      expect_error([&] { smp::load_entries(folder.string(), manifest, live, false); },
                   {"checkpoint " + folder.string(), c.said.front()});
    }
    fs::remove_all(folder);
  }
}

}  // namespace
