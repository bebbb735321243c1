// Inputs at the edge (issue 51): sampling settings refused by name and top_p 0
// meaning greedy; tokenizer files read as regular files only (a named pipe
// refused, not waited on), two pieces at one id refused, type errors in a
// tokenizer.json named by file and key; read_tokenizer_files giving back the
// bytes it validated; summary.json and report.html never half-written when
// the disk is full (a file size limit in a child process stands in for it).
#include <smp/error.h>
#include <smp/generation.h>
#include <smp/data/tokenizers.hpp>

#include "trainer/run_report.h"

#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <nlohmann/json.hpp>

#include <csignal>
#include <dirent.h>
#include <cstdio>
#include <cstdlib>
#include <fcntl.h>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

namespace {

std::string fresh(const std::string& name) {
  std::string tmpl = (std::getenv("TMPDIR") ? std::string(std::getenv("TMPDIR")) : std::string("/tmp")) +
                     "/smp-edge-" + name + "-XXXXXX";
  const char* made = ::mkdtemp(tmpl.data());
  if (!made) throw std::runtime_error("mkdtemp failed");
  return made;
}

std::string write(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

// `f` in a child process, which dies of SIGALRM after `seconds` (a hang
// fails the test rather than blocking it) and may first lower its file size
// limit to `fsize` bytes (writes past it fail with EFBIG: SIGXFSZ ignored).
// Returns the message `f` threw ("" when it returned), or why the child died.
std::string in_child(const std::function<void()>& f, unsigned seconds = 20, rlim_t fsize = RLIM_INFINITY) {
  int fds[2];
  if (::pipe(fds) != 0) return "pipe failed";
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    ::alarm(seconds);
    if (fsize != RLIM_INFINITY) {
      std::signal(SIGXFSZ, SIG_IGN);
      const rlimit lim{fsize, fsize};
      ::setrlimit(RLIMIT_FSIZE, &lim);
    }
    std::string message;
    try {
      f();
    } catch (const std::exception& e) {
      message = e.what();
      if (message.empty()) message = "(an exception with no message)";
    }
    size_t at = 0;
    while (at < message.size()) {
      const ssize_t n = ::write(fds[1], message.data() + at, message.size() - at);
      if (n <= 0) break;
      at += static_cast<size_t>(n);
    }
    ::close(fds[1]);
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) out.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (WIFSIGNALED(status))
    return "CHILD KILLED by signal " + std::to_string(WTERMSIG(status)) +
           (WTERMSIG(status) == SIGALRM ? " (it hung)" : "");
  return out;
}

// ---------------------------------------------------------------- sampling

TEST(Sampling, NanAndOutOfRangeSettingsAreRefusedByName) {
  auto message = [](smp::Sampling s, const std::string& names) {
    try {
      smp::check_sampling(s, names);
    } catch (const smp::Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  smp::Sampling s;
  s.temperature = std::nan("");
  EXPECT_NE(message(s, "--").find("--temperature is nan"), std::string::npos) << message(s, "--");
  EXPECT_NE(message(s, "sampling.").find("sampling.temperature is nan"), std::string::npos);
  s.temperature = INFINITY;
  EXPECT_NE(message(s, "--").find("--temperature is inf"), std::string::npos) << message(s, "--");
  s.temperature = -1;
  EXPECT_NE(message(s, "--").find("--temperature is -1"), std::string::npos);
  s = {};
  s.top_p = std::nan("");
  EXPECT_NE(message(s, "--").find("--top-p is nan"), std::string::npos) << message(s, "--");
  s.top_p = 1.5;
  EXPECT_NE(message(s, "--").find("--top-p is 1.5"), std::string::npos);
  s = {};
  s.top_k = -3;
  EXPECT_NE(message(s, "--").find("--top-k is -3"), std::string::npos);
  s = {};
  s.temperature = 0.7, s.top_p = 0, s.top_k = 5;
  EXPECT_EQ(message(s, "--"), "");
}

// next_token itself refuses what it cannot sample with, by name, rather than
// failing inside LibTorch's sampler.
TEST(Sampling, NextTokenRefusesANanTemperatureByName) {
  at::Generator gen = at::detail::createCPUGenerator(1);
  const at::Tensor logits = at::randn({50}, at::kDouble);
  smp::Sampling s;
  s.temperature = std::nan("");
  try {
    smp::next_token(logits, s, gen);
    ADD_FAILURE() << "temperature nan was sampled with";
  } catch (const smp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("sampling.temperature is nan"), std::string::npos) << e.what();
  }
}

// top_p 0 keeps the most likely token only (transformers keeps at least one):
// the greedy token at any temperature; a top_p below the top token's
// probability as well; a tiny temperature is greedy too, not NaN.
TEST(Sampling, TopPZeroIsGreedy) {
  at::Generator gen = at::detail::createCPUGenerator(7);
  for (int trial = 0; trial < 50; ++trial) {
    const at::Tensor logits = at::randn({97}, at::kDouble) * 3;
    const int64_t greedy = logits.argmax().item<int64_t>();
    for (const double t : {0.5, 1.0, 2.0}) {
      smp::Sampling s;
      s.temperature = t;
      s.top_p = 0;
      EXPECT_EQ(smp::next_token(logits, s, gen), greedy);
      s.top_p = 1e-9;
      EXPECT_EQ(smp::next_token(logits, s, gen), greedy);
    }
    smp::Sampling tiny;
    tiny.temperature = 1e-300;
    EXPECT_EQ(smp::next_token(logits, tiny, gen), greedy);
  }
}

// smp-generate refuses the options before it loads anything, naming each.
TEST(Sampling, SmpGenerateRefusesNanOptionsByName) {
  auto run = [](const std::string& args) {
    const std::string cmd = std::string(SMP_BIN_DIR) +
                            "/smp-generate --plugin none --config /nonexistent.toml --checkpoint /nonexistent "
                            "--prompt x " +
                            args + " 2>&1";
    FILE* p = ::popen(cmd.c_str(), "r");
    std::string out;
    char buf[512];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
    const int rc = ::pclose(p);
    return std::make_pair(rc, out);
  };
  auto [rc, out] = run("--top-p nan");
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("--top-p is nan"), std::string::npos) << out;
  std::tie(rc, out) = run("--temperature nan");
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("--temperature is nan"), std::string::npos) << out;
  std::tie(rc, out) = run("--temperature inf");
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("--temperature"), std::string::npos) << out;
  // Found from outside: seeds past 2^63 and --eos-id -2 were accepted silently.
  for (const char* seed : {"18446744073709551616", "-1", "12x"}) {
    std::tie(rc, out) = run(std::string("--seed ") + seed);
    EXPECT_NE(rc, 0);
    EXPECT_NE(out.find(std::string("--seed ") + seed + ": expected a whole number"), std::string::npos) << out;
  }
  std::tie(rc, out) = run("--eos-id -2");
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("--eos-id is -2"), std::string::npos) << out;
}

