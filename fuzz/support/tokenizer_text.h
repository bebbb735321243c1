// A loaded tokenizer put to work as smp-data and the adapters use one: a text
// with letters, digits, contractions, whitespace runs, CR LF, non-ASCII
// letters and bytes that are no UTF-8, encoded, then decoded back.
#pragma once

#include "support/fuzz_target.h"

#include <smp/data/tokenizer.hpp>

#include <string>

namespace smp::fuzz {

inline void exercise_tokenizer(const smp::sdk::Tokenizer& tok) {
  static const std::string text =
      "Hello, world! It's 2024: they'll re-run 12345 steps.\r\n\n   tabs\tand  spaces "
      "caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e \xf0\x9f\x99\x82 \xff\xfe\x80 end";
  const std::vector<int64_t> ids = tok.encode(text);
  for (const int64_t id : ids)
    if (id < 0 || id >= tok.vocab()) smp::fuzz::finding("encode gave id " + std::to_string(id) + ", outside the vocabulary of " + std::to_string(tok.vocab()));
  (void)tok.decode(ids);
  (void)tok.encode("");
}

}  // namespace smp::fuzz
