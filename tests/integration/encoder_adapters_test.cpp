// The BERT and RoBERTa adapters end to end: each learns masked bytes well
// below the unigram entropy (what a model that ignores the context reaches),
// and bad keys and data files are named. Serial equivalence is in
// equivalence_test (BertEquivalence, RobertaEquivalence); the data code has
// its unit tests in tests/adapters.
#include "job_runner.h"

#include <gtest/gtest.h>

#include <boost/filesystem.hpp>

#include <fstream>
#include <regex>

namespace smp::testing {
namespace {

// "unigram entropy 3.152486 nats" from the adapter's log line.
double unigram_entropy(const std::string& output) {
  std::smatch m;
  if (!std::regex_search(output, m, std::regex("unigram entropy ([0-9.]+) nats"))) return -1;
  return std::stod(m[1].str());
}

// The preset's data and recipe on a smaller encoder (2 layers, hidden 64,
// sequence 32, learning rate 2e-3; a CI budget, ~1 min on one thread): after
// 2500 steps the validation MLM loss must be below 0.8 x the unigram entropy
// and have fallen over the run (measured here: BERT 1.94, RoBERTa 2.02 with
// seed 1234 and 7, against 3.15). The presets' own runs are in the README.
void expect_learns(const std::string& adapter) {
  JobResult r = run_job(1, plugin_path(adapter), source_path("configs/" + adapter + ".toml"),
                        {"run.log_to_file=false", "model.layers=2", "model.hidden=64", "model.seq_len=32",
                         "train.steps=2500", "train.lr=2e-3", "train.warmup_steps=30", "train.val_every=500",
                         "train.val_batches=4", "train.log_every=500"},
                        {"--threads-per-rank", "1"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const double unigram = unigram_entropy(r.output);
  ASSERT_GT(unigram, 1.0) << r.output;
  const auto& vals = r.summary["val_losses"];
  ASSERT_GE(vals.size(), 2u);
  const double first = vals.front()["mlm_loss"].get<double>(), last = r.summary["val_metrics"]["mlm_loss"].get<double>();
  std::printf("[ %s ] unigram entropy %.3f nats; validation MLM loss %.3f at step %d, %.3f at the end (%.2f x unigram)\n",
              adapter.c_str(), unigram, first, vals.front()["step"].get<int>(), last, last / unigram);
  EXPECT_LT(last, 0.8 * unigram);
  EXPECT_LT(last, first);
}

TEST(Bert, MaskedLossFallsWellBelowUnigramEntropy) { expect_learns("bert"); }
TEST(Roberta, MaskedLossFallsWellBelowUnigramEntropy) { expect_learns("roberta"); }

std::string write_file(const std::string& name, const std::string& text) {
  const auto dir = boost::filesystem::temp_directory_path() / boost::filesystem::unique_path("smp-enc-%%%%-%%%%");
  boost::filesystem::create_directories(dir);
  const std::string path = (dir / name).string();
  std::ofstream(path) << text;
  return path;
}

TEST(EncoderAdapters, BadKeysAndDataFilesAreNamed) {
  const std::string two_lines = write_file("short.txt", "one line\n\n   \nanother line\n");
  struct Case {
    std::vector<std::string> sets;
    std::string message;
  };
  for (const std::string adapter : {"bert", "roberta"}) {
    const std::vector<Case> cases = {
        {{"model.hiden=64"}, "model.hiden: unknown key for the " + adapter + " adapter"},
        {{"model.preset=\"bert-huge\""}, "model.preset: unknown preset 'bert-huge'"},
        {{"model.vocab=100"}, "model.vocab: the data's 256 ids and [PAD], [CLS], [SEP], [MASK] need at least 260, got 100"},
        {{"model.mask_prob=0"}, "model.mask_prob: expected a number in (0, 1), got 0"},
        {{"model.heads=3"}, "model.hidden (128) must be divisible by model.heads (3)"},
        {{"model.layers=0"}, "model.layers: expected a positive integer, got 0"},
        {{"model.seq_len=4"}, "model.seq_len: expected at least 8, got 4"},
        {{"model.data=\"/nonexistent/corpus\""}, "model.data: no such file or folder: /nonexistent/corpus"},
        {{"model.data=\"" + two_lines + "\""}, "model.data: " + two_lines + " has 2 non-blank lines"},
        {{"model.val_fraction=1.5"}, "model.val_fraction: expected a number in (0, 1), got 1.5"},
    };
    for (const auto& c : cases) {
      JobResult r = run_job(1, plugin_path(adapter), source_path("configs/" + adapter + ".toml"),
                            with(c.sets, {"train.steps=1", "run.log_to_file=false"}));
      EXPECT_NE(r.exit_code, 0) << adapter << ": " << c.message;
      EXPECT_NE(r.output.find(c.message), std::string::npos) << "expected: " << c.message << "\n" << r.output;
    }
  }
}

}  // namespace
}  // namespace smp::testing
