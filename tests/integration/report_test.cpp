// The run report: a finished run leaves <run.dir>/report.html, self-contained
// (no scripts, no external references) with one SVG chart per view, each
// well-formed XML; the loss line has a point per step; smp-report redraws it
// from summary.json alone and names what is missing.
#include "job_runner.h"

#include <gtest/gtest.h>

#include <boost/filesystem.hpp>
#include <boost/property_tree/ptree.hpp>
#include <boost/property_tree/xml_parser.hpp>

#include <fstream>
#include <sstream>

namespace smp::testing {
namespace {

std::string read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<std::string> svgs_of(const std::string& html) {
  std::vector<std::string> out;
  for (size_t at = html.find("<svg"); at != std::string::npos; at = html.find("<svg", at + 1))
    out.push_back(html.substr(at, html.find("</svg>", at) + 6 - at));
  return out;
}

std::vector<nlohmann::json> jsonl(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

// <run.dir>/metrics.jsonl: rank 0's progress, a JSON object per line (start,
// each logged step, each validation); a second run in the same run.dir appends
// after the first's lines instead of replacing them.
TEST(Report, ProgressIsAppendedToMetricsJsonl) {
  const std::vector<std::string> sets = {"parallel.dp=2", "train.steps=4", "train.log_every=2", "train.val_every=2",
                                         "run.dump_parameters=false"};
  JobResult r = run_job(2, plugin_path("gpt"), source_path("tests/integration/data/gpt-equiv.toml"), sets);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<nlohmann::json> lines = jsonl(r.run_dir + "/metrics.jsonl");
  std::vector<std::string> events;
  for (const auto& l : lines) events.push_back(l.at("event").get<std::string>());
  EXPECT_EQ(events, (std::vector<std::string>{"start", "step", "validation", "step", "validation"}));
  ASSERT_EQ(lines.size(), 5u);
  EXPECT_EQ(lines[0]["steps"], 4);
  EXPECT_EQ(lines[0]["layout"]["dp"], 2);
  EXPECT_EQ(lines[1]["step"], 2);
  EXPECT_DOUBLE_EQ(lines[3]["loss"].get<double>(), r.summary["losses"][3].get<double>());
  EXPECT_DOUBLE_EQ(lines[3]["grad_norm"].get<double>(), r.summary["grad_norms"][3].get<double>());
  EXPECT_DOUBLE_EQ(lines[4]["validation"]["loss"].get<double>(), r.summary["val_loss"].get<double>());
  JobResult again = run_job(2, plugin_path("gpt"), source_path("tests/integration/data/gpt-equiv.toml"),
                            with(sets, {"run.dir=" + r.run_dir}));
  ASSERT_EQ(again.exit_code, 0) << again.output;
  const std::vector<nlohmann::json> both = jsonl(r.run_dir + "/metrics.jsonl");
  ASSERT_EQ(both.size(), 10u);
  EXPECT_EQ(both[0], lines[0]);
  EXPECT_EQ(both[5]["event"], "start");
}

TEST(Report, EveryRunWritesASelfContainedReport) {
  JobResult r = run_job(2, plugin_path("gpt"), source_path("tests/integration/data/gpt-equiv.toml"),
                        {"parallel.pp=2", "train.steps=5", "train.val_every=2", "run.dump_parameters=false"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string html = read(r.run_dir + "/report.html");
  ASSERT_FALSE(html.empty());
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("http://"), html.find("http://www.w3.org/2000/svg"));  // only the SVG namespace
  EXPECT_EQ(html.find("https://"), std::string::npos);
  const auto svgs = svgs_of(html);
  ASSERT_EQ(svgs.size(), 6u);
  for (const char* title : {"Loss per step", "Throughput per step", "MFU per step", "Memory per rank",
                            "Time per phase per rank", "Bytes per communicator group"})
    EXPECT_NE(html.find(title), std::string::npos) << title;
  for (const auto& svg : svgs) {  // each chart is well-formed XML
    std::istringstream in(svg);
    boost::property_tree::ptree tree;
    EXPECT_NO_THROW(boost::property_tree::read_xml(in, tree)) << svg.substr(0, 200);
  }
  // The loss line: a point per step; validation at steps 2, 4 and the end (5) as dots.
  const std::string& loss = svgs[0];
  const size_t points = loss.find("points=\"") + 8;
  std::istringstream coords(loss.substr(points, loss.find('"', points) - points));
  std::string pair;
  int n = 0;
  while (coords >> pair) ++n;
  EXPECT_EQ(n, 5);
  int dots = 0;
  for (size_t at = loss.find("<circle"); at != std::string::npos; at = loss.find("<circle", at + 1)) ++dots;
  EXPECT_EQ(dots, 3);

  // smp-report redraws it from summary.json alone.
  const std::string first = html;
  boost::filesystem::remove(r.run_dir + "/report.html");
  const std::string report = std::string(SMP_BIN_DIR) + "/smp-report";
  EXPECT_EQ(std::system((report + " " + r.run_dir + " > /dev/null").c_str()), 0);
  EXPECT_EQ(read(r.run_dir + "/report.html"), first);
  const std::string missing = r.run_dir + "/nope";
  const std::string cmd = report + " " + missing + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  char buf[512];
  std::string out;
  while (fgets(buf, sizeof buf, p)) out += buf;
  EXPECT_NE(pclose(p), 0);
  EXPECT_NE(out.find("cannot read " + missing + "/summary.json"), std::string::npos) << out;
}

// summary.json on a CPU run: MFU against the measured GEMM peak (no datasheet
// figure for a CPU), labelled so, with both MFU fields; and the parameters
// counted once: the tied LM head is the embedding's weight, not a second one,
// whether both sit on one rank or the head's replica on the last pp stage.
TEST(Report, SummaryStatesItsPeakBasisAndCountsTiedParametersOnce) {
  const std::string config = source_path("tests/integration/data/gpt-equiv.toml");
  const std::vector<std::string> sets = {"train.steps=2", "train.val_batches=0", "run.dump_parameters=false"};
  JobResult serial = run_job(1, plugin_path("gpt"), config, with(sets, {"run.dump_parameters=true"}));
  ASSERT_EQ(serial.exit_code, 0) << serial.output;
  const nlohmann::json& s = serial.summary;
  EXPECT_EQ(s["device"], "cpu");
  EXPECT_EQ(s["device_name"], "cpu");
  EXPECT_EQ(s["peak_basis"], "measured GEMM (no datasheet figure for cpu)");
  EXPECT_TRUE(s["peak_flops_datasheet_per_rank"].is_null()) << s["peak_flops_datasheet_per_rank"];
  EXPECT_EQ(s["peak_flops_dtype"], "fp32");
  EXPECT_EQ(s["peak_flops_gemm"], "fp32");
  ASSERT_TRUE(s["peak_flops_per_rank"].is_number());
  EXPECT_GT(s["peak_flops_per_rank"].get<double>(), 0);
  EXPECT_GT(s["mfu"].get<double>(), 0);
  EXPECT_DOUBLE_EQ(s["mfu"].get<double>(), s["mfu_measured_peak"].get<double>());
  EXPECT_NEAR(s["mfu"].get<double>(),
              s["model_flops_per_s"].get<double>() / s["peak_flops_per_rank"].get<double>(), 1e-12);
  EXPECT_NE(serial.output.find("MFU is against the measured GEMM peak: no datasheet figure for cpu"), std::string::npos)
      << serial.output;
  // metrics.jsonl's steps carry both MFUs too.
  std::vector<nlohmann::json> lines = jsonl(serial.run_dir + "/metrics.jsonl");
  ASSERT_GE(lines.size(), 2u);
  EXPECT_TRUE(lines[1].contains("mfu_measured_peak")) << lines[1];

  // The parameters the run dumped, each name once (the tied head has no
  // tensor of its own): what parameter_count must equal.
  std::string problem;
  int64_t dumped = 0;
  for (const auto& [name, t] : assemble_parameters(serial.run_dir, 0, &problem)) dumped += t.numel();
  ASSERT_TRUE(problem.empty()) << problem;
  ASSERT_GT(dumped, 0);
  // 4 GPT-2 blocks of hidden 32, ffn 128; wte 256 x 32 (tied head); wpe 16 x 32; final LayerNorm.
  const int64_t h = 32, V = 256, expected = V * h + 16 * h + 4 * (12 * h * h + 13 * h) + 2 * h;
  EXPECT_EQ(dumped, expected);
  EXPECT_EQ(s["parameter_count"].get<int64_t>(), expected);
  EXPECT_NE(serial.output.find(std::to_string(expected) + " parameters"), std::string::npos) << serial.output;

  // pp 2: the embedding on the first stage, the tied head's replica on the
  // last; tp 2: every weight sharded or replicated; dp 2: replicas (under
  // ZeRO-3, shards of them). Once each.
  const std::vector<std::vector<std::string>> layouts = {
      {"parallel.pp=2"}, {"parallel.tp=2"}, {"parallel.dp=2"}, {"parallel.dp=2", "parallel.zero=3"}};
  for (const auto& layout : layouts) {
    JobResult r = run_job(2, plugin_path("gpt"), config, with(sets, layout));
    ASSERT_EQ(r.exit_code, 0) << layout.back() << "\n" << r.output;
    EXPECT_EQ(r.summary["parameter_count"].get<int64_t>(), expected) << layout.back();
    EXPECT_EQ(r.summary["peak_basis"], "measured GEMM (no datasheet figure for cpu)") << layout.back();
  }
  // An untied head is a weight of its own, and counts.
  JobResult untied = run_job(1, plugin_path("gpt"), config, with(sets, {"model.tie_embeddings=false"}));
  ASSERT_EQ(untied.exit_code, 0) << untied.output;
  EXPECT_EQ(untied.summary["parameter_count"].get<int64_t>(), expected + V * h);
}

}  // namespace
}  // namespace smp::testing
