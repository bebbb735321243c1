// The job configuration (core/src/base/config.cpp, job_config.cpp): the input
// is a TOML job file, optionally followed by a line "#--set" (a TOML comment,
// so the file part stays plain TOML) and `--set key=value` overrides, one a
// line. It goes the way smp-launch and the worker take it: Config::load on
// the file with the overrides, resolve_layout for a world of 8, JobConfig::from.
#include "support/fuzz_target.h"

#include <smp/config.h>
#include <smp/job_config.h>

#include <sstream>

SMP_FUZZ_TARGET(config) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  static const std::string marker = "\n#--set\n";
  const size_t cut = text.find(marker);
  std::vector<std::string> overrides;
  if (cut != std::string::npos) {
    std::istringstream lines(text.substr(cut + marker.size()));
    for (std::string line; std::getline(lines, line);) overrides.push_back(line);
  }
  const std::string path = smp::fuzz::work_dir() + "/job.toml";
  smp::fuzz::write_file(path, std::string_view(text).substr(0, cut == std::string::npos ? text.size() : cut + 1));
  smp::Config c = smp::Config::load(path, overrides);
  (void)c.to_json().dump();
  c.resolve_layout(8);
  const smp::JobConfig job = smp::JobConfig::from(c);
  (void)job.parallel_json.dump();
}
