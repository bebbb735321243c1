#include "epoch_index.h"

#include <smp/sdk/host.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <set>

namespace gpt {

namespace {

constexpr char kMagic[8] = {'S', 'M', 'P', 'E', 'P', 'O', 'C', 'H'};
constexpr int64_t kHeaderWords = 6;  // magic, version, key, epoch, documents, windows

// A seeded permutation of [0, n) (Fisher-Yates over splitmix draws).
void permutation(int64_t* p, int64_t n, uint64_t key) {
  for (int64_t i = 0; i < n; ++i) p[i] = i;
  for (int64_t i = n - 1; i > 0; --i) {
    key = splitmix(key);
    std::swap(p[i], p[key % static_cast<uint64_t>(i + 1)]);
  }
}

// Warns once per folder that cannot hold the cache.
void warn_unwritable(const std::string& folder, const std::string& why) {
  static std::mutex m;
  static std::set<std::string> warned;
  std::lock_guard<std::mutex> lock(m);
  if (!warned.insert(folder).second) return;
  const std::string msg = "data index cache " + folder + ": " + why +
                          "; the epoch indices stay in each rank's memory (set model.data_cache_path to a writable folder)";
  if (smp::sdk::host_slot()) {
    smp::sdk::log(SMP_LOG_WARN, "gpt", msg);
  } else {
    std::fprintf(stderr, "warning: %s\n", msg.c_str());
  }
}

}  // namespace

std::unique_ptr<EpochIndex> EpochIndex::build(const std::vector<int64_t>& doc_len, int64_t windows,
                                              uint64_t shuffle_key) {
  auto ix = std::unique_ptr<EpochIndex>(new EpochIndex());
  const int64_t n = static_cast<int64_t>(doc_len.size());
  ix->own_.resize(static_cast<size_t>(2 * n + windows));
  int64_t* docs = ix->own_.data();
  permutation(docs, n, shuffle_key);
  int64_t end = 0;
  for (int64_t i = 0; i < n; ++i) docs[n + i] = end += doc_len[static_cast<size_t>(docs[i])];
  permutation(docs + 2 * n, windows, splitmix(shuffle_key ^ 0x5a3b1e5ULL));
  ix->docs_ = docs, ix->ends_ = docs + n, ix->windows_ = docs + 2 * n, ix->documents_ = n;
  return ix;
}

std::unique_ptr<EpochIndex> EpochIndex::cached(const std::string& folder, uint64_t cache_key, int64_t epoch,
                                               const std::vector<int64_t>& doc_len, int64_t windows,
                                               uint64_t shuffle_key) {
  char name[64];
  std::snprintf(name, sizeof name, "/epoch-%06lld-%016llx.bin", static_cast<long long>(epoch),
                static_cast<unsigned long long>(cache_key));
  const std::string path = folder + name;
  const int64_t n = static_cast<int64_t>(doc_len.size());
  const int64_t words = kHeaderWords + 2 * n + windows;
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    std::unique_ptr<EpochIndex> built = build(doc_len, windows, shuffle_key);
    if (::mkdir(folder.c_str(), 0755) != 0 && errno != EEXIST) {
      warn_unwritable(folder, std::string("cannot create: ") + std::strerror(errno));
      return built;
    }
    static std::atomic<uint64_t> serial{0};
    const std::string tmp = path + ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(serial++);
    std::FILE* f = std::fopen(tmp.c_str(), "wb");
    if (!f) {
      warn_unwritable(folder, std::string("cannot write: ") + std::strerror(errno));
      return built;
    }
    int64_t header[kHeaderWords] = {0, 1, static_cast<int64_t>(cache_key), epoch, n, windows};
    std::memcpy(header, kMagic, 8);
    bool ok = std::fwrite(header, 8, kHeaderWords, f) == static_cast<size_t>(kHeaderWords) &&
              std::fwrite(built->own_.data(), 8, built->own_.size(), f) == built->own_.size();
    ok = std::fclose(f) == 0 && ok;
    // Ranks that build the same epoch at once write the same bytes: the last rename wins.
    if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
      std::remove(tmp.c_str());
      warn_unwritable(folder, std::string("cannot write: ") + std::strerror(errno));
      return built;
    }
  }
  auto ix = std::unique_ptr<EpochIndex>(new EpochIndex());
  ix->file_ = std::make_unique<smp::sdk::detail::MappedFile>(path);
  const auto* w = reinterpret_cast<const int64_t*>(ix->file_->data());
  if (ix->file_->size() != 8 * words || std::memcmp(w, kMagic, 8) != 0 || w[1] != 1 ||
      w[2] != static_cast<int64_t>(cache_key) || w[3] != epoch || w[4] != n || w[5] != windows)
    throw smp::sdk::Error("model.data: " + path + " is not the index of epoch " + std::to_string(epoch) + " for " +
                          std::to_string(n) + " documents and " + std::to_string(windows) +
                          " windows (damaged?); delete it to have it rebuilt");
  ix->docs_ = w + kHeaderWords, ix->ends_ = ix->docs_ + n, ix->windows_ = ix->ends_ + n, ix->documents_ = n;
  // The samples index documents and token positions by these words: a file
  // with the right header and damaged words would read outside the dataset.
  // So the mapped words must be what build() writes: the documents and the
  // windows each a permutation, the ends the running sums of their lengths.
  // One pass per epoch, over memory every rank reads during the epoch anyway.
  const std::string damaged = "model.data: " + path + " is not a valid index of epoch " + std::to_string(epoch) +
                              " (damaged?); delete it to have it rebuilt: ";
  std::vector<bool> seen(static_cast<size_t>(std::max(n, windows)), false);
  int64_t end = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t d = ix->docs_[i];
    if (d < 0 || d >= n || seen[static_cast<size_t>(d)])
      throw smp::sdk::Error(damaged + "document entry " + std::to_string(i) + " is " + std::to_string(d) +
                            ", not a document of the permutation of 0.." + std::to_string(n - 1));
    seen[static_cast<size_t>(d)] = true;
    end += doc_len[static_cast<size_t>(d)];
    if (ix->ends_[i] != end)
      throw smp::sdk::Error(damaged + "end entry " + std::to_string(i) + " is " + std::to_string(ix->ends_[i]) +
                            ", the documents' lengths make it " + std::to_string(end));
  }
  seen.assign(seen.size(), false);
  for (int64_t i = 0; i < windows; ++i) {
    const int64_t v = ix->windows_[i];
    if (v < 0 || v >= windows || seen[static_cast<size_t>(v)])
      throw smp::sdk::Error(damaged + "window entry " + std::to_string(i) + " is " + std::to_string(v) +
                            ", not a window of the permutation of 0.." + std::to_string(windows - 1));
    seen[static_cast<size_t>(v)] = true;
  }
  return ix;
}

uint64_t epoch_cache_key(const smp::sdk::IndexedDataset& d, uint64_t seed, int64_t seq_len, int64_t train_documents) {
  uint64_t k = splitmix(0x5eed1dcULL ^ seed);
  for (const std::string& path : {d.prefix() + ".idx", d.bin_path()}) {
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0)
      for (int64_t v : {static_cast<int64_t>(st.st_size), static_cast<int64_t>(st.st_mtim.tv_sec),
                        static_cast<int64_t>(st.st_mtim.tv_nsec), static_cast<int64_t>(st.st_ino)})
        k = splitmix(k ^ static_cast<uint64_t>(v));
  }
  return splitmix(splitmix(k ^ static_cast<uint64_t>(seq_len)) ^ static_cast<uint64_t>(train_documents));
}

}  // namespace gpt
