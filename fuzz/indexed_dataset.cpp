// The Megatron indexed dataset (sdk/data/include/smp/data/indexed_dataset.hpp) as
// the gpt adapter reads it (adapters/gpt/text_dataset.cpp): the input is
// split (support/fuzz_target.h split_two) into <prefix>.idx and <prefix>.bin,
// opened as model.data, then training and validation samples are drawn from it.
#include "support/fuzz_target.h"

#include "text_dataset.h"

SMP_FUZZ_TARGET(indexed_dataset) {
  const auto [idx, bin] = smp::fuzz::split_two(data, size);
  const std::string prefix = smp::fuzz::work_dir() + "/data";
  smp::fuzz::write_file(prefix + ".idx", idx);
  smp::fuzz::write_file(prefix + ".bin", bin);
  // The epoch indices stay in memory: the cache path is under a plain file,
  // a folder no rank can create (warned once), so no input leaves files behind.
  const std::string no_cache = smp::fuzz::work_dir() + "/data.idx/cache";
  // A vocabulary as large as real ones get: ids at or above it are refused.
  const int64_t seq_len = 4, vocab = int64_t{1} << 20;
  const gpt::TextDataset d(prefix, 0.25, seq_len, 1234, vocab, nullptr, no_cache);
  std::vector<int64_t> tokens(3 * seq_len), targets(3 * seq_len);
  d.fill(false, 0, 3, 0, 3, tokens.data(), targets.data());
  d.fill(false, 5, 3, 0, 3, tokens.data(), targets.data());
  d.fill(true, 0, 3, 0, 3, tokens.data(), targets.data());
  (void)d.describe();
}
