// The worker's side of elastic runs: SMP_ELASTIC's re-formation record read
// bounded and never throwing (trainer/elastic_record.h), the notices to
// smp-launch through SMP_HEARTBEAT_FD ("step <n>", "committed <n>":
// smp::notify_launcher), and the report's marks at each re-formation.
#include "../../trainer/elastic_record.h"
#include "../../trainer/heartbeat.h"
#include "../../trainer/run_report.h"

#include <smp/process_env.h>

#include <gtest/gtest.h>

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <string>

namespace smp {
namespace {

const char* kValid = R"j({"round": 2, "reformations": [
  {"round": 1, "reason": "lost node b (its launcher's connection closed)", "previous_world": 4, "world": 2,
   "nodes": ["a"], "layout": ["parallel.pp=1", "parallel.dp=2"], "noticed_unix": 1765000000.123,
   "resumed_step": 10, "first_step_seconds": 7.2},
  {"round": 2, "reason": "node c joined", "previous_world": 2, "world": 4, "nodes": ["a", "c"],
   "layout": ["parallel.dp=4"], "noticed_unix": 1765000100.5}]})j";

TEST(ElasticEnv, AValidRecordHasEveryEntryAndTheCurrentOne) {
  std::string warning = "stale";
  const auto rec = parse_elastic_env(kValid, &warning);
  ASSERT_TRUE(rec) << warning;
  EXPECT_EQ(warning, "");
  EXPECT_EQ(rec->round, 2);
  ASSERT_EQ(rec->reformations.size(), 2u);
  const ElasticReformation& first = rec->reformations[0];
  EXPECT_EQ(first.reason, "lost node b (its launcher's connection closed)");
  EXPECT_EQ(first.previous_world, 4);
  EXPECT_EQ(first.world, 2);
  EXPECT_EQ(first.nodes, std::vector<std::string>{"a"});
  EXPECT_EQ(first.layout, (std::vector<std::string>{"parallel.pp=1", "parallel.dp=2"}));
  EXPECT_DOUBLE_EQ(first.noticed_unix, 1765000000.123);
  EXPECT_EQ(first.resumed_step, 10);
  EXPECT_DOUBLE_EQ(first.first_step_seconds.value_or(0), 7.2);
  const ElasticReformation* now = rec->current();
  ASSERT_NE(now, nullptr);
  EXPECT_EQ(now->round, 2);
  EXPECT_FALSE(now->resumed_step);
  EXPECT_FALSE(now->first_step_seconds);
  const nlohmann::json j = rec->to_json();
  EXPECT_EQ(j["round"], 2);
  EXPECT_EQ(j["reformations"][0]["resumed_step"], 10);
  EXPECT_TRUE(j["reformations"][1]["resumed_step"].is_null());
  EXPECT_EQ(j["reformations"][1]["nodes"], nlohmann::json({"a", "c"}));
}

TEST(ElasticEnv, RoundZeroHasNoEntryAndNoVariableNoRecord) {
  std::string warning;
  const auto rec = parse_elastic_env(R"({"round": 0, "reformations": []})", &warning);
  ASSERT_TRUE(rec) << warning;
  EXPECT_EQ(rec->current(), nullptr);
  EXPECT_FALSE(parse_elastic_env(nullptr, &warning));
  EXPECT_EQ(warning, "");
  EXPECT_FALSE(parse_elastic_env("", &warning));
  EXPECT_EQ(warning, "");
  // Optional fields may be absent (or null); the current round's entry alone is enough.
  EXPECT_TRUE(parse_elastic_env(
      R"({"round": 1, "reformations": [{"round": 1, "previous_world": 2, "world": 1, "noticed_unix": 5,
          "resumed_step": null}]})",
      &warning))
      << warning;
}

