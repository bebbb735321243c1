// Prepared data: smp-data prepare writes Megatron's indexed format and reads
// back byte for byte; a dataset written by an independent writer of the
// format (a short Python script) reads and trains; every bad input is named.
#include "corpus.h"
#include "reference_check.h"
#include "epoch_index.h"
#include "job_runner.h"
#include "text_dataset.h"

#include <smp/data/indexed_dataset.hpp>
#include <smp/data/tokenizers.hpp>

#include <gtest/gtest.h>

#include <sys/stat.h>


#include <boost/filesystem.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

namespace fs = boost::filesystem;
using smp::testing::plugin_path;
using smp::testing::run_job;
using smp::testing::source_path;

namespace {

fs::path fresh(const std::string& name) {
  fs::path d = fs::temp_directory_path() / fs::unique_path("smp-data-" + name + "-%%%%%%");
  fs::create_directories(d);
  return d;
}
void write(const fs::path& p, const std::string& text) { std::ofstream(p.string(), std::ios::binary) << text; }
std::string slurp(const fs::path& p) {
  std::ifstream in(p.string(), std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}
std::string tool() { return (fs::path(SMP_BIN_DIR) / "smp-data").string(); }
// Runs a command; its exit status and output (stdout and stderr).
std::pair<int, std::string> sh(const std::string& cmd) {
  std::string out;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  const int status = ::pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}
std::string error_of(const std::string& prefix) {
  try {
    smp::sdk::IndexedDataset d(prefix);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}
// A job on the prepared data (gpt-equiv's small GPT), its overrides after.
smp::testing::JobResult train(const std::string& data, std::vector<std::string> sets = {}) {
  sets.insert(sets.begin(), {"model.data=\"" + data + "\"", "model.vocab=257", "train.steps=8"});
  return run_job(1, plugin_path("gpt"), source_path("tests/integration/data/gpt-equiv.toml"), sets);
}

}  // namespace

TEST(PreparedData, PrepareWritesMegatronsFormatAndReadsBackByteForByte) {
  const fs::path d = fresh("prepare");
  write(d / "a.txt", "first document\n");
  write(d / "b.txt", "second, longer document \xc3\xa9\xff\n");  // one invalid UTF-8 byte
  write(d / "c.jsonl", "{\"text\": \"third\"}\n\n{\"text\": \"fourth \\u00e9\", \"id\": 4}\n");
  auto [code, out] = sh(tool() + " prepare --input " + (d / "a.txt").string() + " " + (d / "b.txt").string() +
                        " --output-prefix " + (d / "plain").string() + " --workers 2");
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find("\"invalid_utf8_bytes\":1"), std::string::npos) << out;
  EXPECT_NE(out.find("1 bytes of the input are not valid UTF-8"), std::string::npos) << out;
  smp::sdk::IndexedDataset ds((d / "plain").string());
  EXPECT_EQ(ds.type(), smp::sdk::TokenType::kUint16);
  ASSERT_EQ(ds.documents(), 2);
  ASSERT_EQ(ds.sequences(), 2);
  int64_t at = 0;
  for (const char* name : {"a.txt", "b.txt"}) {
    const std::string text = slurp(d / name);
    ASSERT_EQ(ds.length(at), static_cast<int64_t>(text.size()) + 1) << name;
    const int64_t first = ds.offset(at) / 2;
    for (size_t i = 0; i < text.size(); ++i)
      ASSERT_EQ(ds.token_at(first + static_cast<int64_t>(i)), static_cast<unsigned char>(text[i])) << name << " byte " << i;
    EXPECT_EQ(ds.token_at(first + static_cast<int64_t>(text.size())), 256) << "end of document";
    ++at;
  }
  // The .idx bytes as Megatron's _IndexWriter lays them out.
  const std::string idx = slurp(d / "plain.idx");
  ASSERT_EQ(idx.size(), 34u + 4 * 2 + 8 * 2 + 8 * 3);
  EXPECT_EQ(idx.substr(0, 9), std::string("MMIDIDX\0\0", 9));
  EXPECT_EQ(idx[17], 8) << "uint16";
  // JSON lines: a document per non-blank line, the key's text.
  std::tie(code, out) = sh(tool() + " prepare --input " + (d / "c.jsonl").string() + " --json-key text --output-prefix " +
                           (d / "json").string());
  ASSERT_EQ(code, 0) << out;
  smp::sdk::IndexedDataset js((d / "json").string());
  ASSERT_EQ(js.documents(), 2);
  EXPECT_EQ(js.length(1), static_cast<int64_t>(std::string("fourth \xc3\xa9").size()) + 1);
}

TEST(PreparedData, AnIndependentWritersDatasetReadsAndTrains) {
  if (sh("python3 -c 'import struct'").first != 0) SMP_REFERENCE_UNAVAILABLE() << "python3 is not installed";
  const fs::path d = fresh("python");
  auto [code, out] = sh("python3 " + source_path("tests/integration/data/write_megatron_dataset.py") + " " +
                        (d / "ext").string() + " /usr/share/common-licenses/GPL-3 /usr/share/common-licenses/Apache-2.0");
  ASSERT_EQ(code, 0) << out;
  smp::sdk::IndexedDataset ds((d / "ext").string());
  EXPECT_EQ(ds.type(), smp::sdk::TokenType::kInt32);
  ASSERT_EQ(ds.documents(), 2);
  EXPECT_GT(ds.sequences(), 2) << "several sequences per document";
  // Its tokens are the files' paragraphs' bytes.
  const std::string gpl = slurp("/usr/share/common-licenses/GPL-3");
  for (int64_t i = 0; i < 64; ++i) ASSERT_EQ(ds.token_at(i), static_cast<unsigned char>(gpl[static_cast<size_t>(i)]));
  auto r = train((d / "ext").string(), {"model.val_fraction=0.5"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto losses = r.summary["losses"].get<std::vector<double>>();
  EXPECT_LT(losses.back(), losses.front()) << r.output;
  EXPECT_NE(r.output.find("(prepared, 2 documents)"), std::string::npos) << r.output;
}

TEST(PreparedData, EachBadInputIsNamed) {
  const fs::path d = fresh("bad");
  write(d / "t.txt", std::string(3000, 'x') + "\n");
  ASSERT_EQ(sh(tool() + " prepare --input " + (d / "t.txt").string() + " --output-prefix " + (d / "ok").string()).first, 0);
  // Into a folder not made yet, as the docs write it (data/corpus with no data/).
  ASSERT_EQ(sh(tool() + " prepare --input " + (d / "t.txt").string() + " --output-prefix " + (d / "new/ok").string()).first, 0);
  EXPECT_TRUE(fs::exists(d / "new/ok.idx"));
  const std::string idx = slurp(d / "ok.idx"), bin = slurp(d / "ok.bin");
  auto variant = [&](const std::string& name, std::string i, std::string b) {
    write(d / (name + ".idx"), i);
    write(d / (name + ".bin"), b);
    return error_of((d / name).string());
  };
  std::string magic = idx;
  magic[0] = 'X';
  EXPECT_NE(variant("magic", magic, bin).find("magic.idx: not a Megatron indexed dataset"), std::string::npos);
  std::string version = idx;
  version[9] = 2;
  EXPECT_NE(variant("version", version, bin).find("version.idx: version 2 at offset 9"), std::string::npos);
  std::string dtype = idx;
  dtype[17] = 9;
  EXPECT_NE(variant("dtype", dtype, bin).find("dtype.idx: token dtype code 9"), std::string::npos);
  EXPECT_NE(variant("short_idx", idx.substr(0, idx.size() - 4), bin).find("short_idx.idx: truncated"), std::string::npos);
  EXPECT_NE(variant("short_bin", idx, bin.substr(0, bin.size() - 2)).find("short_bin.bin: truncated: sequence 0"),
            std::string::npos);
  EXPECT_NE(error_of((d / "missing").string()).find("missing.idx: cannot open"), std::string::npos);
  // Tokens outside the model's vocabulary, and splits too small for a sample.
  auto r = train((d / "ok").string(), {"model.vocab=256"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("ok.bin: token 256 at token offset 3001 is outside the model's vocabulary [0, 256)"),
            std::string::npos)
      << r.output;
  r = train((d / "ok").string());  // one document: nothing for validation
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("1 documents of 3002 tokens: 3002 train / 0 validation"), std::string::npos) << r.output;
  // smp-data's own refusals.
  write(d / "bad.jsonl", "{\"text\": \"fine\"}\n{\"body\": \"no text key\"}\n");
  auto [code, out] = sh(tool() + " prepare --input " + (d / "bad.jsonl").string() + " --json-key text --output-prefix " +
                        (d / "j").string());
  EXPECT_NE(code, 0);
  EXPECT_NE(out.find("bad.jsonl:2: no string under the key 'text'"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(d / "j.idx")) << "nothing left behind";
  EXPECT_FALSE(fs::exists(d / "j.bin.tmp")) << "nothing left behind";
  std::tie(code, out) = sh(tool() + " prepare --input " + (d / "nowhere").string() + " --output-prefix " + (d / "n").string());
  EXPECT_NE(code, 0);
  EXPECT_NE(out.find("no such file or folder"), std::string::npos) << out;
  // Issue 51: counts that crashed or hung are refused naming the option
  // (100000 workers: std::terminate; a 2^31 vocabulary: trained without end),
  // a JSON line nested past the bound is refused naming its line, and a
  // named pipe as the input is refused rather than waited on.
  std::tie(code, out) = sh(tool() + " prepare --input " + (d / "t.txt").string() + " --workers 100000 --output-prefix " +
                           (d / "w").string());
  EXPECT_NE(code, 0);
  EXPECT_NE(out.find("--workers"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(d / "w.bin.tmp")) << out;
  std::tie(code, out) = sh(tool() + " tokenizer --input " + (d / "t.txt").string() + " --vocab 2147483647 --output-prefix " +
                           (d / "v").string());
  EXPECT_NE(code, 0);
  EXPECT_NE(out.find("--vocab"), std::string::npos) << out;
  write(d / "deep.jsonl", "{\"text\": " + std::string(100000, '[') + std::string(100000, ']') + "}\n");
  std::tie(code, out) = sh(tool() + " prepare --input " + (d / "deep.jsonl").string() + " --json-key text --output-prefix " +
                           (d / "deep").string());
  EXPECT_NE(code, 0);
  EXPECT_NE(out.find("deep.jsonl:1: nested deeper than"), std::string::npos) << out;
  ASSERT_EQ(::mkfifo((d / "pipe.txt").c_str(), 0600), 0);
  std::tie(code, out) = sh("timeout -s KILL 30 " + tool() + " prepare --input " + (d / "pipe.txt").string() +
                           " --output-prefix " + (d / "p").string());
  EXPECT_EQ(code, 1) << out;
  EXPECT_NE(out.find("a named pipe, not a regular file"), std::string::npos) << out;
}

// Megatron's GPTDataset order: each epoch a seeded shuffle of the documents,
// cut into windows, the windows shuffled; every window once per epoch.
TEST(PreparedData, EachEpochVisitsEverySampleOnce) {
  const fs::path d = fresh("epochs");
  auto [code, out] = sh(tool() + " prepare --input /usr/share/common-licenses --output-prefix " + (d / "lic").string());
  ASSERT_EQ(code, 0) << out;
  const int64_t seq = 64;
  gpt::TextDataset ds((d / "lic").string(), 0.1, seq, 1234, 257);
  const int64_t n = ds.samples_per_epoch();
  ASSERT_GT(n, 100);
  EXPECT_EQ(n, (ds.train_tokens() - 1) / seq) << "documents split train/validation whole";
  std::vector<std::vector<int64_t>> order(2);
  for (int64_t e = 0; e < 2; ++e) {
    std::vector<int> seen(static_cast<size_t>(n), 0);
    for (int64_t g = e * n; g < (e + 1) * n; ++g) {
      const auto [epoch, k] = ds.sample_of(g);
      ASSERT_EQ(epoch, e);
      ASSERT_TRUE(k >= 0 && k < n);
      ++seen[static_cast<size_t>(k)];
      order[static_cast<size_t>(e)].push_back(k);
    }
    EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), n) << "epoch " << e << ": every sample exactly once";
  }
  EXPECT_NE(order[0], order[1]) << "each epoch has its own order";
  // A window is seq + 1 consecutive tokens: targets are the tokens shifted by one.
  std::vector<int64_t> tokens(static_cast<size_t>(4 * seq)), targets(tokens.size());
  ds.fill(false, 3, 4, 0, 4, tokens.data(), targets.data());
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t t = 0; t + 1 < seq; ++t)
      ASSERT_EQ(targets[static_cast<size_t>(i * seq + t)], tokens[static_cast<size_t>(i * seq + t + 1)]);
}

// The same samples whatever the layout, and a resumed run reads exactly the
// samples the uninterrupted run reads next (the position is the step).
TEST(PreparedData, SameSamplesInEveryLayoutAndAcrossAResume) {
  const fs::path d = fresh("layouts");
  auto [code, out] = sh(tool() + " prepare --input /usr/share/common-licenses --output-prefix " + (d / "lic").string());
  ASSERT_EQ(code, 0) << out;
  const std::string data = (d / "lic").string();
  const auto serial = train(data);
  ASSERT_EQ(serial.exit_code, 0) << serial.output;
  const auto want = serial.summary["losses"].get<std::vector<double>>();
  for (const std::vector<std::string>& layout :
       {std::vector<std::string>{"parallel.pp=2", "parallel.dp=2"}, {"parallel.tp=2", "parallel.dp=2"}}) {
    auto r = run_job(4, plugin_path("gpt"), source_path("tests/integration/data/gpt-equiv.toml"),
                     {"model.data=\"" + data + "\"", "model.vocab=257", "train.steps=8", layout[0], layout[1]});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_LT(smp::testing::worst_relative(r.summary["losses"].get<std::vector<double>>(), want), 2e-5)
        << layout[0] << " " << layout[1];
  }
  // Stop after 4 steps with a checkpoint, resume, compare steps 5..8.
  const std::string run = (d / "run").string();
  auto first = train(data, {"run.dir=" + run, "run.checkpoint_every=4", "run.exit_after_steps=4"});
  ASSERT_EQ(first.exit_code, 0) << first.output;
  auto resumed = train(data, {"run.dir=" + run, "run.checkpoint_every=4"});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  const auto got = resumed.summary["losses"].get<std::vector<double>>();
  ASSERT_GE(got.size(), 4u);
  for (size_t i = 0; i < 4; ++i)
    EXPECT_EQ(got[got.size() - 4 + i], want[4 + i]) << "step " << 5 + i << " after the resume";
}

// Blending by weight (Megatron's BlendedDataset): the shares of 10k samples
// within 2% of the weights; a job on a blend trains; a raw-text part is refused.
TEST(PreparedData, BlendingDrawsEachDatasetByItsWeight) {
  const fs::path d = fresh("blend");
  write(d / "a.txt", std::string(20000, 'a'));
  write(d / "b.txt", std::string(20000, 'b'));
  write(d / "a2.txt", std::string(20000, 'a'));
  write(d / "b2.txt", std::string(20000, 'b'));
  for (const char* part : {"a", "b"}) {
    auto [code, out] = sh(tool() + " prepare --input " + (d / (std::string(part) + ".txt")).string() + " " +
                          (d / (std::string(part) + "2.txt")).string() + " --output-prefix " + (d / part).string());
    ASSERT_EQ(code, 0) << out;
  }
  const nlohmann::json blend = nlohmann::json::array(
      {{{"path", (d / "a").string()}, {"weight", 0.7}}, {{"path", (d / "b").string()}, {"weight", 0.3}}});
  auto data = gpt::open_lm_data(blend, 0.5, 16, 1234, 257);
  const int64_t n = 10000;
  std::vector<int64_t> tokens(static_cast<size_t>(n * 16)), targets(tokens.size());
  data->fill(false, 0, n, 0, n, tokens.data(), targets.data());
  int64_t from_a = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = tokens[static_cast<size_t>(i * 16)] == 256 ? tokens[static_cast<size_t>(i * 16 + 1)]
                                                                  : tokens[static_cast<size_t>(i * 16)];
    ASSERT_TRUE(t == 'a' || t == 'b') << t;
    from_a += t == 'a';
  }
  EXPECT_NEAR(static_cast<double>(from_a) / n, 0.7, 0.02);
  // The same samples however the batch is cut into requests (layouts, microbatches).
  std::vector<int64_t> again(tokens.size()), again_t(tokens.size());
  for (int64_t first = 0; first < n; first += 1000)
    data->fill(false, 0, n, first, 1000, again.data() + first * 16, again_t.data() + first * 16);
  EXPECT_EQ(again, tokens);
  // A job on the blend.
  const std::string value = "[{ path = \"" + (d / "a").string() + "\", weight = 0.7 }, { path = \"" +
                            (d / "b").string() + "\", weight = 0.3 }]";
  auto r = run_job(1, plugin_path("gpt"), source_path("tests/integration/data/gpt-equiv.toml"),
                   {"model.data=" + value, "model.vocab=257", "train.steps=4", "model.val_fraction=0.5"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("blending 2 datasets"), std::string::npos) << r.output;
  // Raw text cannot be blended.
  const nlohmann::json raw = nlohmann::json::array(
      {{{"path", (d / "a").string()}, {"weight", 1}}, {{"path", (d / "b.txt").string()}, {"weight", 1}}});
  try {
    gpt::open_lm_data(raw, 0.5, 16, 1, 257);
    ADD_FAILURE() << "a raw-text part was accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("model.data[1]: blending needs prepared datasets"), std::string::npos)
        << e.what();
  }
}

// SentencePiece: train a model on the licences, prepare with it, and the
// dataset's ids decode back to the very text (identity normalization, byte
// fallback); a job trains on it.
TEST(PreparedData, SentencePieceTrainEncodeDecodeRoundTrip) {
#ifndef SMP_HAVE_SENTENCEPIECE
  GTEST_SKIP() << "built without SentencePiece (scripts/setup.sh installs libsentencepiece-dev)";
#else
  const fs::path d = fresh("spm");
  for (const char* type : {"unigram", "bpe"}) {
    SCOPED_TRACE(type);
    const std::string model = (d / type).string();
    auto [code, out] = sh(tool() + " tokenizer --type " + type + " --vocab 600 --input /usr/share/common-licenses " +
                          "--output-prefix " + model);
    ASSERT_EQ(code, 0) << out;
    std::tie(code, out) = sh(tool() + " prepare --input /usr/share/common-licenses/GPL-3 /usr/share/common-licenses/MPL-2.0 "
                             "--tokenizer sentencepiece --tokenizer-model " + model + ".model --output-prefix " +
                             (d / (std::string(type) + "-data")).string());
    ASSERT_EQ(code, 0) << out;
    EXPECT_NE(out.find("\"vocab\":600"), std::string::npos) << out;
    const std::string data = (d / (std::string(type) + "-data")).string();
    smp::sdk::IndexedDataset ds(data);
    ASSERT_EQ(ds.documents(), 2);
    for (int64_t doc = 0; doc < 2; ++doc) {
      const std::string text = slurp(doc == 0 ? "/usr/share/common-licenses/GPL-3" : "/usr/share/common-licenses/MPL-2.0");
      const fs::path back = d / "decoded.txt";
      std::tie(code, out) = sh(tool() + " decode --tokenizer sentencepiece --tokenizer-model " + model + ".model --prefix " + data +
                               " --document " + std::to_string(doc) + " > " + back.string());
      ASSERT_EQ(code, 0) << out;
      EXPECT_EQ(slurp(back), text) << "document " << doc;
      EXPECT_LT(ds.length(doc), static_cast<int64_t>(text.size()) / 2) << "pieces longer than bytes";
    }
  }
  auto r = train((d / "unigram-data").string(), {"model.vocab=600", "model.val_fraction=0.5"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // In this process, beside LibTorch (libsmp_sentencepiece is bound deep):
  // the SDK's tokenizer gives the ids smp-data wrote.
  {
    smp::sdk::SentencePieceTokenizer tok((d / "unigram.model").string());
    smp::sdk::IndexedDataset ds((d / "unigram-data").string());
    std::vector<int64_t> ids = tok.encode(slurp("/usr/share/common-licenses/GPL-3"));
    ids.push_back(tok.eod());
    ASSERT_EQ(static_cast<int64_t>(ids.size()), ds.length(0));
    for (int64_t i = 0; i < ds.length(0); ++i) ASSERT_EQ(ds.token_at(i), ids[static_cast<size_t>(i)]) << i;
    EXPECT_EQ(tok.decode(std::vector<int64_t>(ids.begin(), ids.end() - 1)), slurp("/usr/share/common-licenses/GPL-3"));
  }
  // Raw text tokenized at start (model.tokenizer): the vocabulary is the
  // tokenizer's, the log says so, and a model.vocab below it is refused.
  r = train("/usr/share/common-licenses/GPL-3", {"model.vocab=600", "model.tokenizer=\"sentencepiece\"",
                                                 "model.tokenizer_model=\"" + (d / "bpe.model").string() + "\""});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("(tokenized by sentencepiece:"), std::string::npos) << r.output;
  r = train("/usr/share/common-licenses/GPL-3", {"model.vocab=500", "model.tokenizer=\"sentencepiece\"",
                                                 "model.tokenizer_model=\"" + (d / "bpe.model").string() + "\""});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("model.vocab = 500 is smaller than the vocabulary of sentencepiece:"), std::string::npos)
      << r.output;
  // A bad model file is named.
  write(d / "bad.model", "not a model");
  auto [code, out] = sh(tool() + " prepare --input /usr/share/common-licenses/GPL-3 --tokenizer sentencepiece "
                        "--tokenizer-model " + (d / "bad.model").string() + " --output-prefix " + (d / "x").string());
  EXPECT_NE(code, 0);
  EXPECT_NE(out.find("bad.model: not a SentencePiece model"), std::string::npos) << out;
#endif
}

// Byte-level BPE token for token against Hugging Face's `tokenizers`
// (tests/integration/data/bpe_reference.py trains a GPT-2-style and a Llama
// 3-style tokenizer on a licence and encodes a text of many scripts, digits,
// contractions, whitespace runs and CR LF): the same ids from tokenizer.json,
// from vocab.json + merges.txt, and from smp-data encode; decode gives the text back.
TEST(Tokenizers, ByteLevelBpeMatchesHuggingFaceTokenForToken) {
  const fs::path d = fresh("bpe");
  const std::string text = slurp(source_path("tests/integration/data/bpe_text.txt"));
  ASSERT_FALSE(text.empty());
  if (sh("python3 -c 'import sys'").first != 0) SMP_REFERENCE_UNAVAILABLE() << "python3 is not installed";
  auto [code, out] = sh("PYTHONPATH=" + source_path(".pydeps") + " python3 " +
                        source_path("tests/integration/data/bpe_reference.py") + " /usr/share/common-licenses/GPL-3 " +
                        source_path("tests/integration/data/bpe_text.txt") + " " + d.string());
  if (code == 77 || (code != 0 && out.find("No module named") != std::string::npos))
    SMP_REFERENCE_UNAVAILABLE() << "the reference is not installable here: " << out;
  ASSERT_EQ(code, 0) << out;
  const auto expected = nlohmann::json::parse(slurp(d / "expected.json"));
  struct Case {
    std::string name, model, merges, key;
  };
  for (const Case& c : {Case{"gpt2 tokenizer.json", "gpt2.json", "", "gpt2"},
                        Case{"gpt2 vocab.json + merges.txt", "gpt2-vocab.json", "gpt2-merges.txt", "gpt2"},
                        Case{"llama3 tokenizer.json", "llama3.json", "", "llama3"}}) {
    SCOPED_TRACE(c.name);
    const auto tok = smp::sdk::open_tokenizer("bpe", (d / c.model).string(),
                                              c.merges.empty() ? "" : (d / c.merges).string(), "test");
    const std::vector<int64_t> want = expected[c.key].get<std::vector<int64_t>>();
    const std::vector<int64_t> ids = tok->encode(text);
    ASSERT_EQ(ids.size(), want.size());
    for (size_t i = 0; i < ids.size(); ++i) ASSERT_EQ(ids[i], want[i]) << "token " << i;
    EXPECT_EQ(tok->decode(ids), text);
    EXPECT_EQ(tok->eod(), expected[c.key + "_eod"].get<int64_t>());
  }
  std::tie(code, out) = sh(tool() + " encode --tokenizer bpe --tokenizer-model " + (d / "llama3.json").string() +
                           " < " + source_path("tests/integration/data/bpe_text.txt"));
  ASSERT_EQ(code, 0) << out;
  EXPECT_EQ(nlohmann::json::parse(out), expected["llama3"]);
  // A GPT trains on raw text tokenized by it at start.
  auto r = train("/usr/share/common-licenses/GPL-3",
                 {"model.vocab=1500", "model.tokenizer=\"bpe\"",
                  "model.tokenizer_model=\"" + (d / "llama3.json").string() + "\""});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("(tokenized by bpe:"), std::string::npos) << r.output;
}

// Every tokenizer file that does not parse, or asks for what is not
// supported, is refused naming the file and what is wrong.
TEST(Tokenizers, BadTokenizerFilesAreNamed) {
  const fs::path d = fresh("badtok");
  auto error = [&](const std::string& kind, const std::string& model, const std::string& merges = "") {
    try {
      smp::sdk::open_tokenizer(kind, model, merges, "model.tokenizer");
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  auto file = [&](const std::string& name, const std::string& text) {
    write(d / name, text);
    return (d / name).string();
  };
  // The byte map's 256 pieces, the smallest byte-level vocabulary.
  nlohmann::json vocab = nlohmann::json::object();
  const auto& chars = smp::sdk::detail::byte_chars();
  for (size_t b = 0; b < 256; ++b) vocab[chars[b]] = b;
  vocab["<|endoftext|>"] = 256;
  const nlohmann::json bytelevel = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  auto tokenizer_json = [&](nlohmann::json model, nlohmann::json pre = nullptr, nlohmann::json norm = nullptr) {
    return nlohmann::json{{"model", model}, {"pre_tokenizer", pre.is_null() ? bytelevel : pre}, {"normalizer", norm}}
        .dump();
  };
  const nlohmann::json bpe = {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}};
  EXPECT_EQ(error("bpe", file("ok.json", tokenizer_json(bpe))), "");
  EXPECT_NE(error("bpe", file("a.json", "{not json")).find("a.json: not JSON"), std::string::npos);
  EXPECT_NE(error("bpe", (d / "missing.json").string()).find("cannot open " + (d / "missing.json").string()),
            std::string::npos);
  nlohmann::json wordpiece = bpe;
  wordpiece["type"] = "WordPiece";
  EXPECT_NE(error("bpe", file("b.json", tokenizer_json(wordpiece))).find("b.json: model.type is WordPiece"),
            std::string::npos);
  EXPECT_NE(error("bpe", file("c.json", tokenizer_json(bpe, nullptr, {{"type", "NFKC"}})))
                .find("c.json: \"normalizer\" NFKC is not supported"),
            std::string::npos);
  const nlohmann::json split = {{"type", "Sequence"},
                                {"pretokenizers",
                                 {{{"type", "Split"}, {"pattern", {{"Regex", "\\w+"}}}, {"behavior", "Isolated"}},
                                  {{"type", "ByteLevel"}, {"use_regex", false}}}}};
  EXPECT_NE(error("bpe", file("e.json", tokenizer_json(bpe, split))).find("e.json: pre_tokenizer Split pattern '\\w+'"),
            std::string::npos);
  nlohmann::json bad_merge = bpe;
  bad_merge["merges"] = {"a zz"};
  EXPECT_NE(error("bpe", file("f.json", tokenizer_json(bad_merge)))
                .find("f.json: merge 1 'a zz' names a piece that is not in the vocabulary"),
            std::string::npos);
  nlohmann::json no_bytes = bpe;
  no_bytes["vocab"].erase("a");
  EXPECT_NE(error("bpe", file("g.json", tokenizer_json(no_bytes))).find("g.json: the vocabulary lacks byte 97"),
            std::string::npos);
  nlohmann::json no_eod = bpe;
  no_eod["vocab"].erase("<|endoftext|>");
  EXPECT_NE(error("bpe", file("h.json", tokenizer_json(no_eod))).find("h.json: no end-of-text token"),
            std::string::npos);
  const std::string v = file("vocab.json", vocab.dump());
  EXPECT_NE(error("bpe", v, file("merges.txt", "#version: 0.2\na b c\n")).find("merges.txt:2: not two pieces separated by a space"),
            std::string::npos);
  EXPECT_NE(error("sentencepiece", file("x.model", "not a model")).find("x.model: not a SentencePiece model"),
            std::string::npos);
  EXPECT_NE(error("wordpiece", "").find("model.tokenizer: 'wordpiece' is not known"), std::string::npos);
  // A dataset whose dtype cannot hold the tokenizer's ids was prepared with another one.
  nlohmann::json wide = bpe;
  wide["vocab"].erase("<|endoftext|>");
  wide["vocab"]["<|endoftext|>"] = 70000;
  const auto big = smp::sdk::open_tokenizer("bpe", file("wide.json", tokenizer_json(wide)), "", "model.tokenizer");
  ASSERT_EQ(big->vocab(), 70001);
  {
    smp::sdk::IndexedDatasetWriter w((d / "narrow").string(), smp::sdk::TokenType::kUint16);
    for (int doc = 0; doc < 20; ++doc) w.add_document(std::vector<int64_t>(50, doc));
    w.finish();
  }
  try {
    gpt::TextDataset narrow((d / "narrow").string(), 0.1, 8, 1, 70001, big.get());
    ADD_FAILURE() << "a uint16 dataset was taken for a vocabulary of 70001";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("narrow.idx: stores uint16 ids (65536 of them), too few for the vocabulary of "
                                         "bpe:"),
              std::string::npos)
        << e.what();
  }
  EXPECT_NE(error("bytes", "x").find("model.tokenizer = \"bytes\" takes no tokenizer files"), std::string::npos);
}

// BERT and RoBERTa on prepared data: smp-data prepare --split-sentences writes
// a sequence per non-blank line (no end-of-document id), the encoders read the
// sequences as sentences with the same ids as the raw text's lines, BERT gives
// the serial losses under pp 2 x dp 2, and RoBERTa trains on SentencePiece
// sentences with the vocabulary taken from model.tokenizer.
TEST(PreparedData, EncodersTrainOnSentencesPreparedWithSplitSentences) {
  const fs::path d = fresh("enc");
  const std::string data = (d / "sentences").string();
  auto [code, out] = sh(tool() + " prepare --split-sentences --input /usr/share/common-licenses/GPL-3 "
                        "/usr/share/common-licenses/Apache-2.0 --output-prefix " + data);
  ASSERT_EQ(code, 0) << out;
  encoder::SentenceCorpus raw_gpl("/usr/share/common-licenses/GPL-3", 0.5),
      raw_apache("/usr/share/common-licenses/Apache-2.0", 0.5), prepared(data, 0.5);
  std::vector<std::string> want, got;
  auto lines = [](const encoder::SentenceCorpus& c, std::vector<std::string>& to) {
    for (bool val : {false, true})
      for (const auto& s : c.sentences(val)) {
        std::string line;
        for (int64_t i = 0; i < s.length; ++i) line += static_cast<char>(c.token(s, i));
        to.push_back(line);
      }
  };
  lines(raw_gpl, want), lines(raw_apache, want), lines(prepared, got);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], want[i]) << "sentence " << i;
  EXPECT_EQ(prepared.sentences(true).front().doc, 1) << "split by documents";
  EXPECT_EQ(prepared.line_break(), -1);

  const std::string bert_cfg = source_path("tests/integration/data/bert-equiv.toml");
  // Without dropout, as BertEquivalence's data-parallel layouts.
  const std::vector<std::string> sets = {"model.data=\"" + data + "\"", "model.val_fraction=0.5", "model.dropout=0",
                                         "run.dump_parameters=false"};
  auto serial = run_job(1, plugin_path("bert"), bert_cfg, sets);
  ASSERT_EQ(serial.exit_code, 0) << serial.output;
  EXPECT_NE(serial.output.find("(prepared): "), std::string::npos) << serial.output;
  auto split = sets;
  split.insert(split.end(), {"parallel.pp=2", "parallel.dp=2"});
  auto r = run_job(4, plugin_path("bert"), bert_cfg, split);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_LT(smp::testing::worst_relative(r.summary["losses"].get<std::vector<double>>(),
                                         serial.summary["losses"].get<std::vector<double>>()),
            2e-5);
