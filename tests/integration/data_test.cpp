// Prepared data: smp-data prepare writes Megatron's indexed format and reads
// back byte for byte; a dataset written by an independent writer of the
// format (a short Python script) reads and trains; every bad input is named.
#include "job_runner.h"
#include "text_dataset.h"

#include <smp/sdk/indexed_dataset.hpp>

#include <gtest/gtest.h>


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
  if (sh("python3 -c 'import struct'").first != 0) GTEST_SKIP() << "python3 is not installed";
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
      std::tie(code, out) = sh(tool() + " decode --tokenizer-model " + model + ".model --prefix " + data +
                               " --document " + std::to_string(doc) + " > " + back.string());
      ASSERT_EQ(code, 0) << out;
      EXPECT_EQ(slurp(back), text) << "document " << doc;
      EXPECT_LT(ds.length(doc), static_cast<int64_t>(text.size()) / 2) << "pieces longer than bytes";
    }
  }
  auto r = train((d / "unigram-data").string(), {"model.vocab=600", "model.val_fraction=0.5"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // A bad model file is named.
  write(d / "bad.model", "not a model");
  auto [code, out] = sh(tool() + " prepare --input /usr/share/common-licenses/GPL-3 --tokenizer sentencepiece "
                        "--tokenizer-model " + (d / "bad.model").string() + " --output-prefix " + (d / "x").string());
  EXPECT_NE(code, 0);
  EXPECT_NE(out.find("bad.model: not a SentencePiece model"), std::string::npos) << out;
#endif
}