TEST(ElasticEnv, TooLongIsIgnoredWithAWarning) {
  std::string text = R"({"round": 0, "reformations": [], "pad": ")";
  text += std::string(kMaxElasticEnvBytes, 'x') + "\"}";
  std::string warning;
  EXPECT_FALSE(parse_elastic_env(text.c_str(), &warning));
  EXPECT_NE(warning.find("SMP_ELASTIC"), std::string::npos) << warning;
  EXPECT_NE(warning.find("65536 bytes"), std::string::npos) << warning;
}

TEST(ElasticEnv, MalformedJsonIsIgnoredWithAWarning) {
  for (const char* text : {"{", "round=2", R"({"round": 2, "reformations": [)", "[1, 2]", "null",
                           "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]"
                           "]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]"}) {
    std::string warning;
    EXPECT_FALSE(parse_elastic_env(text, &warning)) << text;
    EXPECT_EQ(warning.rfind("SMP_ELASTIC: ", 0), 0u) << text << ": " << warning;
  }
  std::string deep(100000, '[');  // longer than the bound: refused before parsing
  std::string warning;
  EXPECT_FALSE(parse_elastic_env(deep.c_str(), &warning));
  EXPECT_NE(warning.find("SMP_ELASTIC"), std::string::npos);
}

TEST(ElasticEnv, WrongTypesAreIgnoredWithAWarningNamingTheField) {
  struct Case {
    const char* text;
    const char* field;
  };
  const Case cases[] = {
      {R"({"round": "2", "reformations": []})", "round"},
      {R"({"round": -1, "reformations": []})", "round"},
      {R"({"round": 1.5, "reformations": []})", "round"},
      {R"({"round": 0})", "reformations"},
      {R"({"round": 0, "reformations": {}})", "reformations"},
      {R"({"round": 1, "reformations": [3]})", "reformations[0]"},
      {R"({"round": 1, "reformations": [{"round": 1, "previous_world": "4", "world": 2, "noticed_unix": 1}]})",
       "reformations[0].previous_world"},
      {R"({"round": 1, "reformations": [{"round": 1, "previous_world": 4, "world": 2, "noticed_unix": "x"}]})",
       "reformations[0].noticed_unix"},
      {R"({"round": 1, "reformations": [{"round": 1, "previous_world": 4, "world": 2}]})",
       "reformations[0].noticed_unix"},
      {R"({"round": 1, "reformations": [{"round": 1, "previous_world": 4, "world": 2, "noticed_unix": 1,
           "nodes": ["a", 7]}]})",
       "reformations[0].nodes"},
      {R"({"round": 1, "reformations": [{"round": 1, "previous_world": 4, "world": 2, "noticed_unix": 1,
           "reason": 3}]})",
       "reformations[0].reason"},
      {R"({"round": 1, "reformations": [{"round": 1, "previous_world": 4, "world": 2, "noticed_unix": 1,
           "resumed_step": "10"}]})",
       "reformations[0].resumed_step"},
      {R"({"round": 1, "reformations": [{"round": 3, "previous_world": 4, "world": 2, "noticed_unix": 1}]})",
       "reformations[0].round"},
      {R"({"round": 1, "reformations": [{"round": 1, "previous_world": 4, "world": 99999999999999999999,
           "noticed_unix": 1}]})",
       "reformations[0].world"},
  };
  for (const Case& c : cases) {
    std::string warning;
    EXPECT_FALSE(parse_elastic_env(c.text, &warning)) << c.text;
    EXPECT_EQ(warning.rfind("SMP_ELASTIC: ", 0), 0u) << warning;
    EXPECT_NE(warning.find(c.field), std::string::npos) << c.field << " in: " << warning;
  }
}

TEST(ElasticEnv, ARecordWithoutTheCurrentRoundsEntryIsIgnored) {
  std::string warning;
  EXPECT_FALSE(parse_elastic_env(
      R"({"round": 2, "reformations": [{"round": 1, "previous_world": 4, "world": 2, "noticed_unix": 1}]})",
      &warning));
  EXPECT_NE(warning.find("SMP_ELASTIC"), std::string::npos);
  EXPECT_NE(warning.find("current round 2"), std::string::npos) << warning;
  EXPECT_FALSE(parse_elastic_env(R"({"round": 1, "reformations": []})", nullptr));  // no warning asked for
}

