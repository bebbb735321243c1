// smp-report <run.dir>: (re)draws <run.dir>/report.html from <run.dir>/summary.json
// (self-contained HTML with inline SVG charts; see trainer/run_report.h).
// Plain C++ over nlohmann::json: no LibTorch, starts at once.
#include "trainer/run_report.h"

#include <smp/sdk/input_file.hpp>

#include <nlohmann/json.hpp>

#include <sys/stat.h>

#include <fstream>
#include <iostream>

int main(int argc, char** argv) {
  if (argc != 2 || std::string(argv[1]) == "-h" || std::string(argv[1]) == "--help") {
    std::cerr << "usage: smp-report <run.dir>   writes <run.dir>/report.html from <run.dir>/summary.json\n";
    return argc == 2 ? 0 : 2;
  }
  const std::string dir = argv[1], path = dir + "/summary.json";
  // Under the reading discipline: a regular file, bounded, nesting bounded.
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    std::cerr << "smp-report: cannot read " << path << " (is " << dir << " a run.dir of a finished run?)\n";
    return 1;
  }
  nlohmann::json summary;
  try {
    summary = smp::input::read_json(path, "summary.json of a run", 256 * smp::input::kMiB);
  } catch (const std::exception& e) {
    std::cerr << "smp-report: " << e.what() << " (is " << dir << " a run.dir of a finished run?)\n";
    return 1;
  }
  if (!summary.is_object()) {
    std::cerr << "smp-report: " << path << " is not a run's summary (a JSON object)\n";
    return 1;
  }
  try {
    // Written atomically: a full disk leaves the old report.html, and names it.
    std::cout << smp::write_report(dir, summary) << "\n";
  } catch (const std::exception& e) {
    std::cerr << "smp-report: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
