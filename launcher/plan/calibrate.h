// smp-plan --calibrate: a cluster file for this machine, measured. Each rank
// is a process with `threads` intra-op threads: the node holds cores /
// threads of them, each with MemTotal / that much memory. Measured:
//   - fp32 GEMMs of sizes 32 to 2048 (square, best of 5): the fastest is the
//     peak, each size's rate over it the efficiency curve; bf16 at 1024,
//     scaled by fp32's efficiency there, is the bf16 peak;
//   - the memory bandwidth: a 256 MB copy (read and write), best of 5;
//   - the links, between two forked processes through smp's Communicator:
//     shared memory inside the node, Gloo over loopback TCP between nodes;
//     the latency from an all-reduce of 4 bytes, the bandwidth from one of
//     64 MB (a 2-rank ring moves the bytes once: t = bytes / bw + 2 latency).
#pragma once

#include <string>

namespace smp::plan {

// Measures, writes the TOML to `path` and returns it.
std::string calibrate(const std::string& path, int threads);

}  // namespace smp::plan