#ifdef SMP_HAVE_SENTENCEPIECE
  const std::string model = (d / "spm").string();
  std::tie(code, out) = sh(tool() + " tokenizer --type unigram --vocab 600 --input /usr/share/common-licenses/GPL-3 "
                           "--output-prefix " + model);
  ASSERT_EQ(code, 0) << out;
  std::tie(code, out) = sh(tool() + " prepare --split-sentences --tokenizer sentencepiece --tokenizer-model " + model +
                           ".model --input /usr/share/common-licenses/GPL-3 /usr/share/common-licenses/Apache-2.0 "
                           "--output-prefix " + data + "-spm");
  ASSERT_EQ(code, 0) << out;
  r = run_job(1, plugin_path("roberta"), bert_cfg,
              {"model.data=\"" + data + "-spm\"", "model.val_fraction=0.5", "run.dump_parameters=false",
               "model.tokenizer=\"sentencepiece\"", "model.tokenizer_model=\"" + model + ".model\"",
               "model.vocab_multiple=1"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("(vocabulary 600 + 4 special)"), std::string::npos) << r.output;
  // A model.vocab below the data's ids and the special tokens is refused.
  r = run_job(1, plugin_path("roberta"), bert_cfg,
              {"model.data=\"" + data + "-spm\"", "model.val_fraction=0.5", "model.tokenizer=\"sentencepiece\"",
               "model.tokenizer_model=\"" + model + ".model\"", "model.vocab=600"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("model.vocab: the data's 600 ids and [PAD], [CLS], [SEP], [MASK] need at least 604, got 600"),
            std::string::npos)
      << r.output;
#endif
}

// The epoch indices are cached beside the dataset (<prefix>.smp-index/): a
// second reader maps the same file and draws the same samples as an index
// built in memory; a re-prepared dataset gets a file of its own (its key
// changes, the stale one is never read); a damaged file is named; a folder that
// cannot be written leaves the indices in memory with a warning; a job writes
// them where model.data_cache_path says.
TEST(PreparedData, EpochIndicesAreCachedBesideTheDatasetAndRebuiltWhenStale) {
  const fs::path d = fresh("cache");
  std::string text;
  for (int i = 0; i < 60; ++i) text += "document " + std::to_string(i) + " " + std::string(40 + i % 7, 'a' + i % 26) + "\n";
  for (int i = 0; i < 6; ++i) write(d / ("doc" + std::to_string(i) + ".txt"), text.substr(static_cast<size_t>(i) * 300, 600));
  const std::string prefix = (d / "set").string();
  auto [code, out] = sh(tool() + " prepare --input " + d.string() + " --output-prefix " + prefix);
  ASSERT_EQ(code, 0) << out;
  auto files = [&](const fs::path& folder) {
    std::vector<std::string> names;
    if (fs::exists(folder))
      for (const auto& e : fs::directory_iterator(folder)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  };
  const fs::path folder = prefix + ".smp-index";
  std::vector<std::pair<int64_t, int64_t>> first;
  {
    gpt::TextDataset a(prefix, 0.2, 8, 7, 257);
    for (int64_t g = 0; g < 2 * a.samples_per_epoch(); ++g) first.push_back(a.sample_of(g));
  }
  const auto written = files(folder);
  ASSERT_EQ(written.size(), 2u) << "one file per epoch";
  EXPECT_EQ(written[0].rfind("epoch-000000-", 0), 0u) << written[0];
  const auto mtime = fs::last_write_time(folder / written[0]);
  {
    gpt::TextDataset b(prefix, 0.2, 8, 7, 257);
    for (int64_t g = 0; g < 2 * b.samples_per_epoch(); ++g) ASSERT_EQ(b.sample_of(g), first[static_cast<size_t>(g)]);
  }
  EXPECT_EQ(files(folder), written) << "read, not written again";
  EXPECT_EQ(fs::last_write_time(folder / written[0]), mtime);
  // A mapped index equals one built in memory.
  {
    std::vector<int64_t> lens{5, 9, 2, 7};
    auto built = gpt::EpochIndex::build(lens, 3, 42);
    auto mapped = gpt::EpochIndex::cached((d / "x").string(), 1, 0, lens, 3, 42);
    ASSERT_TRUE(mapped->mapped());
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(mapped->docs()[i], built->docs()[i]);
      EXPECT_EQ(mapped->ends()[i], built->ends()[i]);
    }
    for (int i = 0; i < 3; ++i) EXPECT_EQ(mapped->windows()[i], built->windows()[i]);
  }
  // Re-prepared (other documents): a new key, a new file.
  write(d / "doc0.txt", std::string(700, 'z'));
  std::tie(code, out) = sh(tool() + " prepare --input " + d.string() + " --output-prefix " + prefix);
  ASSERT_EQ(code, 0) << out;
  {
    gpt::TextDataset c(prefix, 0.2, 8, 7, 257);
    c.sample_of(0);
  }
  EXPECT_EQ(files(folder).size(), 3u);
  // Damaged: named.
  for (const auto& name : files(folder)) fs::resize_file(folder / name, 40);
  try {
    gpt::TextDataset e(prefix, 0.2, 8, 7, 257);
    e.sample_of(0);
    ADD_FAILURE() << "a damaged index was read";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("is not the index of epoch 0"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("delete it to have it rebuilt"), std::string::npos) << e.what();
  }
  // Unwritable: in memory, the same samples.
  {
    gpt::TextDataset f(prefix, 0.2, 8, 7, 257, nullptr, "/proc/smp-no-such-folder");
    gpt::TextDataset g(prefix, 0.2, 8, 7, 257, nullptr, (d / "elsewhere").string());
    for (int64_t s = 0; s < f.samples_per_epoch(); ++s) ASSERT_EQ(f.sample_of(s), g.sample_of(s));
  }
  EXPECT_EQ(files(d / "elsewhere").size(), 1u);
  // A job's model.data_cache_path.
  auto r = train(prefix, {"model.data_cache_path=\"" + (d / "job-cache").string() + "\"", "model.seq_len=16",
                          "model.val_fraction=0.2"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_FALSE(files(d / "job-cache").empty());
}

// Megatron-LM's own reader and writer (megatron-core's indexed_dataset.py,
// tests/integration/data/megatron_indexed.py): Megatron's reader reads what
// smp-data prepare writes (one sequence per document, and sentences) with the
// same lengths, document index and ids; smp reads what Megatron's
// IndexedDatasetBuilder writes (documents of several sequences) and a GPT
// trains on it. Skipped, saying why, where megatron-core, numpy or torch is not
// installable (scripts/setup.sh puts megatron-core and numpy in .pydeps/, and
// Debian's python3-torch beside libtorch-dev). The first interpreter that has
// torch runs it: python3 on PATH (pip's torch in CI's leg 2), else Debian's.
TEST(PreparedData, MegatronsOwnReaderAndWriterAgreeWithOurs) {
  const fs::path d = fresh("megatron");
  std::string script, out, why;
  int code = 77;
  for (const std::string python : {"python3", "/usr/bin/python3"}) {
    if (sh(python + " -c 'import sys'").first != 0) {
      why += python + ": not installed; ";
      continue;
    }
    script = "SMP_PYDEPS=" + source_path(".pydeps") + " " + python + " " +
             source_path("tests/integration/data/megatron_indexed.py");
    std::tie(code, out) = sh(script + " write " + (d / "theirs").string());
    if (code != 77) break;
    why += python + ": " + out + "; ";
  }
  if (code == 77) SMP_REFERENCE_UNAVAILABLE() << "Megatron's reader is not installable here: " << why;
  ASSERT_EQ(code, 0) << out;
  const auto docs = nlohmann::json::parse(out.substr(out.find('{')))["documents"];
  smp::sdk::IndexedDataset theirs((d / "theirs").string());
  ASSERT_EQ(theirs.documents(), static_cast<int64_t>(docs.size()));
  ASSERT_EQ(theirs.type(), smp::sdk::TokenType::kUint16);
  int64_t q = 0;
  for (size_t doc = 0; doc < docs.size(); ++doc) {
    ASSERT_EQ(theirs.document_start(static_cast<int64_t>(doc)), q);
    for (const auto& seq : docs[doc]) {
      ASSERT_EQ(theirs.length(q), static_cast<int64_t>(seq.size()));
      const int64_t first = theirs.offset(q) / 2;
      for (size_t i = 0; i < seq.size(); ++i) ASSERT_EQ(theirs.token_at(first + static_cast<int64_t>(i)), seq[i].get<int64_t>());
      ++q;
    }
  }
  auto r = train((d / "theirs").string(), {"model.vocab=320", "model.seq_len=16", "model.val_fraction=0.2"});
  ASSERT_EQ(r.exit_code, 0) << r.output;

  for (const std::string flags : {"", " --split-sentences"}) {
    SCOPED_TRACE(flags);
    const std::string ours = (d / ("ours" + std::to_string(flags.size()))).string();
    std::tie(code, out) = sh(tool() + " prepare" + flags + " --input /usr/share/common-licenses/GPL-3 "
                             "/usr/share/common-licenses/BSD --output-prefix " + ours);
    ASSERT_EQ(code, 0) << out;
    std::tie(code, out) = sh(script + " read " + ours);
    ASSERT_EQ(code, 0) << out;
    const auto j = nlohmann::json::parse(out.substr(out.find('{')));
    smp::sdk::IndexedDataset ds(ours);
    EXPECT_EQ(j["dtype"], "uint16");
    ASSERT_EQ(j["lengths"].size(), static_cast<size_t>(ds.sequences()));
    for (int64_t s = 0; s < ds.sequences(); ++s) ASSERT_EQ(j["lengths"][static_cast<size_t>(s)].get<int64_t>(), ds.length(s));
    ASSERT_EQ(j["document_indices"].size(), static_cast<size_t>(ds.documents() + 1));
    for (int64_t doc = 0; doc <= ds.documents(); ++doc)
      ASSERT_EQ(j["document_indices"][static_cast<size_t>(doc)].get<int64_t>(), ds.document_start(doc));
    const auto tokens = j["tokens"].get<std::vector<int64_t>>();
    ASSERT_EQ(static_cast<int64_t>(tokens.size()), ds.total_tokens());
    for (int64_t i = 0; i < ds.total_tokens(); ++i) ASSERT_EQ(tokens[static_cast<size_t>(i)], ds.token_at(i)) << i;
  }
}
