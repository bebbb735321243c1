#include "interactions.h"

#include <smp/sdk/host.hpp>
#include <smp/sdk/input_file.hpp>
#include <smp/sdk/init.hpp>

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>
#include <tuple>

namespace ncf {

namespace {

// The SDK's counter-based bits (the parameter initialiser's), for every draw here.
uint64_t mix(uint64_t x) { return smp::sdk::detail::splitmix64(x); }
uint64_t key(uint64_t a, uint64_t b, uint64_t c = 0, uint64_t d = 0) { return mix(mix(mix(mix(a) ^ b) ^ c) ^ d); }
double uniform(uint64_t k) { return (static_cast<double>(k >> 11) + 0.5) * 0x1.0p-53; }  // (0, 1)
double normal(uint64_t k) {
  return std::sqrt(-2.0 * std::log(uniform(mix(k)))) * std::cos(2.0 * M_PI * uniform(mix(k + 1)));
}

}  // namespace

Interactions Interactions::synthetic(const SyntheticSpec& s) {
  Interactions d;
  d.items_ = s.items;
  const int64_t r = s.rank;
  std::vector<double> P(static_cast<size_t>(s.users * r)), Q(static_cast<size_t>(s.items * r)), b(s.items);
  for (size_t i = 0; i < P.size(); ++i) P[i] = normal(key(s.seed, 1, i));
  for (size_t i = 0; i < Q.size(); ++i) Q[i] = normal(key(s.seed, 2, i));
  for (int64_t i = 0; i < s.items; ++i) b[i] = normal(key(s.seed, 3, i));
  const double scale = 3.0 / std::sqrt(static_cast<double>(r));
  std::vector<std::pair<double, int64_t>> scored(s.items);
  d.train_.resize(s.users);
  d.held_out_.resize(s.users);
  for (int64_t u = 0; u < s.users; ++u) {
    for (int64_t i = 0; i < s.items; ++i) {
      double dot = 0;
      for (int64_t f = 0; f < r; ++f) dot += P[u * r + f] * Q[i * r + f];
      const double gumbel = -std::log(-std::log(uniform(key(s.seed, 4, u, i))));
      scored[i] = {scale * dot + s.popularity * b[i] + gumbel, i};
    }
    std::partial_sort(scored.begin(), scored.begin() + s.per_user, scored.end(),
                      [](const auto& x, const auto& y) { return x.first > y.first; });
    std::vector<int64_t> chosen;
    for (int64_t j = 0; j < s.per_user; ++j) chosen.push_back(scored[j].second);
    const size_t held = key(s.seed, 5, u) % chosen.size();
    d.held_out_[u] = chosen[held];
    chosen.erase(chosen.begin() + static_cast<std::ptrdiff_t>(held));
    d.train_[u] = std::move(chosen);
  }
  d.finish(s.seed);
  return d;
}

Interactions Interactions::load(const std::string& path, const std::string& cfg_key, uint64_t seed) {
  struct stat st {};  // a regular file only: opening a named pipe would block
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
    throw smp::sdk::Error(cfg_key + ": '" + path + "' is " + smp::input::kind_of_mode(st.st_mode) +
                          ", not a regular file");
  std::ifstream in(path);
  if (!in) throw smp::sdk::Error(cfg_key + ": cannot open '" + path + "'");
  std::map<int64_t, int64_t> user_id, item_id;
  struct Row {
    int64_t user, item, time, order;
  };
  std::vector<Row> rows;
  std::string line;
  int64_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    std::string fields = line;
    for (size_t p; (p = fields.find("::")) != std::string::npos;) fields.replace(p, 2, " ");
    std::istringstream ss(fields);
    int64_t u, i, t;
    double rating;
    if (!(ss >> u >> i >> rating >> t))
      throw smp::sdk::Error(cfg_key + ": " + path + ":" + std::to_string(line_no) +
                            ": expected 'user::item::rating::timestamp' (ratings.dat) or 'user item rating "
                            "timestamp' (u.data), got '" + line + "'");
    const int64_t du = user_id.emplace(u, static_cast<int64_t>(user_id.size())).first->second;
    const int64_t di = item_id.emplace(i, static_cast<int64_t>(item_id.size())).first->second;
    rows.push_back({du, di, t, static_cast<int64_t>(rows.size())});
  }
  if (rows.empty()) throw smp::sdk::Error(cfg_key + ": '" + path + "' holds no ratings");
  std::vector<std::vector<Row>> by_user(user_id.size());
  for (const Row& r : rows) by_user[r.user].push_back(r);
  Interactions d;
  d.items_ = static_cast<int64_t>(item_id.size());
  for (auto& list : by_user) {
    std::sort(list.begin(), list.end(), [](const Row& a, const Row& b) { return std::tie(a.time, a.order) < std::tie(b.time, b.order); });
    std::vector<int64_t> items;
    for (const Row& r : list) items.push_back(r.item);
    std::sort(items.begin(), items.end());
    items.erase(std::unique(items.begin(), items.end()), items.end());
    if (items.size() < 2) continue;  // nothing left to train on once one is held out
    const int64_t latest = list.back().item;
    d.held_out_.push_back(latest);
    items.erase(std::find(items.begin(), items.end(), latest));
    d.train_.push_back(std::move(items));
  }
  if (d.held_out_.empty())
    throw smp::sdk::Error(cfg_key + ": '" + path + "': no user has 2 or more distinct items (leave-one-out needs them)");
  d.finish(seed);
  return d;
}

