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

}  // namespace
}  // namespace smp::testing
