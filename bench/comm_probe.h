// `smp-bench allreduce-probe`: the cost of a dp=2 gradient all-reduce on this machine
// through smp's Communicator (Gloo and shared memory, two forked processes)
// and whether the transfer hides behind a 1-thread GEMM loop. See comm_probe.cpp.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>

namespace bench {

nlohmann::json run_allreduce_probe(int64_t bytes, int reps);

}  // namespace bench