// --------------------------------------------------------------- tokenizers

// The smallest byte-level vocabulary: the byte map's 256 pieces and <|endoftext|>.
nlohmann::json byte_vocab() {
  nlohmann::json vocab = nlohmann::json::object();
  const auto& chars = smp::sdk::detail::byte_chars();
  for (size_t b = 0; b < 256; ++b) vocab[chars[b]] = b;
  vocab["<|endoftext|>"] = 256;
  return vocab;
}
nlohmann::json tokenizer_json(const nlohmann::json& vocab) {
  return {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}},
          {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
          {"normalizer", nullptr}};
}

std::string load_error(const std::string& kind, const std::string& model, const std::string& merges = "") {
  try {
    smp::sdk::open_tokenizer(kind, model, merges, "model.tokenizer");
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST(TokenizerFiles, TwoPiecesWithOneIdAreRefusedNamingBoth) {
  const std::string d = fresh("dup");
  nlohmann::json vocab = byte_vocab();
  vocab["<|endoftext|>"] = vocab["A"];  // 'A' and <|endoftext|> at one id
  const std::string id = std::to_string(vocab["A"].get<int>());
  std::string e = load_error("bpe", write(d + "/dup.json", tokenizer_json(vocab).dump()));
  EXPECT_NE(e.find("dup.json"), std::string::npos) << e;
  EXPECT_NE(e.find("'<|endoftext|>' and 'A' both have id " + id), std::string::npos) << e;
  // GPT-2's vocab.json the same.
  e = load_error("bpe", write(d + "/vocab.json", vocab.dump()), write(d + "/merges.txt", "#version: 0.2\n"));
  EXPECT_NE(e.find("vocab.json: pieces '<|endoftext|>' and 'A' both have id " + id), std::string::npos) << e;
  // An added token that repeats its vocabulary entry is no duplicate; one at another piece's id is.
  nlohmann::json ok = tokenizer_json(byte_vocab());
  ok["added_tokens"] = {{{"id", 256}, {"content", "<|endoftext|>"}, {"special", true}}};
  EXPECT_EQ(load_error("bpe", write(d + "/added.json", ok.dump())), "");
  ok["added_tokens"] = {{{"id", 65}, {"content", "<|pad|>"}, {"special", true}}};
  e = load_error("bpe", write(d + "/added2.json", ok.dump()));
  EXPECT_NE(e.find("added2.json: pieces"), std::string::npos) << e;
  EXPECT_NE(e.find("'<|pad|>' both have id 65"), std::string::npos) << e;
}

// nlohmann's own type errors ("[json.exception.type_error.302] type must be
// string") name neither the file nor the key; each becomes a message that does.
TEST(TokenizerFiles, TypeErrorsNameTheFileAndKey) {
  const std::string d = fresh("types");
  struct Case {
    std::string name, expect;
    std::function<void(nlohmann::json&)> spoil;
  };
  const std::vector<Case> cases = {
      {"id-string", "piece 'a' has id \"97\"", [](nlohmann::json& j) { j["model"]["vocab"]["a"] = "97"; }},
      {"merges-numbers", "model.merges[0] is an array of 2 values, not two pieces",
       [](nlohmann::json& j) { j["model"]["merges"] = {{1, 2}}; }},
      {"merges-number", "model.merges[0] is number, not two pieces",
       [](nlohmann::json& j) { j["model"]["merges"] = {7}; }},
      {"merges-object", "model.merges is object, not an array",
       [](nlohmann::json& j) { j["model"]["merges"] = {{"a", "b"}}; }},
      {"added-no-content", "added_tokens[0].content is missing",
       [](nlohmann::json& j) { j["added_tokens"] = {{{"id", 256}}}; }},
      {"added-id-string", "added_tokens[0].id: piece '<|endoftext|>' has id \"x\"",
       [](nlohmann::json& j) { j["added_tokens"] = {{{"id", "x"}, {"content", "<|endoftext|>"}}}; }},
      {"added-object", "added_tokens is object, not an array",
       [](nlohmann::json& j) { j["added_tokens"] = {{"content", 1}}; }},
      {"added-number", "added_tokens[0] is number, not an object",
       [](nlohmann::json& j) { j["added_tokens"] = {5}; }},
      {"type-number", "model.type is number, not a string", [](nlohmann::json& j) { j["model"]["type"] = 5; }},
      {"ignore-merges", "model.ignore_merges is string, not true or false",
       [](nlohmann::json& j) { j["model"]["ignore_merges"] = "yes"; }},
      {"pre-type", "pre_tokenizer.type is number, not a string",
       [](nlohmann::json& j) { j["pre_tokenizer"]["type"] = 3; }},
      {"pre-array", "pre_tokenizer is array, not an object",
       [](nlohmann::json& j) { j["pre_tokenizer"] = {1, 2}; }},
      {"prefix-space", "pre_tokenizer.add_prefix_space is number, not true or false",
       [](nlohmann::json& j) { j["pre_tokenizer"]["add_prefix_space"] = 1; }},
      {"seq-items", "pre_tokenizer.pretokenizers[0] is number, not an object",
       [](nlohmann::json& j) { j["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", {1, 2}}}; }},
      {"normalizer-string", "\"normalizer\" ? is not supported",
       [](nlohmann::json& j) { j["normalizer"] = "NFC"; }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    nlohmann::json j = tokenizer_json(byte_vocab());
    c.spoil(j);
    const std::string path = write(d + "/" + c.name + ".json", j.dump());
    const std::string e = load_error("bpe", path);
    EXPECT_NE(e.find("tokenizer " + path + ": "), std::string::npos) << e;
    EXPECT_NE(e.find(c.expect), std::string::npos) << e;
    EXPECT_EQ(e.find("json.exception"), std::string::npos) << e;
  }
}

// Duplicate keys and deep nesting are refused by the shared parser, naming the file.
TEST(TokenizerFiles, DuplicateKeysAndDeepNestingAreRefused) {
  const std::string d = fresh("parse");
  std::string text = tokenizer_json(byte_vocab()).dump();
  text.insert(text.find("\"model\":") + 9, "\"type\":\"BPE\",");  // model.type twice
  std::string e = load_error("bpe", write(d + "/twice.json", text));
  EXPECT_NE(e.find("twice.json"), std::string::npos) << e;
  EXPECT_NE(e.find("the key \"type\" is given twice"), std::string::npos) << e;
  e = load_error("bpe", write(d + "/deep.json", std::string(100000, '[') + std::string(100000, ']')));
  EXPECT_NE(e.find("deep.json"), std::string::npos) << e;
  EXPECT_NE(e.find("nested deeper than"), std::string::npos) << e;
}

// A named pipe as any tokenizer file is refused at once: the loaders (and
// SentencePiece's own reader) would block on it forever.
TEST(TokenizerFiles, ANamedPipeIsRefusedWithoutHanging) {
  const std::string d = fresh("fifo");
  const std::string fifo = d + "/tokenizer.json";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string vocab = write(d + "/vocab.json", byte_vocab().dump());
  struct Case {
    std::string name;
    std::function<void()> load;
  };
  const std::vector<Case> cases = {
      {"bpe json", [&] { smp::sdk::open_tokenizer("bpe", fifo, "", "model.tokenizer"); }},
      {"bpe merges", [&] { smp::sdk::open_tokenizer("bpe", vocab, fifo, "model.tokenizer"); }},
      {"sentencepiece", [&] { smp::sdk::open_tokenizer("sentencepiece", fifo, "", "model.tokenizer"); }},
      {"read_tokenizer_files", [&] { smp::sdk::read_tokenizer_files("bpe", fifo, ""); }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string e = in_child(c.load, 10);
    EXPECT_NE(e.find(fifo + " is a named pipe, not a regular file"), std::string::npos) << e;
  }
}

// What the exporter copies: the bytes that loaded as a tokenizer of the kind,
// and nothing that is not one.
TEST(TokenizerFiles, ReadTokenizerFilesGivesTheValidatedBytesOnly) {
  const std::string d = fresh("export");
  const std::string text = tokenizer_json(byte_vocab()).dump();
  const std::string json = write(d + "/tokenizer.json", text);
  smp::sdk::TokenizerFiles f = smp::sdk::read_tokenizer_files("bpe", json, "");
  EXPECT_EQ(f.model, text);
  EXPECT_EQ(f.merges, "");
  const std::string vocab = write(d + "/vocab.json", byte_vocab().dump());
  const std::string merges = write(d + "/merges.txt", "#version: 0.2\n");
  f = smp::sdk::read_tokenizer_files("bpe", vocab, merges);
  EXPECT_EQ(f.model, slurp(vocab));
  EXPECT_EQ(f.merges, "#version: 0.2\n");
  auto error = [](const std::string& kind, const std::string& model, const std::string& merges) {
    try {
      smp::sdk::read_tokenizer_files(kind, model, merges);
    } catch (const smp::sdk::Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  // A file that is no tokenizer (a secret, say) is refused naming it.
  const std::string secret = write(d + "/secret", "root:x:0:0:root:/root:/bin/bash\n");
  EXPECT_NE(error("bpe", secret, "").find(secret + ": not JSON"), std::string::npos) << error("bpe", secret, "");
  // ... and its text is not shown in the message (a manifest may name it).
  EXPECT_NE(error("bpe", vocab, secret).find(secret + ":1: not two pieces"), std::string::npos)
      << error("bpe", vocab, secret);
  EXPECT_EQ(error("bpe", vocab, secret).find("root:x"), std::string::npos) << error("bpe", vocab, secret);
  EXPECT_NE(error("sentencepiece", secret, "").find("not a SentencePiece model"), std::string::npos)
      << error("sentencepiece", secret, "");
  EXPECT_NE(error("bpe", d, "").find(d + " is a folder, not a regular file"), std::string::npos);
  EXPECT_NE(error("bytes", "", "").find("no files"), std::string::npos);
  EXPECT_NE(error("wordpiece", json, "").find("'wordpiece' is not known"), std::string::npos);
  // Over the bound: refused from its size, before a byte is read (a sparse file).
  const std::string big = d + "/big.json";
  {
    const int fd = ::open(big.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::ftruncate(fd, smp::input::kMaxTokenizerBytes + 1), 0);
    ::close(fd);
  }
  EXPECT_NE(error("bpe", big, "").find("more than the"), std::string::npos) << error("bpe", big, "");
}

// ------------------------------------------------------------- full disk

nlohmann::json big_summary() {
  nlohmann::json s = {{"final_loss", 1.5}, {"mfu", 0.1}, {"layout", {{"pp", 1}, {"dp", 1}, {"tp", 1}}}};
  s["losses"] = nlohmann::json::array();
  for (int i = 0; i < 2000; ++i) s["losses"].push_back(5.0 - i * 1e-3);
  return s;
}

bool no_temporary_left(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (!d) return false;
  bool clean = true;
  while (const dirent* e = ::readdir(d))
    if (std::string(e->d_name).find("tmp") != std::string::npos) clean = false;
  ::closedir(d);
  return clean;
}

// A full disk (here: writes past 4 KiB fail with EFBIG) while summary.json is
// written: the message names summary.json, and what was there stays whole —
// no summary.json at all on a first write, the previous one on a rewrite —
// and no temporary file is left.
TEST(FullDisk, SummaryJsonIsNeverHalfWritten) {
  const std::string d = fresh("full");
  const nlohmann::json big = big_summary();
  ASSERT_GT(big.dump(2).size(), 8192u);
  std::string e = in_child([&] { smp::write_summary_file(d, big); }, 20, 4096);
  EXPECT_NE(e.find(d + "/summary.json"), std::string::npos) << e;
  EXPECT_NE(e.find("File too large"), std::string::npos) << e;
  EXPECT_FALSE(exists(d + "/summary.json")) << "a half-written summary.json was left: " << slurp(d + "/summary.json").size()
                                            << " bytes";
  EXPECT_TRUE(no_temporary_left(d));
  // A rewrite that fails keeps the previous summary whole.
  const nlohmann::json small = {{"final_loss", 2.0}};
  smp::write_summary_file(d, small);
  EXPECT_EQ(nlohmann::json::parse(slurp(d + "/summary.json")), small);
  e = in_child([&] { smp::write_summary_file(d, big); }, 20, 4096);
  EXPECT_NE(e.find(d + "/summary.json"), std::string::npos) << e;
  EXPECT_EQ(nlohmann::json::parse(slurp(d + "/summary.json")), small);
  EXPECT_TRUE(no_temporary_left(d));
  // With room, the new one replaces it and the old one is kept as summary.json.prev.
  smp::write_summary_file(d, big);
  EXPECT_EQ(nlohmann::json::parse(slurp(d + "/summary.json")), big);
  EXPECT_EQ(nlohmann::json::parse(slurp(d + "/summary.json.prev")), small);
}

TEST(FullDisk, ReportHtmlIsNeverHalfWritten) {
  const std::string d = fresh("full-report");
  const nlohmann::json big = big_summary();
  const std::string e = in_child([&] { smp::write_report(d, big); }, 20, 1024);
  EXPECT_NE(e.find(d + "/report.html"), std::string::npos) << e;
  EXPECT_FALSE(exists(d + "/report.html"));
  EXPECT_TRUE(no_temporary_left(d));
  EXPECT_EQ(smp::write_report(d, big), d + "/report.html");
  EXPECT_NE(slurp(d + "/report.html").find("</html>"), std::string::npos);
}

}  // namespace