// The launcher's pipe: one line per notice; nothing without the variable or
// with a descriptor that is not open.
class LauncherNotices : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(::pipe(fds_), 0);
    ::setenv("SMP_HEARTBEAT_FD", std::to_string(fds_[1]).c_str(), 1);
  }
  void TearDown() override {
    ::unsetenv("SMP_HEARTBEAT_FD");
    ::close(fds_[0]);
    ::close(fds_[1]);
  }
  std::string drain() {
    ::fcntl(fds_[0], F_SETFL, ::fcntl(fds_[0], F_GETFL) | O_NONBLOCK);
    std::string out;
    char buf[4096];
    ssize_t n;
    while ((n = ::read(fds_[0], buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
    return out;
  }
  int fds_[2] = {-1, -1};
};

TEST_F(LauncherNotices, LinesGoThroughThePipeWholeAndNeverBlock) {
  notify_launcher("committed 20");
  Heartbeat beat(30);
  beat.step(21);
  beat.beat();
  EXPECT_EQ(drain(), "committed 20\ntimeout 30\nstep 21\nbeat\n");
  EXPECT_TRUE(::fcntl(fds_[1], F_GETFL) & O_NONBLOCK);
  EXPECT_TRUE(::fcntl(fds_[1], F_GETFD) & FD_CLOEXEC);
  notify_launcher(std::string(1000, 'x'));  // cut to 256 bytes, still one line
  EXPECT_EQ(drain(), std::string(256, 'x') + "\n");
  // A full pipe drops the line instead of blocking the step.
  for (int i = 0; i < 100000; ++i) notify_launcher("step " + std::to_string(i));
  EXPECT_FALSE(drain().empty());
}

TEST_F(LauncherNotices, NothingWithoutAnOpenDescriptor) {
  ::unsetenv("SMP_HEARTBEAT_FD");
  notify_launcher("beat");
  ::setenv("SMP_HEARTBEAT_FD", "seven", 1);
  notify_launcher("beat");
  ::setenv("SMP_HEARTBEAT_FD", "1000000", 1);
  notify_launcher("beat");
  EXPECT_EQ(launcher_notice_fd(), -1);
  EXPECT_EQ(drain(), "");
}

TEST(ElasticReport, TheLossCurveMarksEachReformationAtItsResumedStep) {
  auto rec = parse_elastic_env(kValid, nullptr);
  ASSERT_TRUE(rec);
  rec->current()->resumed_step = 14;
  rec->current()->first_step_seconds = 3.5;
  const nlohmann::json s = {{"losses", {2.0, 1.9, 1.8, 1.7}},
                            {"first_step", 14},
                            {"val_losses", nlohmann::json::array()},
                            {"layout", {{"world", 4}}},
                            {"elastic", rec->to_json()}};
  const std::string html = render_report(s);
  const std::string loss = html.substr(html.find("Loss per step"), html.find("Throughput per step") - html.find("Loss per step"));
  // Round 2 resumed at step 14, the left edge of this run's steps 15..18;
  // round 1's step 10 is before this run's curve.
  EXPECT_NE(loss.find("world 2\u21924"), std::string::npos);
  EXPECT_EQ(loss.find("world 4\u21922"), std::string::npos);
  EXPECT_NE(loss.find("stroke-dasharray"), std::string::npos);
  EXPECT_NE(loss.find(">14</text>"), std::string::npos) << "the step axis starts at the resumed step";
  // Both re-formations in the table.
  EXPECT_NE(html.find("re-formation, round 1"), std::string::npos);
  EXPECT_NE(html.find("first step 3.5 s after the change was noticed (node c joined)"), std::string::npos);
  // A summary without elastic: no marks.
  nlohmann::json plain = s;
  plain.erase("elastic");
  EXPECT_EQ(render_report(plain).find("stroke-dasharray"), std::string::npos);
}

}  // namespace
}  // namespace smp