void Interactions::finish(uint64_t seed) {
  seed_ = seed;
  popularity_.assign(items_, 0);
  all_.resize(train_.size());
  for (size_t u = 0; u < train_.size(); ++u) {
    std::sort(train_[u].begin(), train_[u].end());
    for (int64_t i : train_[u]) {
      positives_.emplace_back(static_cast<int64_t>(u), i);
      ++popularity_[i];
    }
    all_[u] = train_[u];
    all_[u].insert(std::upper_bound(all_[u].begin(), all_[u].end(), held_out_[u]), held_out_[u]);
    if (static_cast<int64_t>(all_[u].size()) >= items_)
      throw smp::sdk::Error("ncf: user " + std::to_string(u) + " interacted with every item: no negatives to sample");
  }
}

bool Interactions::interacted(int64_t u, int64_t item) const {
  return std::binary_search(all_[u].begin(), all_[u].end(), item);
}

int64_t Interactions::sample_unseen(int64_t u, uint64_t k) const {
  for (uint64_t attempt = 0;; ++attempt) {
    const int64_t item = static_cast<int64_t>(key(k, attempt) % static_cast<uint64_t>(items_));
    if (!interacted(u, item)) return item;
  }
}

const std::vector<int64_t>& Interactions::epoch_order(int64_t epoch, int negatives) const {
  if (epoch != cached_epoch_ || negatives != cached_negatives_) {
    const int64_t n = train_positives() * (1 + negatives);
    order_.resize(n);
    for (int64_t i = 0; i < n; ++i) order_[i] = i;
    for (int64_t i = n - 1; i > 0; --i)  // Fisher-Yates with this epoch's key
      std::swap(order_[i], order_[key(seed_, 6, epoch, i) % static_cast<uint64_t>(i + 1)]);
    cached_epoch_ = epoch;
    cached_negatives_ = negatives;
  }
  return order_;
}

void Interactions::train_instance(int64_t g, int negatives, int64_t* user, int64_t* item, float* label) const {
  const int64_t n = train_positives() * (1 + negatives);
  const int64_t epoch = g / n, j = epoch_order(epoch, negatives)[g % n];
  const auto& [u, positive] = positives_[j / (1 + negatives)];
  *user = u;
  if (j % (1 + negatives) == 0) {
    *item = positive;
    *label = 1.0f;
  } else {
    *item = sample_unseen(u, key(seed_, 7, epoch, j));
    *label = 0.0f;
  }
}

void Interactions::candidates(int64_t u, int n, int64_t* out) const {
  out[0] = held_out_[u];
  for (int c = 1; c < n; ++c) out[c] = sample_unseen(u, key(seed_, 8, u, c));
}

std::pair<double, double> Interactions::popularity_baseline(int n, int k) const {
  std::vector<int64_t> c(n);
  double hits = 0, ndcg = 0;
  for (int64_t u = 0; u < users(); ++u) {
    candidates(u, n, c.data());
    // Popularity counts tie often: a tied candidate ranks ahead on a fair coin
    // (deterministic per user and candidate), so ties neither help nor hurt.
    int64_t ahead = 0;
    for (int j = 1; j < n; ++j)
      ahead += popularity_[c[j]] > popularity_[c[0]] ||
               (popularity_[c[j]] == popularity_[c[0]] && (key(seed_, 9, u, j) & 1));
    if (ahead < k) {
      hits += 1;
      ndcg += 1.0 / std::log2(static_cast<double>(ahead) + 2.0);
    }
  }
  return {hits / users(), ndcg / users()};
}

}  // namespace ncf
