// <run.dir>/metrics.jsonl: rank 0's progress as one JSON object per line,
// flushed per line, so that `tail -f` or a dashboard can follow a run. Each
// run appends (a line {"event": "start", ...} first), so an earlier run's
// lines in the same run.dir are kept.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <fstream>
#include <string>

namespace smp {

class MetricsLog {
 public:
  MetricsLog() = default;  // writes nothing (ranks other than 0)
  // Opens <run_dir>/metrics.jsonl for appending; throws an Error naming run.dir.
  explicit MetricsLog(const std::string& run_dir);
  // One line; throws an Error naming the file when it cannot be written.
  void write(const nlohmann::json& line);

 private:
  std::string path_;
  std::ofstream out_;
};

}  // namespace smp
