// BERT's and RoBERTa's data (adapters/encoder): the 80/10/10 corruption, the
// sentence pairs and their NSP labels, full-sentence packing and dynamic
// masking, all on a small corpus written here.
#include "corpus.h"
#include "masking.h"
#include "packed_data.h"
#include "pair_data.h"

#include <smp/sdk/host.hpp>

#include <gtest/gtest.h>

#include <boost/filesystem.hpp>

#include <fstream>
#include <map>
#include <set>
#include <string>

namespace encoder {
namespace {

namespace fs = boost::filesystem;

// Three documents of numbered lines ("d<doc> line <i> ..."), so a test can tell
// which line a piece of text came from.
std::string corpus_dir() {
  static const std::string dir = [] {
    const fs::path d = fs::temp_directory_path() / fs::unique_path("smp-encoder-%%%%-%%%%");
    fs::create_directories(d);
    for (int doc = 0; doc < 3; ++doc) {
      std::ofstream out((d / ("doc" + std::to_string(doc) + ".txt")).string());
      for (int i = 0; i < 60; ++i) {
        out << "d" << doc << " line " << i << " " << std::string(static_cast<size_t>(5 + (i * 7) % 23), 'a' + (i % 26))
            << "\n";
        if (i % 10 == 9) out << "   \n";  // blank lines are skipped
      }
    }
    return d.string();
  }();
  return dir;
}

// The byte vocabulary's special ids.
const Vocab kBytes{};
const int64_t kPad = kBytes.pad(), kCls = kBytes.cls(), kSep = kBytes.sep(), kMask = kBytes.mask();

std::string bytes_of(const SentenceCorpus& c, const Sentence& s) {
  std::string out;
  for (int64_t i = 0; i < s.length; ++i) out += static_cast<char>(c.token(s, i));
  return out;
}

std::string text_of(const SentenceCorpus& c, bool val, int64_t line) {
  return bytes_of(c, c.sentences(val)[static_cast<size_t>(line)]);
}

TEST(EncoderData, CorpusSplitsLinesAndDocuments) {
  SentenceCorpus c(corpus_dir(), 0.1);
  EXPECT_EQ(c.sentences(false).size() + c.sentences(true).size(), 180u);
  EXPECT_EQ(text_of(c, false, 0).rfind("d0 line 0 ", 0), 0u);
  EXPECT_EQ(c.sentences(true).back().doc, 2);
  EXPECT_GT(c.unigram_entropy(), 1.0);
  EXPECT_THROW(SentenceCorpus(corpus_dir(), 0.0), smp::sdk::Error);
  try {
    SentenceCorpus(corpus_dir() + "/missing.txt", 0.1);
    FAIL();
  } catch (const smp::sdk::Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.data: no such file or folder"), std::string::npos) << e.what();
  }
}

// 15% of the real tokens (rounded, at least one), never a special token; of
// those ~80% [MASK], ~10% a random byte, ~10% unchanged; the same key masks the
// same way.
TEST(EncoderData, MaskingIs80_10_10OfFifteenPercent) {
  int64_t chosen = 0, mask = 0, kept = 0;
  for (uint64_t key = 0; key < 400; ++key) {
    std::vector<int64_t> tokens{kCls};
    for (int i = 0; i < 100; ++i) tokens.push_back('a' + i % 26);
    tokens.push_back(kSep);
    tokens.resize(120, kPad);
    const std::vector<int64_t> original = tokens;
    std::vector<int64_t> targets(tokens.size(), -100);
    const int64_t n = mask_tokens(tokens, targets, 0.15, key, kBytes);
    ASSERT_EQ(n, 15);
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (original[i] >= 256) {
        EXPECT_EQ(tokens[i], original[i]);
        EXPECT_EQ(targets[i], -100);
        continue;
      }
      if (targets[i] == -100) {
        EXPECT_EQ(tokens[i], original[i]);
        continue;
      }
      EXPECT_EQ(targets[i], original[i]);
      ++chosen;
      mask += tokens[i] == kMask;
      kept += tokens[i] == original[i];
    }
    std::vector<int64_t> again = original, again_targets(original.size(), -100);
    mask_tokens(again, again_targets, 0.15, key, kBytes);
    EXPECT_EQ(again, tokens);
  }
  ASSERT_EQ(chosen, 6000);
  // 6000 draws: the shares are within ~4 standard deviations of 0.8 and 0.1
  // (a random byte equal to the original counts as kept: +0.1/256).
  EXPECT_NEAR(static_cast<double>(mask) / chosen, 0.8, 0.021);
  EXPECT_NEAR(static_cast<double>(kept) / chosen, 0.1, 0.016);
  std::vector<int64_t> one{kCls, 'x', kSep}, t(3, -100);
  EXPECT_EQ(mask_tokens(one, t, 0.15, 1, kBytes), 1);  // at least one
}

// [CLS] A [SEP] B [SEP] then padding, segment 1 on B; label 0 means B is the
// lines right after A in the same document; labels are ~half random.
TEST(EncoderData, SentencePairsAndNextSentenceLabels) {
  SentenceCorpus c(corpus_dir(), 0.1);
  PairData data(c, 64, 0.15, 7);
  int random = 0;
  const int samples = 600;
  for (int i = 0; i < samples; ++i) {
    const PairSample s = data.sample(false, i / 8, i % 8);
    ASSERT_EQ(s.tokens.size(), 64u);
    EXPECT_EQ(s.tokens[0], kCls);
    EXPECT_EQ(s.tokens[static_cast<size_t>(s.b_start - 1)], kSep);
    EXPECT_EQ(s.tokens[static_cast<size_t>(s.real - 1)], kSep);
    EXPECT_GT(s.b_start, 2);
    EXPECT_GT(s.real, s.b_start + 1);
    for (int64_t t = 0; t < 64; ++t) {
      EXPECT_EQ(s.segments[static_cast<size_t>(t)], (t >= s.b_start && t < s.real) ? 1 : 0) << t;
      if (t >= s.real) EXPECT_EQ(s.tokens[static_cast<size_t>(t)], kPad);
    }
    int64_t predicted = 0;
    for (int64_t v : s.targets) predicted += v != -100;
    EXPECT_EQ(predicted, s.masked);
    if (s.random_next) {
      ++random;
    } else {
      EXPECT_EQ(s.lines_b.front(), s.lines_a.back() + 1);
      EXPECT_EQ(c.sentences(false)[static_cast<size_t>(s.lines_b.front())].doc,
                c.sentences(false)[static_cast<size_t>(s.lines_a.back())].doc);
    }
    // The same (split, step, index) is the same sample: what makes layouts agree.
    const PairSample t = data.sample(false, i / 8, i % 8);
    EXPECT_EQ(t.tokens, s.tokens);
    EXPECT_EQ(t.targets, s.targets);
  }
  EXPECT_NEAR(static_cast<double>(random) / samples, 0.5, 0.08);
  // The step's masked count is the sum over its global batch.
  int64_t m = 0;
  for (int i = 0; i < 8; ++i) m += data.sample(false, 3, i).masked;
  EXPECT_EQ(data.masked_in_step(false, 3, 8), m);
}

// Packing keeps every byte of the split in order, whole lines where they fit,
// [SEP] between documents; RoBERTa's masks change with the epoch, the
// validation masks do not.
TEST(EncoderData, FullSentencePackingAndDynamicMasking) {
  SentenceCorpus c(corpus_dir(), 0.1);
  const auto packed = pack_full_sentences(c, false, 40);
  std::string joined, expected;
  int64_t doc = -1;
  for (const auto& s : c.sentences(false)) {
    if (!expected.empty()) expected += s.doc != doc ? '|' : '\n';
    doc = s.doc;
    expected += bytes_of(c, s);
  }
  for (const auto& seq : packed) {
    EXPECT_LE(seq.size(), 40u);
    EXPECT_FALSE(seq.empty());
    std::string text;
    for (int32_t t : seq) text += t == kSep ? '|' : static_cast<char>(t);
    // A separator lost at a sequence boundary: the next sequence starts a line.
    if (!joined.empty() && expected.size() > joined.size() && (expected[joined.size()] == '\n' || expected[joined.size()] == '|'))
      joined += expected[joined.size()];
    joined += text;
  }
  EXPECT_EQ(joined, expected);

  PackedData data(c, 42, 0.15, 11);
  const int64_t n = data.sequences(false);
  std::vector<int64_t> tok, tgt;
  std::set<int64_t> seen;
  for (int64_t g = 0; g < n; ++g) seen.insert(data.sample(false, g, tok, tgt));
  EXPECT_EQ(static_cast<int64_t>(seen.size()), n);  // an epoch visits every sequence once
  int changed = 0;
  for (int64_t g = 0; g <= 20; ++g) {
    std::vector<int64_t> tok1, tgt1, tok2, tgt2;
    const int64_t index = data.sample(false, g, tok1, tgt1);
    // Find the same sequence in the next epoch.
    for (int64_t h = n; h < 2 * n; ++h) {
      std::vector<int64_t> a, b;
      if (data.sample(false, h, a, b) == index) {
        tok2 = a, tgt2 = b;
        break;
      }
    }
    ASSERT_FALSE(tgt2.empty());
    changed += tgt1 != tgt2;
  }
  EXPECT_GE(changed, 20);  // a new mask every epoch
  std::vector<int64_t> v1, t1, v2, t2;
  data.sample(true, 5, v1, t1);
  data.sample(true, 5 + data.sequences(true), v2, t2);
  EXPECT_EQ(t1, t2);  // validation: the same mask every time
  EXPECT_EQ(v1, v2);
}

}  // namespace
}  // namespace encoder
