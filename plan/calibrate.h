// smp-plan --calibrate: a cluster file for this machine, measured. Each rank
// is a process with `threads` intra-op threads: the node holds cores /
// threads of them, each with MemTotal / that much memory. Two forked
// processes measure, through smp's Communicator:
//   - the links: shared memory inside the node, Gloo over loopback TCP
//     between nodes; the latency from an all-reduce of 4 bytes, the bandwidth
//     from one of 64 MB (a 2-rank ring moves the bytes once: t = bytes / bw +
//     2 latency); and the all-to-all as expert parallelism pays it in a step,
//     through the shared-memory group between computations (8 bytes, 4 MB);
// and then, both at once (what a rank gets while its neighbours train):
//   - fp32 GEMMs as a linear layer's step does them (forward, input and
//     weight gradients; rows 4n) with smallest dimension n from 32 to 2048,
//     best of 5: the fastest is the peak, each size's rate over it the
//     efficiency curve; bf16 at 1024, scaled by fp32's efficiency there, is
//     the bf16 peak;
//   - the elementwise rate: GELU, layer norm and softmax forward and
//     backward and an add on [1024, 1024], in the step model's passes;
//   - the host time per operator: a small add and mul run forward and back;
//   - the memory bandwidth: a 256 MB copy (read and write), best of 5.
#pragma once

#include <string>

namespace smp::plan {

// Measures, writes the TOML to `path` and returns it.
std::string calibrate(const std::string& path, int threads);

}  // namespace smp::plan
