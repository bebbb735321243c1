// Hostile Hugging Face folders against `smp-checkpoint import --format hf`:
// every one refused naming the file and the key or tensor, with no crash, no
// hang and nothing written; the legitimate layouts (one file, shards with an
// index, a hub cache snapshot whose files link into ../../blobs) imported.
// The folders are made here (a Llama of 2 layers, hidden 8), so no run is needed.
#include "job_runner.h"

#include "checkpoint/safetensors.h"

#include <gtest/gtest.h>

#include <boost/filesystem.hpp>
#include <nlohmann/json.hpp>

#include <sys/stat.h>
#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <vector>

namespace smp::testing {
namespace {

namespace fs = boost::filesystem;

struct Command {
  int exit_code = -1;  // 128 + signal when killed
  std::string output;
};

// `cmd` under a 60 s timeout (a hang fails as exit 124 rather than blocking the suite).
Command run_command(const std::string& cmd) {
  Command r;
  FILE* pipe = popen(("timeout -s KILL 60 " + cmd + " 2>&1").c_str(), "r");
  char buf[4096];
  while (pipe && fgets(buf, sizeof buf, pipe)) r.output += buf;
  const int status = pipe ? pclose(pipe) : -1;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.output = "$ " + cmd + "\n" + r.output;
  return r;
}

std::string tool() { return std::string(SMP_BIN_DIR) + "/smp-checkpoint"; }

std::string fresh_dir(const std::string& name) {
  const fs::path p = fs::temp_directory_path() / fs::unique_path("smp-hfin-" + name + "-%%%%-%%%%");
  fs::create_directories(p);
  return p.string();
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
}

// A Llama: 2 layers, hidden 8, 2 heads of 4, 1 kv head, ffn 16, vocab 16.
nlohmann::json llama_config() {
  return {{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"}, {"hidden_size", 8},
          {"intermediate_size", 16}, {"num_hidden_layers", 2}, {"num_attention_heads", 2},
          {"num_key_value_heads", 1}, {"vocab_size", 16}, {"max_position_embeddings", 32},
          {"rms_norm_eps", 1e-6}, {"rope_theta", 10000.0}, {"tie_word_embeddings", false}};
}

std::map<std::string, std::vector<int64_t>> llama_shapes() {
  std::map<std::string, std::vector<int64_t>> s = {
      {"model.embed_tokens.weight", {16, 8}}, {"model.norm.weight", {8}}, {"lm_head.weight", {16, 8}}};
  for (int l = 0; l < 2; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    s[p + "input_layernorm.weight"] = {8};
    s[p + "post_attention_layernorm.weight"] = {8};
    s[p + "self_attn.q_proj.weight"] = {8, 8};
    s[p + "self_attn.k_proj.weight"] = {4, 8};
    s[p + "self_attn.v_proj.weight"] = {4, 8};
    s[p + "self_attn.o_proj.weight"] = {8, 8};
    s[p + "mlp.gate_proj.weight"] = {16, 8};
    s[p + "mlp.up_proj.weight"] = {16, 8};
    s[p + "mlp.down_proj.weight"] = {8, 16};
  }
  return s;
}

std::vector<std::pair<std::string, at::Tensor>> tensors_of(const std::map<std::string, std::vector<int64_t>>& shapes) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  int seed = 0;
  for (const auto& [name, shape] : shapes) out.emplace_back(name, at::full(shape, 0.01 * ++seed));
  return out;
}

// A folder: config.json and one model.safetensors of `shapes`.
std::string llama_folder(const std::string& name, const std::map<std::string, std::vector<int64_t>>& shapes = llama_shapes(),
                         const nlohmann::json& config = llama_config()) {
  const std::string dir = fresh_dir(name);
  write_text(dir + "/config.json", config.dump());
  smp::write_safetensors(dir + "/model.safetensors", tensors_of(shapes), {{"format", "pt"}});
  return dir;
}

// A raw safetensors file from header text and `data` bytes (duplicates and
// overlaps, which no writer would make).
void write_raw(const std::string& path, const std::string& header, size_t data, uint64_t claimed = 0) {
  std::string bytes(8, '\0');
  const uint64_t n = claimed ? claimed : header.size();
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>(n >> (8 * i));
  bytes += header;
  bytes.append(data, '\0');
  write_text(path, bytes);
}

Command import(const std::string& dir, const std::string& adapter = "gpt") {
  return run_command(tool() + " import " + dir + " " + dir + "-imported --adapter " + adapter + " --format hf");
}

// Refused: a clean exit 1 (no signal, no hang), the output naming each of
// `said`, and nothing written.
void expect_refused(const std::string& dir, const std::vector<std::string>& said, const std::string& adapter = "gpt") {
  const Command c = import(dir, adapter);
  EXPECT_EQ(c.exit_code, 1) << c.output;
  for (const auto& s : said) EXPECT_NE(c.output.find(s), std::string::npos) << "missing '" << s << "' in\n" << c.output;
  EXPECT_FALSE(fs::exists(dir + "-imported")) << c.output;
}

TEST(HfImport, TheLegitimateLayoutsImport) {
  const std::string one = llama_folder("one");
  Command c = import(one);
  ASSERT_EQ(c.exit_code, 0) << c.output;
  EXPECT_TRUE(fs::exists(one + "-imported/manifest.json"));
  // A hub cache snapshot: models--o--m/snapshots/<rev>/* -> ../../blobs/<hash>,
  // one file and sharded with an index.
  for (const bool sharded : {false, true}) {
    SCOPED_TRACE(sharded ? "sharded" : "one file");
    const std::string root = fresh_dir("hub") + "/models--o--m";
    const std::string snap = root + "/snapshots/0123abcd", blobs = root + "/blobs";
    fs::create_directories(snap);
    fs::create_directories(blobs);
    write_text(blobs + "/c0nf", llama_config().dump());
    fs::create_symlink("../../blobs/c0nf", snap + "/config.json");
    auto all = tensors_of(llama_shapes());
    if (!sharded) {
      smp::write_safetensors(blobs + "/w0", all, {});
      fs::create_symlink("../../blobs/w0", snap + "/model.safetensors");
    } else {
      nlohmann::json map = nlohmann::json::object();
      const size_t half = all.size() / 2;
      const std::vector<std::pair<std::string, at::Tensor>> a(all.begin(), all.begin() + half), b(all.begin() + half, all.end());
      smp::write_safetensors(blobs + "/w1", a, {});
      smp::write_safetensors(blobs + "/w2", b, {});
      fs::create_symlink("../../blobs/w1", snap + "/model-00001-of-00002.safetensors");
      fs::create_symlink("../../blobs/w2", snap + "/model-00002-of-00002.safetensors");
      for (const auto& t : a) map[t.first] = "model-00001-of-00002.safetensors";
      for (const auto& t : b) map[t.first] = "model-00002-of-00002.safetensors";
      write_text(blobs + "/idx", nlohmann::json{{"metadata", {{"total_size", 0}}}, {"weight_map", map}}.dump());
      fs::create_symlink("../../blobs/idx", snap + "/model.safetensors.index.json");
    }
    c = import(snap);
    EXPECT_EQ(c.exit_code, 0) << c.output;
  }
}

// Class "accepted silently": every tensor's shape and dtype against config.json.
TEST(HfImport, EachTensorIsCheckedAgainstTheShapeConfigImplies) {
  struct Case {
    std::string tensor;
    std::vector<int64_t> shape;
  };
  const std::vector<Case> cases = {
      {"model.layers.1.self_attn.q_proj.weight", {8, 4}},  // the wrong shape
      {"model.embed_tokens.weight", {2, 8, 8}},           // 3-D, the same byte count
      {"model.norm.weight", {1, 8}},                      // a norm stored as a matrix
      {"model.layers.0.self_attn.k_proj.weight", {}},     // 0-d ("Dimension specified as 0" before)
  };
  for (const auto& k : cases) {
    SCOPED_TRACE(k.tensor);
    auto shapes = llama_shapes();
    shapes[k.tensor] = k.shape;
    const std::string dir = llama_folder("shape");
    smp::write_safetensors(dir + "/model.safetensors", tensors_of(shapes), {});
    expect_refused(dir, {dir + "/model.safetensors", "'" + k.tensor + "'", "config.json implies"});
  }
  // A tensor the model does not have; a layer number past the config's or
  // too long for any integer ("stoll" before); integer weights.
  for (const std::string extra : {"model.layers.2.input_layernorm.weight",
                                  "model.layers.99999999999999999999.input_layernorm.weight",
                                  "model.layers.01.input_layernorm.weight", "model.extra.weight"}) {
    SCOPED_TRACE(extra);
    auto shapes = llama_shapes();
    shapes[extra] = {8};
    const std::string dir = llama_folder("extra", shapes);
    expect_refused(dir, {"'" + extra + "'", "is not one of the LlamaForCausalLM"});
  }
  {
    const std::string dir = llama_folder("dtype");
    auto all = tensors_of(llama_shapes());
    for (auto& [name, t] : all)
      if (name == "model.norm.weight") t = t.to(at::kLong);
    smp::write_safetensors(dir + "/model.safetensors", all, {});
    expect_refused(dir, {"'model.norm.weight' is I64", "floating point"});
  }
  {  // a missing tensor: named, and the list stays short
    auto shapes = llama_shapes();
    shapes.erase("model.layers.1.mlp.up_proj.weight");
    expect_refused(llama_folder("missing", shapes), {"lack 1 of the 21", "model.layers.1.mlp.up_proj.weight"});
  }
}

// Class "unbounded allocation": counts past what smp reads refused at the key,
// before any list of tensors is built.
TEST(HfImport, CountsPastTheBoundsAreRefusedAtTheirKey) {
  for (const auto& [key, value] : std::vector<std::pair<std::string, int64_t>>{
           {"num_hidden_layers", int64_t{1} << 62}, {"vocab_size", int64_t{1} << 40}, {"hidden_size", int64_t{1} << 33}}) {
    SCOPED_TRACE(key);
    nlohmann::json config = llama_config();
    config[key] = value;
    const std::string dir = llama_folder("count", llama_shapes(), config);
    expect_refused(dir, {dir + "/config.json", "\"" + key + "\"", "more than smp reads"});
  }
}

// Class "accepted silently": safetensors headers with a tensor twice or two
// tensors sharing bytes; "unbounded allocation": a 5 GB header length.
TEST(HfImport, HeadersWithDuplicatesOverlapsOrHugeLengthsAreRefused) {
  const std::string t = R"({"dtype":"F32","shape":[8],"data_offsets":[0,32]})";
  {
    const std::string dir = llama_folder("dup");
    write_raw(dir + "/model.safetensors", "{\"model.norm.weight\":" + t + ",\"model.norm.weight\":" + t + "}", 32);
    expect_refused(dir, {dir + "/model.safetensors", "\"model.norm.weight\" is given twice"});
  }
  {
    const std::string dir = llama_folder("overlap");
    write_raw(dir + "/model.safetensors",
              "{\"model.norm.weight\":" + t + ",\"model.layers.0.input_layernorm.weight\":" +
                  R"({"dtype":"F32","shape":[8],"data_offsets":[16,48]}})",
              48);
    expect_refused(dir, {dir + "/model.safetensors", "overlap"});
  }
  {
    const std::string dir = llama_folder("huge");
    write_raw(dir + "/model.safetensors", "{}", 0, 5'000'000'000ULL);
    expect_refused(dir, {dir + "/model.safetensors", "more than the 100000000"});
  }
}

// Class "accepted silently": the index's map against the files; one link
// policy for a single file and for shards.
TEST(HfImport, AnIndexThatDisagreesWithItsFilesOrLinksOutsideIsRefused) {
  auto all = tensors_of(llama_shapes());
  auto sharded = [&](const std::string& name, const std::string& moved_to) {
    const std::string dir = fresh_dir(name);
    write_text(dir + "/config.json", llama_config().dump());
    const size_t half = all.size() / 2;
    smp::write_safetensors(dir + "/a.safetensors", {all.begin(), all.begin() + half}, {});
    smp::write_safetensors(dir + "/b.safetensors", {all.begin() + half, all.end()}, {});
    nlohmann::json map = nlohmann::json::object();
    for (size_t k = 0; k < all.size(); ++k) map[all[k].first] = k < half ? "a.safetensors" : "b.safetensors";
    if (!moved_to.empty()) map[all[0].first] = moved_to;
    write_text(dir + "/model.safetensors.index.json", nlohmann::json{{"weight_map", map}}.dump());
    return dir;
  };
  std::string dir = sharded("map", "b.safetensors");
  expect_refused(dir, {dir + "/a.safetensors", "'" + all[0].first + "'", "maps to 'b.safetensors'"});
  // A single model.safetensors linking outside the folder (the same through an index was refused already).
  dir = llama_folder("link");
  const std::string elsewhere = fresh_dir("elsewhere") + "/w.safetensors";
  fs::rename(dir + "/model.safetensors", elsewhere);
  fs::create_symlink(elsewhere, dir + "/model.safetensors");
  expect_refused(dir, {"'model.safetensors', a link to " + elsewhere + " outside " + dir});
  // blobs/ of another cache repo is not this snapshot's.
  const std::string root = fresh_dir("hub2");
  fs::create_directories(root + "/models--a/snapshots/r");
  fs::create_directories(root + "/models--b/blobs");
  write_text(root + "/models--a/snapshots/r/config.json", llama_config().dump());
  smp::write_safetensors(root + "/models--b/blobs/w", all, {});
  fs::create_symlink("../../../models--b/blobs/w", root + "/models--a/snapshots/r/model.safetensors");
  expect_refused(root + "/models--a/snapshots/r", {"a link to ../../../models--b/blobs/w outside"});
}

// Import writes a new folder: one holding files (the model folder itself)
// is refused, and nothing in it is touched (the writer used to empty it).
TEST(HfImport, AFolderWithFilesIsNotImportedInto) {
  const std::string dir = llama_folder("self");
  const Command c = run_command(tool() + " import " + dir + " " + dir + " --adapter gpt --format hf");
  EXPECT_EQ(c.exit_code, 1) << c.output;
  EXPECT_NE(c.output.find(dir + " exists and is not an empty folder"), std::string::npos) << c.output;
  EXPECT_TRUE(fs::exists(dir + "/config.json") && fs::exists(dir + "/model.safetensors")) << c.output;
}

// Classes "stack overflow on nesting" and "hangs": deep JSON and named pipes.
TEST(HfImport, DeepJsonAndNamedPipesAreRefusedWithoutACrashOrAHang) {
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  std::string dir = llama_folder("deep-config");
  write_text(dir + "/config.json", deep);
  expect_refused(dir, {dir + "/config.json", "nested deeper than"});
  dir = llama_folder("deep-index");
  write_text(dir + "/model.safetensors.index.json", "{\"weight_map\":" + deep + "}");
  expect_refused(dir, {dir + "/model.safetensors.index.json", "nested deeper than"});
  // A key import would copy into the manifest nested past what the manifest
  // reader takes: refused at config.json, and one within the bound imports
  // into a checkpoint smp-checkpoint reads back.
  for (const int depth : {40, 20}) {
    SCOPED_TRACE(depth);
    nlohmann::json config = llama_config(), nest = 1;
    for (int k = 0; k < depth; ++k) nest = nlohmann::json{{"n", nest}};
    config["quantization_config"] = nest;
    dir = llama_folder("nested-key", llama_shapes(), config);
    if (depth > 32) {
      expect_refused(dir, {dir + "/config.json", "nested deeper than 32"});
    } else {
      ASSERT_EQ(import(dir).exit_code, 0);
      const Command c = run_command(tool() + " inspect " + dir + "-imported");
      EXPECT_EQ(c.exit_code, 0) << c.output;
    }
  }
  for (const std::string file : {"config.json", "model.safetensors"}) {
    SCOPED_TRACE(file);
    dir = llama_folder("fifo");
    fs::remove(dir + "/" + file);
    ASSERT_EQ(::mkfifo((dir + "/" + file).c_str(), 0600), 0);
    expect_refused(dir, {dir + "/" + file, "a named pipe, not a regular file"});
  }
}

// Mixtral's experts: a mismatched expert shape is named (LibTorch's `stack`
// failed without a name before).
TEST(HfImport, AMixtralExpertOfTheWrongShapeIsNamed) {
  nlohmann::json config = llama_config();
  config["model_type"] = "mixtral";
  config["architectures"] = {"MixtralForCausalLM"};
  config["num_local_experts"] = 2;
  config["num_experts_per_tok"] = 1;
  config["rms_norm_eps"] = 1e-5;
  auto shapes = llama_shapes();
  for (int l = 0; l < 2; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    for (const char* k : {"mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"}) shapes.erase(p + k);
    shapes[p + "block_sparse_moe.gate.weight"] = {2, 8};
    for (int x = 0; x < 2; ++x) {
      const std::string e = p + "block_sparse_moe.experts." + std::to_string(x) + ".";
      shapes[e + "w1.weight"] = {16, 8};
      shapes[e + "w3.weight"] = {16, 8};
      shapes[e + "w2.weight"] = {8, 16};
    }
  }
  const std::string good = llama_folder("mixtral", shapes, config);
  const Command c = import(good, "moe");
  ASSERT_EQ(c.exit_code, 0) << c.output;
  shapes["model.layers.1.block_sparse_moe.experts.1.w3.weight"] = {12, 8};
  const std::string bad = llama_folder("mixtral-bad", shapes, config);
  expect_refused(bad, {"'model.layers.1.block_sparse_moe.experts.1.w3.weight' has the shape [12, 8]", "[16, 8]"}, "moe");
}

// Class "file disclosure": export copied whatever file the manifest's
// model.tokenizer_model named. Now each file is loaded as a tokenizer of its
// kind first: a file that is not one is refused and nothing of it is written.
TEST(HfExport, ATokenizerFileThatIsNoTokenizerIsRefusedNotCopied) {
  const JobResult saved = run_job(1, plugin_path("gpt"), source_path("tests/integration/data/gpt-equiv.toml"),
                                  {"model.arch=llama", "model.kv_heads=2", "model.ffn=48", "train.steps=1",
                                   "run.checkpoint_every=1"});
  ASSERT_EQ(saved.exit_code, 0) << saved.output;
  const std::string ckpt = saved.run_dir + "/checkpoints/step-00000001", out = fresh_dir("export");
  std::ifstream in(ckpt + "/manifest.json");
  ASSERT_TRUE(in) << saved.output;
  const nlohmann::json manifest = nlohmann::json::parse(in);
  // A secret that is JSON (as vocab.json would be) but no vocabulary, and one that is not JSON at all.
  const std::string secret_json = out + "/secret.json", secret = out + "/shadow";
  write_text(secret_json, R"({"password": "hunter2"})");
  write_text(secret, "root:$6$hunter2:19000:0:99999:7:::\n");
  struct Case {
    nlohmann::json model;
    std::string file, written;
  };
  const std::vector<Case> cases = {{{{"tokenizer", "bpe"}, {"tokenizer_model", secret_json}}, secret_json, "tokenizer.json"},
                                   {{{"tokenizer", "bpe"}, {"tokenizer_model", secret}}, secret, "vocab.json"},
                                   {{{"tokenizer", "sentencepiece"}, {"tokenizer_model", secret}}, secret, "tokenizer.model"}};
  for (const auto& k : cases) {
    SCOPED_TRACE(k.model.dump());
    nlohmann::json m = manifest;
    for (const auto& [key, value] : k.model.items()) m["model"][key] = value;
    const std::string copy = out + "/ckpt-" + k.written;
    fs::create_directories(copy);
    for (const auto& e : fs::directory_iterator(ckpt)) fs::copy_file(e.path(), copy + "/" + e.path().filename().string());
    write_text(copy + "/manifest.json", m.dump());
    const Command c = run_command(tool() + " export " + copy + " " + out + "/hf-" + k.written + " --format hf");
    EXPECT_EQ(c.exit_code, 1) << c.output;
    EXPECT_NE(c.output.find("tokenizer_model = '" + k.file + "'"), std::string::npos) << c.output;
    // Checked before anything is written: no folder with weights and no tokenizer is left.
    EXPECT_FALSE(fs::exists(out + "/hf-" + k.written)) << c.output;
    EXPECT_EQ(c.output.find("hunter2"), std::string::npos) << c.output;
  }
  // A NUL in the name: the kernel would open the name cut short (a real
  // tokenizer) while the message and the output name used the whole.
  {
    nlohmann::json m = manifest;
    m["model"]["tokenizer"] = "bpe";
    m["model"]["tokenizer_model"] = out + "/vocab.json" + std::string(1, '\0') + "../../secret";
    const std::string copy = out + "/ckpt-nul";
    fs::create_directories(copy);
    for (const auto& e : fs::directory_iterator(ckpt)) fs::copy_file(e.path(), copy + "/" + e.path().filename().string());
    write_text(copy + "/manifest.json", m.dump());
    const Command c = run_command(tool() + " export " + copy + " " + out + "/hf-nul --format hf");
    EXPECT_EQ(c.exit_code, 1) << c.output;
    EXPECT_NE(c.output.find("NUL byte"), std::string::npos) << c.output;
  }
  // `latest` a link to a file outside the folder: refused by the link
  // policy, its first line never shown.
  {
    const std::string folder = out + "/runs";
    fs::create_directories(folder);
    fs::create_symlink(secret, folder + "/latest");
    const Command c = run_command(tool() + " inspect " + folder);
    EXPECT_EQ(c.exit_code, 1) << c.output;
    EXPECT_NE(c.output.find("'latest', a link to " + secret + " outside"), std::string::npos) << c.output;
    EXPECT_EQ(c.output.find("hunter2"), std::string::npos) << c.output;
  }
  // A named pipe as the tokenizer: refused, not waited on.
  const std::string fifo = out + "/pipe.json";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  nlohmann::json m = manifest;
  m["model"]["tokenizer"] = "bpe";
  m["model"]["tokenizer_model"] = fifo;
  write_text(ckpt + "/manifest.json", m.dump());
  const Command c = run_command(tool() + " export " + ckpt + " " + out + "/hf-fifo --format hf");
  EXPECT_EQ(c.exit_code, 1) << c.output;
  EXPECT_NE(c.output.find("a named pipe, not a regular file"), std::string::npos) << c.output;
}

}  // namespace
}  // namespace smp::testing
