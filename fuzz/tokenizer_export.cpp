// The tokenizer loaders as `smp-checkpoint export --format hf` uses them:
// read_tokenizer_files (sdk/data/include/smp/data/tokenizers.hpp) reads a
// tokenizer's files once, under the reading discipline, and loads them from
// those very bytes. The input's first byte picks the files: even, one
// tokenizer.json (the rest of the input); odd, GPT-2's vocab.json +
// merges.txt (the rest split as split_two). What it accepts must be the
// files' bytes exactly (the exporter copies those) and must load again
// through open_tokenizer, as a run opens it, to a tokenizer that works.
// SentencePiece is left to the sentencepiece harness (AddressSanitizer
// refuses the library's RTLD_DEEPBIND load).
#include "support/fuzz_target.h"

#include "support/tokenizer_text.h"

#include <smp/data/tokenizers.hpp>

SMP_FUZZ_TARGET(tokenizer_export) {
  if (size == 0) return;
  const bool two = (data[0] & 1) != 0;
  const std::string dir = smp::fuzz::work_dir();
  std::string model_path = dir + "/tokenizer.json", merges_path, model, merges;
  if (two) {
    const auto [vocab, text] = smp::fuzz::split_two(data + 1, size - 1);
    model_path = dir + "/vocab.json";
    merges_path = dir + "/merges.txt";
    model.assign(vocab.data(), vocab.size());
    merges.assign(text.data(), text.size());
    smp::fuzz::write_file(merges_path, merges);
  } else {
    model.assign(reinterpret_cast<const char*>(data) + 1, size - 1);
  }
  smp::fuzz::write_file(model_path, model);
  const smp::sdk::TokenizerFiles files = smp::sdk::read_tokenizer_files("bpe", model_path, merges_path);
  if (files.model != model || files.merges != merges)
    smp::fuzz::finding("read_tokenizer_files returned other bytes than the files hold");
  const auto tok = smp::sdk::open_tokenizer("bpe", model_path, merges_path, "model.tokenizer");
  smp::fuzz::exercise_tokenizer(*tok);
}
