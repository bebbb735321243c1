// The byte-level BPE loader for a Hugging Face tokenizer.json
// (sdk/data/include/smp/data/bpe_tokenizer.hpp) through open_tokenizer, as
// model.tokenizer = "bpe" and `smp-data --tokenizer bpe` open it; a tokenizer
// that loads then encodes and decodes a text with every class of character.
#include "support/fuzz_target.h"

#include "support/tokenizer_text.h"

#include <smp/data/tokenizers.hpp>

SMP_FUZZ_TARGET(bpe_json) {
  const std::string path = smp::fuzz::work_dir() + "/tokenizer.json";
  smp::fuzz::write_file(path, std::string_view(reinterpret_cast<const char*>(data), size));
  const auto tok = smp::sdk::open_tokenizer("bpe", path, "", "model.tokenizer");
  smp::fuzz::exercise_tokenizer(*tok);
}
