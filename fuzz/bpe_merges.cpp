// The byte-level BPE loader for GPT-2's vocab.json + merges.txt
// (sdk/data/include/smp/data/bpe_tokenizer.hpp) through open_tokenizer: the input
// is split (support/fuzz_target.h split_two) into the two files.
#include "support/fuzz_target.h"

#include "support/tokenizer_text.h"

#include <smp/data/tokenizers.hpp>

SMP_FUZZ_TARGET(bpe_merges) {
  const auto [vocab, merges] = smp::fuzz::split_two(data, size);
  const std::string vocab_path = smp::fuzz::work_dir() + "/vocab.json";
  const std::string merges_path = smp::fuzz::work_dir() + "/merges.txt";
  smp::fuzz::write_file(vocab_path, vocab);
  smp::fuzz::write_file(merges_path, merges);
  const auto tok = smp::sdk::open_tokenizer("bpe", vocab_path, merges_path, "model.tokenizer");
  smp::fuzz::exercise_tokenizer(*tok);
}
