#include "plan/search.h"

#include <algorithm>

namespace smp::plan {

namespace {

// Rising; in int64_t, so that no n an int holds overflows the counter (the
// world itself is bounded by smp-plan, kMaxWorldSize).
std::vector<int> divisors(int n) {
  std::vector<int> low, high;
  for (int64_t d = 1; d * d <= n; ++d)
    if (n % d == 0) {
      low.push_back(static_cast<int>(d));
      if (d * d != n) high.push_back(static_cast<int>(n / d));
    }
  low.insert(low.end(), high.rbegin(), high.rend());
  return low;
}

}  // namespace

SearchResult search(const Cluster& c, const Shape& s, const SearchOptions& o) {
  SearchResult r;
  for (int tp : divisors(o.world)) {
    if (tp > c.node_size || (o.tp && tp != o.tp)) continue;
    for (int pp : divisors(o.world / tp))
    for (int cp : divisors(o.world / tp / pp)) {
      if (o.pp && pp != o.pp) continue;
      if ((o.cp && cp != o.cp) || cp > (o.max_cp ? o.max_cp : c.node_size)) continue;
      if (cp > 1 && (s.moe_layers > 0 || s.seq % (2 * cp))) continue;
      const int dp = o.world / tp / pp / cp;
      std::vector<int64_t> sizes = o.microbatch_sizes;
      if (sizes.empty())
        for (int64_t mb = 1; mb <= o.max_microbatch && s.batch % dp == 0 && mb <= s.batch / dp; ++mb)
          if ((s.batch / dp) % mb == 0) sizes.push_back(mb);
      for (int ep : divisors(dp)) {
      if ((o.ep && ep != o.ep) || (ep > 1 && s.moe_layers == 0)) continue;
      for (int v = 1; v <= o.max_virtual_stages; ++v)
        for (const std::string& schedule : o.schedules)
        for (int64_t mb : sizes)
          for (int zero : o.zero_stages)
            for (bool recompute : o.recompute) {
              Layout l;
              l.tp = tp, l.pp = pp, l.dp = dp, l.cp = cp, l.ep = ep, l.virtual_stages = v, l.microbatch = mb;
              l.zero = zero;
              l.recompute = recompute;
              l.schedule = schedule;
              l.overlap_dp = o.overlap_dp;
              if (!invalid(s, l, o.world).empty()) continue;
              if (zero > 0 && dp == 1) continue;  // nothing to shard
              Candidate k{l, predict(c, s, l)};
              ++r.candidates;
              if (!k.prediction.fits) continue;
              ++r.fitting;
              r.ranked.push_back(k);
            }
      }
    }
  }
  std::sort(r.ranked.begin(), r.ranked.end(), [](const Candidate& x, const Candidate& y) {
    if (x.prediction.step_seconds != y.prediction.step_seconds)
      return x.prediction.step_seconds < y.prediction.step_seconds;
    return x.layout.describe() < y.layout.describe();
  });
  return r;
}

}  // namespace smp::plan
