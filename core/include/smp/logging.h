// Process-wide logging through spdlog's default logger; every line carries the rank.
#pragma once

#include <string>

// Exported from libsmp_core (built with hidden visibility): the public API.
#pragma GCC visibility push(default)
namespace smp::logging {

// Replaces spdlog's default logger with one whose lines read
// "[12:00:01.123] [rank 3] [info] message":
//   - console: info and above to stderr (rank 0); otherwise only errors go to stderr;
//   - log_to_file and run_dir not empty: everything (debug and above) also to
//     <run_dir>/logs/rank-<rank>.log (appended, so restarts keep history).
// SMP_LOG_LEVEL (debug|info|warn|error) overrides the console level.
// Safe to call more than once (the previous logger is replaced). Throws
// smp::Error when the log file can't be created.
void init(int rank, int world, const std::string& run_dir, bool log_to_file, bool console);

// The log file path init() would use ("" when none).
std::string log_file_path(const std::string& run_dir, int rank);

}  // namespace smp::logging
#pragma GCC visibility pop
