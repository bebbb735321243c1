#include "metrics_log.h"

#include <smp/error.h>

#include <boost/filesystem.hpp>
#include <nlohmann/json.hpp>

namespace smp {

MetricsLog::MetricsLog(const std::string& run_dir)
    : path_((boost::filesystem::path(run_dir) / "metrics.jsonl").string()), out_(path_, std::ios::app) {
  if (!out_) throw Error("run.dir: cannot open " + path_ + " for appending");
}

void MetricsLog::write(const nlohmann::json& line) {
  if (path_.empty()) return;
  out_ << line.dump() << '\n';
  out_.flush();
  if (!out_) throw Error("run.dir: cannot write " + path_);
}

}  // namespace smp
