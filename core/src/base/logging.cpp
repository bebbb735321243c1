// smp::logging: spdlog's default logger, tagged with the rank.
#include <smp/error.h>
#include <smp/logging.h>

#include "base/runtime_logging.h"

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

// Boost, not std::filesystem: pip torch's libtorch.so exports its own copy of
// std::filesystem, which interposes on libstdc++'s (remove_all crashed through it).
#include <boost/filesystem.hpp>

namespace smp::logging {

namespace {

spdlog::level::level_enum level_from_env(spdlog::level::level_enum fallback) {
  const char* v = std::getenv("SMP_LOG_LEVEL");
  if (!v || !*v) return fallback;
  std::string s(v);
  if (s == "trace") return spdlog::level::trace;
  if (s == "debug") return spdlog::level::debug;
  if (s == "info") return spdlog::level::info;
  if (s == "warn" || s == "warning") return spdlog::level::warn;
  if (s == "error") return spdlog::level::err;
  if (s == "off") return spdlog::level::off;
  return fallback;
}

// Who set up the default logger last: nobody (spdlog's stock one, or the
// program's own), init() (smp-worker, a program), or init_for_runtime.
struct Setup {
  std::mutex mu;
  enum { None, Explicit, ForRuntime } by = None;
  std::string runtime_key;  // rank and log file folder of the last init_for_runtime
};
Setup& setup() {
  static Setup s;
  return s;
}

void install(int rank, const std::string& run_dir, bool log_to_file, bool console) {
  std::vector<spdlog::sink_ptr> sinks;
  // One stderr sink: info and above on the console rank, errors only elsewhere.
  auto err_sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
  err_sink->set_level(console ? level_from_env(spdlog::level::info) : spdlog::level::err);
  sinks.push_back(err_sink);
  if (log_to_file && !run_dir.empty()) {
    const std::string path = log_file_path(run_dir, rank);
    try {
      boost::filesystem::create_directories(boost::filesystem::path(path).parent_path());
      auto file_sink = std::make_shared<spdlog::sinks::basic_file_sink_mt>(path, /*truncate=*/false);
      file_sink->set_level(spdlog::level::debug);
      sinks.push_back(file_sink);
    } catch (const std::exception& e) {
      throw Error("run.dir: cannot open the log file " + path + " (run.log_to_file = true): " + e.what());
    }
  }
  auto logger = std::make_shared<spdlog::logger>("smp", sinks.begin(), sinks.end());
  logger->set_pattern("[%H:%M:%S.%e] [rank " + std::to_string(rank) + "] [%l] %v");
  logger->set_level(spdlog::level::debug);
  logger->flush_on(spdlog::level::info);
  // set_default_logger replaces (and unregisters) the previous default logger.
  spdlog::drop("smp");
  spdlog::set_default_logger(logger);
}

}  // namespace

std::string log_file_path(const std::string& run_dir, int rank) {
  if (run_dir.empty()) return "";
  return (boost::filesystem::path(run_dir) / "logs" / ("rank-" + std::to_string(rank) + ".log")).string();
}

void init(int rank, int world, const std::string& run_dir, bool log_to_file, bool console) {
  (void)world;
  Setup& st = setup();
  std::lock_guard<std::mutex> lock(st.mu);
  install(rank, run_dir, log_to_file, console);
  st.by = Setup::Explicit;
}

void init_for_runtime(int rank, int world, const std::string& run_dir, bool log_to_file) {
  (void)world;
  Setup& st = setup();
  std::lock_guard<std::mutex> lock(st.mu);
  if (st.by == Setup::Explicit) return;
  const std::string name = spdlog::default_logger() ? spdlog::default_logger()->name() : "";
  if (!name.empty() && name != "smp") return;  // the program's own logger
  // The folder matters only with a file: runtimes in a row without one keep the logger.
  const std::string key = std::to_string(rank) + (log_to_file && !run_dir.empty() ? "\n" + run_dir : "");
  if (st.by == Setup::ForRuntime && st.runtime_key == key && name == "smp") return;
  install(rank, run_dir, log_to_file, rank == 0);
  st.by = Setup::ForRuntime;
  st.runtime_key = key;
}

}  // namespace smp::logging
