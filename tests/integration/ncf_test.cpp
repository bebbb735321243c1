// The NCF adapter end to end: its preset learns the planted structure (HR@10
// well above the popularity ranking the adapter logs), MovieLens files load
// (both formats), and bad keys and data files are named. Serial equivalence is
// in equivalence_test (NcfEquivalence).
#include "job_runner.h"

#include <gtest/gtest.h>

#include <boost/filesystem.hpp>

#include <fstream>
#include <regex>

namespace smp::testing {
namespace {

std::string preset() { return source_path("configs/ncf.toml"); }

JobResult run_ncf(const std::string& config, const std::vector<std::string>& sets) {
  return run_job(1, plugin_path("ncf"), config, with({"run.log_to_file=false"}, sets));
}

// "popularity baseline HR@10 0.249000" from the adapter's log line.
double popularity_hr(const std::string& output) {
  std::smatch m;
  if (!std::regex_search(output, m, std::regex("popularity baseline HR@10 ([0-9.]+)"))) return -1;
  return std::stod(m[1].str());
}

// The preset (3000 steps, a few seconds): the model ranks the held-out item
// among 100 at least twice as often into the top 10 as popularity does.
TEST(Ncf, PresetBeatsPopularityOnHitRate) {
  JobResult r = run_ncf(preset(), {});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const double baseline = popularity_hr(r.output);
  ASSERT_GT(baseline, 0) << r.output;
  const auto& vals = r.summary["val_losses"];
  ASSERT_GE(vals.size(), 2u);
  const double first = vals.front()["hr@10"].get<double>(), last = r.summary["val_metrics"]["hr@10"].get<double>();
  std::printf("[ ncf ] popularity HR@10 %.3f; model HR@10 %.3f at step %d, %.3f at the end (NDCG@10 %.3f)\n", baseline,
              first, vals.front()["step"].get<int>(), last, r.summary["val_metrics"]["ndcg@10"].get<double>());
  EXPECT_GE(last, 2.0 * baseline);
  EXPECT_GT(last, first);
}

std::string write_file(const std::string& name, const std::string& text) {
  const auto dir = boost::filesystem::temp_directory_path() / boost::filesystem::unique_path("smp-ncf-%%%%-%%%%");
  boost::filesystem::create_directories(dir);
  const std::string path = (dir / name).string();
  std::ofstream(path) << text;
  return path;
}

// Ratings of 6 users over 5 items; user 6 has one rating only (dropped: leave-one-out needs two).
std::string ratings(const std::string& sep) {
  std::string out;
  const int rows[][3] = {{1, 10, 100}, {1, 20, 101}, {1, 30, 102}, {2, 10, 103}, {2, 40, 104}, {3, 20, 105},
                         {3, 50, 106}, {3, 30, 107}, {4, 10, 108}, {4, 50, 109}, {5, 40, 110}, {5, 30, 111},
                         {6, 10, 112}};
  for (const auto& r : rows)
    out += std::to_string(r[0]) + sep + std::to_string(r[1]) + sep + "4" + sep + std::to_string(r[2]) + "\n";
  return out;
}

TEST(Ncf, LoadsMovieLensFiles) {
  for (const auto& [name, sep] : std::vector<std::pair<std::string, std::string>>{{"ratings.dat", "::"},
                                                                                   {"u.data", "\t"}}) {
    const std::string path = write_file(name, ratings(sep));
    JobResult r = run_ncf(preset(), {"model.data=\"" + path + "\"", "train.steps=2", "train.batch_size=4",
                                     "train.val_every=0", "train.val_batches=1", "model.eval_negatives=1",
                                     "model.negatives=1"});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("5 users, 5 items, 12 interactions (7 for training)"), std::string::npos) << r.output;
  }
}

TEST(Ncf, BadKeysAndDataFilesAreNamed) {
  const std::string bad_line = write_file("ratings.dat", "1::10::4::100\n1::twenty::4::101\n");
  struct Case {
    std::vector<std::string> sets;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"model.users=0"}, "model.users: expected a positive integer, got 0"},
      {{"model.factor=8"}, "model.factor: unknown key for the ncf adapter"},
      {{"model.interactions_per_user=500"}, "model.interactions_per_user: expected 2 to items - 1 (499), got 500"},
      {{"model.mlp_layers=[63, 8]"}, "model.mlp_layers: expected at least two sizes, the first even"},
      {{"model.data=\"/nonexistent/ratings.dat\""}, "model.data: cannot open '/nonexistent/ratings.dat'"},
      {{"model.data=\"" + bad_line + "\""}, "model.data: " + bad_line + ":2: expected 'user::item::rating::timestamp'"},
      {{"model.data=\"" + bad_line + "\"", "model.users=10"}, "model.users: only for data = \"synthetic\""},
  };
  for (const auto& c : cases) {
    JobResult r = run_ncf(preset(), with(c.sets, {"train.steps=1"}));
    EXPECT_NE(r.exit_code, 0) << c.message;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << "expected: " << c.message << "\n" << r.output;
  }
}

}  // namespace
}  // namespace smp::testing
