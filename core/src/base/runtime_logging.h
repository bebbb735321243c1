// smp's logger for a runtime the program drives itself (smp-worker sets it up
// with smp::logging::init before its runtime; a program seldom does).
#pragma once

#include <string>

namespace smp::logging {

// What smp::logging::init(rank, world, run_dir, log_to_file, rank == 0) does,
// for Runtime::create: unless the process chose its logging already (init()
// was called, or spdlog's default logger is the program's own, named), smp's
// logger replaces spdlog's stock one, so that each rank writes
// <run_dir>/logs/rank-<rank>.log under run.log_to_file as a training loop's
// runs do. A later runtime in the process with another folder or rank sets it
// up again; the same one keeps it.
void init_for_runtime(int rank, int world, const std::string& run_dir, bool log_to_file);

}  // namespace smp::logging
