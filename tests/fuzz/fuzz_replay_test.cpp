// Replays fuzz/corpus/<harness>/ and fuzz/regressions/<harness>/ through each
// harness's entry (fuzz/support/fuzz_target.h): a refusal is a pass, a crash,
// an abort (a leaked descriptor, a broken promise) or a hang fails the suite.
// Under scripts/sanitize.sh the same replay runs with ASan and UBSan.
#include "support/fuzz_target.h"

#include <gtest/gtest.h>

#include <boost/filesystem.hpp>

#include <algorithm>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <vector>

// Boost, not std::filesystem: see remove_tree in support/fuzz_target.h.
namespace fs = boost::filesystem;

namespace {

const std::vector<std::string> kHarnesses = {"safetensors", "manifest",      "indexed_dataset", "epoch_index",      "bpe_json",
                                             "bpe_merges",  "tokenizer_export", "sentencepiece", "config", "cluster",          "plugin_descriptor", "hf_folder",
                                             "elf_header",  "rendezvous"};

std::vector<fs::path> inputs(const std::string& folder) {
  std::vector<fs::path> out;
  if (fs::is_directory(folder))
    for (const auto& e : fs::directory_iterator(folder))
      if (fs::is_regular_file(e.path())) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

class Replay : public ::testing::TestWithParam<std::string> {};

TEST_P(Replay, EverySeedAndRegressionRunsCleanly) {
  const std::string name = GetParam();
  const auto& all = smp::fuzz::targets();
  const auto it = std::find_if(all.begin(), all.end(), [&](const smp::fuzz::Target& t) { return t.name == name; });
  ASSERT_NE(it, all.end()) << "no harness registered as " << name;
  const std::vector<fs::path> seeds = inputs(std::string(SMP_FUZZ_DIR) + "/corpus/" + name);
  EXPECT_FALSE(seeds.empty()) << "fuzz/corpus/" << name << " has no seeds";
  std::vector<fs::path> files = seeds;
  const std::vector<fs::path> found = inputs(std::string(SMP_FUZZ_DIR) + "/regressions/" + name);
  files.insert(files.end(), found.begin(), found.end());
  for (const fs::path& f : files) {
    SCOPED_TRACE(f.string());
    std::ifstream in(f.string(), std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    smp::fuzz::run_one(it->body, reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  }
}

INSTANTIATE_TEST_SUITE_P(Fuzz, Replay, ::testing::ValuesIn(kHarnesses),
                         [](const ::testing::TestParamInfo<std::string>& p) { return p.param; });

// A harness added to fuzz/ without its name here would have its inputs skipped.
TEST(Replay, EveryCorpusFolderIsReplayed) {
  const std::set<std::string> known(kHarnesses.begin(), kHarnesses.end());
  for (const char* kind : {"/corpus", "/regressions"}) {
    const std::string root = std::string(SMP_FUZZ_DIR) + kind;
    if (!fs::is_directory(root)) continue;
    for (const auto& e : fs::directory_iterator(root))
      if (fs::is_directory(e.path())) EXPECT_TRUE(known.count(e.path().filename().string())) << e.path();
  }
}

}  // namespace
