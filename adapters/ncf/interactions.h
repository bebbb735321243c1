// Implicit feedback for NCF: who interacted with what, split leave-one-out
// (each user's last interaction is held out for validation), with
// deterministic training instances and validation candidates per global
// index, whatever the parallel layout. From a synthetic generator with
// planted low-rank structure, or a MovieLens ratings file.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace ncf {

struct SyntheticSpec {
  int64_t users = 1000, items = 500, per_user = 30;  // interactions per user
  int64_t rank = 8;           // planted latent dimensions
  double popularity = 0.5;    // weight of a per-item popularity term against the latent affinity
  uint64_t seed = 0;
};

class Interactions {
 public:
  // Users choose per_user distinct items with probability softmax(3 P_u . Q_i / sqrt(rank) + popularity b_i)
  // (Gumbel top-k); the held-out item is a random one of them.
  static Interactions synthetic(const SyntheticSpec& spec);
  // MovieLens: ratings.dat ("user::item::rating::time") or u.data (tab or space
  // separated); every rating is an interaction; ids are renumbered densely; the
  // held-out item is the user's latest. Users with fewer than 2 are dropped.
  // Errors name `key` (the config key), the file and the line.
  static Interactions load(const std::string& path, const std::string& key, uint64_t seed);

  int64_t users() const { return static_cast<int64_t>(held_out_.size()); }
  int64_t items() const { return items_; }
  int64_t train_positives() const { return static_cast<int64_t>(positives_.size()); }
  int64_t interactions() const { return train_positives() + users(); }

  // Training instance at global position g (over epochs of positives x (1 + negatives),
  // shuffled per epoch): a positive (label 1) or one of its sampled negatives (label 0).
  void train_instance(int64_t g, int negatives, int64_t* user, int64_t* item, float* label) const;
  // Validation: user u's held-out item, then n - 1 items u never interacted with
  // (sampled per user, the same every time).
  void candidates(int64_t u, int n, int64_t* items) const;
  // HR@k and NDCG@k of ranking the candidates by training popularity (every user).
  std::pair<double, double> popularity_baseline(int n, int k) const;

 private:
  bool interacted(int64_t u, int64_t item) const;  // training or held out
  int64_t sample_unseen(int64_t u, uint64_t key) const;
  const std::vector<int64_t>& epoch_order(int64_t epoch, int negatives) const;
  void finish(uint64_t seed);  // popularity, positives, the sorted sets

  int64_t items_ = 0;
  uint64_t seed_ = 0;
  std::vector<std::vector<int64_t>> train_;  // per user, sorted
  std::vector<std::vector<int64_t>> all_;    // per user, sorted, the held-out item included
  std::vector<int64_t> held_out_;
  std::vector<std::pair<int64_t, int64_t>> positives_;
  std::vector<int64_t> popularity_;  // training interactions per item
  mutable int64_t cached_epoch_ = -1;
  mutable int cached_negatives_ = -1;
  mutable std::vector<int64_t> order_;
};

}  // namespace ncf
