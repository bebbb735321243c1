#include "plan/cluster.h"

#include <smp/error.h>
#include <smp/process_env.h>
#include <smp/sdk/toml_nesting.hpp>

#include <toml++/toml.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <set>

namespace smp::plan {

namespace {

// The largest figure a cluster file may give, each far above any machine's
// (a petabyte of memory, an exabyte per second, an exaflop, a second of
// latency), so that the planner's sums stay finite. Bandwidths get the most
// room: --calibrate measured a shared-memory all-to-all of small messages at
// 2.1e6 GB/s on a busy 2-core VM, and a file smp writes must read back.
constexpr double kMostGB = 1e6, kMostGBs = 1e9, kMostTflops = 1e6, kMostUs = 1e6, kMostGemmSize = 1e9;
// The smallest rate (1 kB/s, 1 MFLOP/s, a millionth of the peak).
constexpr double kLeastRate = 1e-6;

struct Reader {
  const toml::table& root;
  std::string file;
  [[noreturn]] void fail(const std::string& key, const std::string& why) const {
    throw Error(file + ": " + key + ": " + why);
  }
  const toml::node& at(const std::string& key) const {
    const toml::node_view<const toml::node> v = root.at_path(key);
    if (!v) fail(key, "missing");
    return *v.node();
  }
  // Every figure bounded above as well, so that what the planner makes of it
  // (times 1e9 or 1e12, summed over layers) stays finite: NaN and infinity refused.
  // A rate (`least` > 0: a bandwidth, a peak) is at least that, so that the
  // planner's times (work over rate) stay finite too.
  double positive(const std::string& key, double most, double least = 0) const {
    const toml::node& n = at(key);
    const std::optional<double> v = n.value<double>();
    if (!v || !std::isfinite(*v) || *v <= 0 || *v < least || *v > most)
      fail(key, "must be a positive number (" +
                    (least > 0 ? "at least " + input::number_text(least) + ", " : std::string()) + "at most " +
                    input::number_text(most) + ")" + shown(n));
    return *v;
  }
  double non_negative(const std::string& key, double most) const {
    const toml::node& n = at(key);
    const std::optional<double> v = n.value<double>();
    if (!v || !std::isfinite(*v) || *v < 0 || *v > most)
      fail(key, "must be a number >= 0 (at most " + input::number_text(most) + ")" + shown(n));
    return *v;
  }
  static std::string shown(const toml::node& n) {
    const std::optional<double> v = n.value<double>();
    return v ? ", got " + input::number_text(*v) : std::string();
  }
  std::string text(const std::string& key) const {
    const std::optional<std::string> v = at(key).value<std::string>();
    if (!v || v->empty()) fail(key, "must be a non-empty string");
    return *v;
  }
};

// Every key of `table` (at `prefix`) must be one of `known`.
void only(const toml::table& table, const std::string& prefix, std::initializer_list<const char*> known,
          const std::string& file) {
  for (const auto& [k, v] : table) {
    const std::string key(k.str());
    if (std::find_if(known.begin(), known.end(), [&](const char* n) { return key == n; }) == known.end()) {
      std::string list;
      for (const char* n : known) list += (list.empty() ? "" : ", ") + std::string(n);
      throw Error(file + ": " + prefix + key + ": unknown key (known: " + list + ")");
    }
  }
}

}  // namespace

double Cluster::efficiency(double size) const {
  const auto& t = gemm_efficiency;
  if (size <= t.front().first) return t.front().second;
  if (size >= t.back().first) return t.back().second;
  for (size_t i = 1; i < t.size(); ++i)
    if (size <= t[i].first) {
      const double x = (std::log(size) - std::log(t[i - 1].first)) / (std::log(t[i].first) - std::log(t[i - 1].first));
      return t[i - 1].second + x * (t[i].second - t[i - 1].second);
    }
  return t.back().second;
}

double Cluster::peak(const std::string& dtype) const {
  auto it = peak_flops.find(dtype);
  if (it == peak_flops.end()) throw Error(file + ": accelerator.peak_tflops: no figure for " + dtype);
  return it->second;
}

Cluster read_cluster(const std::string& path) {
  toml::table root;
  std::string text;
  try {  // a regular file (a named pipe is refused, not waited on), its size and nesting bounded
    text = input::read_toml_file(path, path);
  } catch (const input::Error& e) {
    throw Error(e.what());
  }
  try {
    root = toml::parse(text, path);
  } catch (const toml::parse_error& e) {
    throw Error(path + ": " + std::string(e.description()) + " (line " +
                std::to_string(e.source().begin.line) + ")");
  }
  const Reader r{root, path};
  only(root, "", {"name", "accelerator", "node", "links", "topology"}, path);
  Cluster c;
  c.file = path;
  c.name = r.text("name");
  if (const toml::table* a = root["accelerator"].as_table())
    only(*a, "accelerator.", {"name", "memory_gb", "memory_bandwidth_gbs", "elementwise_gbs", "op_overhead_us", "peak_tflops",
                                  "gemm_efficiency"},
         path);
  c.accelerator = r.text("accelerator.name");
  c.memory_bytes = r.positive("accelerator.memory_gb", kMostGB) * 1e9;
  c.memory_bandwidth = r.positive("accelerator.memory_bandwidth_gbs", kMostGBs, kLeastRate) * 1e9;
  c.elementwise_bandwidth = root.at_path("accelerator.elementwise_gbs")
                                ? r.positive("accelerator.elementwise_gbs", kMostGBs, kLeastRate) * 1e9
                                : c.memory_bandwidth;
  if (c.elementwise_bandwidth > c.memory_bandwidth)
    r.fail("accelerator.elementwise_gbs", "is above accelerator.memory_bandwidth_gbs: elementwise passes cannot "
           "outrun the memory");
  c.op_overhead =
      root.at_path("accelerator.op_overhead_us") ? r.non_negative("accelerator.op_overhead_us", kMostUs) * 1e-6 : 0;
  const toml::table* peaks = r.at("accelerator.peak_tflops").as_table();
  if (!peaks || peaks->empty()) r.fail("accelerator.peak_tflops", "must be a table of dtype = TFLOP/s");
  for (const auto& [k, v] : *peaks) {
    const std::string key = "accelerator.peak_tflops." + std::string(k.str());
    if (std::string(k.str()) != "fp16" && std::string(k.str()) != "bf16" && std::string(k.str()) != "fp32")
      r.fail(key, "unknown dtype (known: fp16, bf16, fp32)");
    c.peak_flops[std::string(k.str())] = r.positive(key, kMostTflops, kLeastRate) * 1e12;
  }
  const toml::array* eff = r.at("accelerator.gemm_efficiency").as_array();
  if (!eff || eff->empty()) r.fail("accelerator.gemm_efficiency", "must be a list of [size, fraction of peak] pairs");
  for (size_t i = 0; i < eff->size(); ++i) {
    const toml::array* pair = (*eff)[i].as_array();
    const std::string key = "accelerator.gemm_efficiency[" + std::to_string(i) + "]";
    std::optional<double> size, frac;
    if (pair && pair->size() == 2) size = (*pair)[0].value<double>(), frac = (*pair)[1].value<double>();
    if (!size || !frac) r.fail(key, "must be [size, fraction of peak]");
    if (!(*size >= 1 && *size <= kMostGemmSize))
      r.fail(key, "the size must be a number in [1, " + input::number_text(kMostGemmSize) + "], got " +
                      input::number_text(*size));
    if (!(*frac >= kLeastRate && *frac <= 1))
      r.fail(key, "the fraction of peak must lie in (0, 1] (at least " + input::number_text(kLeastRate) + "), got " +
                      input::number_text(*frac));
    if (!c.gemm_efficiency.empty() && *size <= c.gemm_efficiency.back().first)
      r.fail(key, "sizes must rise from one pair to the next");
    c.gemm_efficiency.emplace_back(*size, *frac);
  }
  if (const toml::table* n = root["node"].as_table()) only(*n, "node.", {"accelerators"}, path);
  const double node = r.positive("node.accelerators", kMaxLocalWorldSize);  // then an int
  if (node != std::floor(node)) r.fail("node.accelerators", "must be a whole number");
  c.node_size = static_cast<int>(node);
  if (const toml::table* l = root["links"].as_table()) only(*l, "links.", {"intra", "inter", "alltoall"}, path);
  c.has_alltoall = static_cast<bool>(root.at_path("links.alltoall"));
  for (const char* link : {"intra", "inter", "alltoall"}) {
    if (std::string(link) == "alltoall" && !c.has_alltoall) continue;
    if (const toml::table* l = root["links"][link].as_table())
      only(*l, std::string("links.") + link + ".", {"bandwidth_gbs", "latency_us"}, path);
    Link& to = std::string(link) == "intra" ? c.intra : std::string(link) == "inter" ? c.inter : c.alltoall;
    to.bandwidth = r.positive(std::string("links.") + link + ".bandwidth_gbs", kMostGBs, kLeastRate) * 1e9;
    to.latency = r.non_negative(std::string("links.") + link + ".latency_us", kMostUs) * 1e-6;
  }
  if (c.inter.bandwidth > c.intra.bandwidth)
    r.fail("links.inter.bandwidth_gbs", "is above links.intra.bandwidth_gbs: the link between nodes would be "
           "faster than the one inside a node");
  const toml::array* inside = r.at("topology.inside_node").as_array();
  if (!inside) r.fail("topology.inside_node", "must be a list of mesh axes (\"tp\", \"ep\", \"pp\", \"dp\")");
  std::set<std::string> seen;
  for (const auto& a : *inside) {
    const std::optional<std::string> axis = a.value<std::string>();
    if (!axis || (*axis != "tp" && *axis != "pp" && *axis != "dp" && *axis != "ep"))
      r.fail("topology.inside_node", "an entry is not one of \"tp\", \"ep\", \"pp\", \"dp\"");
    if (!seen.insert(*axis).second) r.fail("topology.inside_node", "names \"" + *axis + "\" twice");
    c.inside_node.push_back(*axis);
  }
  return c;
}

Cluster load_cluster(const std::string& name_or_path) {
  if (name_or_path.find('/') != std::string::npos || name_or_path.find(".toml") != std::string::npos)
    return read_cluster(name_or_path);
  for (const std::string dir : {std::string(SMP_PLAN_SOURCE_CLUSTERS), std::string(SMP_PLAN_INSTALL_CLUSTERS)}) {
    const std::string path = dir + "/" + name_or_path + ".toml";
    if (::access(path.c_str(), R_OK) == 0) return read_cluster(path);
  }
  throw Error("cluster '" + name_or_path + "': no such preset in " + SMP_PLAN_SOURCE_CLUSTERS + " or " +
              SMP_PLAN_INSTALL_CLUSTERS + " (or give a path)");
}

}  // namespace smp::plan
