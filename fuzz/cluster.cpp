// A cluster file as smp-plan reads it (plan/cluster.cpp,
// read_cluster): the input is the file. Besides the reader's own refusals,
// two promises are checked:
// - the nesting bound (smp/sdk/toml_nesting.hpp) holds for what toml++ builds:
//   a text the pre-scanner lets through never parses into a tree deeper than
//   the bound (a deeper one is what overflowed the stack);
// - a cluster read_cluster accepts has only finite, positive figures, and the
//   step model predicts a finite step time and memory from it for a small
//   shape (NaN efficiencies once made every prediction NaN, and a layout was
//   still printed).
#include "support/fuzz_target.h"

#include "plan/cluster.h"
#include "plan/step_model.h"

#include <smp/sdk/toml_nesting.hpp>

#include <toml++/toml.h>

#include <cmath>

namespace {

// The deepest node under `n`, n itself 1 (within the bound: no deep recursion).
int depth_of(const toml::node& n) {
  int deepest = 0;
  if (const toml::table* t = n.as_table())
    for (auto&& [k, v] : *t) deepest = std::max(deepest, depth_of(v));
  if (const toml::array* a = n.as_array())
    for (auto&& v : *a) deepest = std::max(deepest, depth_of(v));
  return 1 + deepest;
}

}  // namespace

SMP_FUZZ_TARGET(cluster) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  bool within = true;
  try {
    smp::input::check_toml_nesting(text, "cluster.toml");
  } catch (const smp::input::Error&) {
    within = false;
  }
  if (within) {
    try {
      const toml::table root = toml::parse(text, std::string_view("cluster.toml"));
      // The root table is level 0; one level past the bound is an array's scalars.
      if (depth_of(root) - 1 > smp::input::kMaxTomlDepth + 1)
        smp::fuzz::finding("the nesting check let through a text toml++ builds " + std::to_string(depth_of(root) - 1) +
                           " levels deep");
    } catch (const toml::parse_error&) {
    }
  }
  const std::string path = smp::fuzz::work_dir() + "/cluster.toml";
  smp::fuzz::write_file(path, text);
  const smp::plan::Cluster c = smp::plan::read_cluster(path);
  if (!within) smp::fuzz::finding("read_cluster accepted a file the nesting check refuses");
  for (const double v : {c.memory_bytes, c.memory_bandwidth, c.elementwise_bandwidth, c.intra.bandwidth,
                         c.inter.bandwidth})
    if (!std::isfinite(v) || v <= 0) smp::fuzz::finding("an accepted cluster has a figure that is not finite and > 0");
  for (const double v : {c.op_overhead, c.intra.latency, c.inter.latency, c.alltoall.latency})
    if (!std::isfinite(v) || v < 0) smp::fuzz::finding("an accepted cluster has a cost that is not finite and >= 0");
  if (c.node_size < 1) smp::fuzz::finding("an accepted cluster has no accelerator in a node");
  smp::plan::Shape s;
  s.layers = 2, s.hidden = 64, s.heads = 2, s.seq = 64, s.vocab = 128, s.batch = 8;
  s.dtype = c.peak_flops.begin()->first;
  smp::plan::Layout l;
  l.microbatch = 1;
  const smp::plan::Prediction p = smp::plan::predict(c, s, l);
  if (!std::isfinite(p.step_seconds) || !(p.step_seconds > 0) || !std::isfinite(p.memory_bytes))
    smp::fuzz::finding("an accepted cluster predicts a step of " + std::to_string(p.step_seconds) + " s");
}
