// smp-checkpoint: look into, check and convert smp checkpoints (docs/checkpoints.md).
//
//   smp-checkpoint inspect PATH [--tensors]       step, layout, files, bytes per rank
//   smp-checkpoint verify PATH                    every file's size and CRC-32C
//   smp-checkpoint export PATH OUT.safetensors [--format smp|gpt2]
//   smp-checkpoint export PATH OUT_FOLDER --format hf [--dtype fp32|bf16] [--max-shard-size 5GB]
//   smp-checkpoint import IN.safetensors FOLDER --adapter NAME [--format smp|gpt2]
//   smp-checkpoint import IN_FOLDER FOLDER --adapter gpt --format hf
//
// PATH is a checkpoint folder or a folder of them (its `latest`). export writes
// the parameters as whole global tensors in fp32 (the masters where a 16-bit
// run kept them); gpt2 uses transformers' GPT2LMHeadModel names and writes its
// config.json beside OUT; hf writes a Llama (gpt with arch "llama") in
// transformers' LlamaForCausalLM layout: one model.safetensors, or files of at
// most --max-shard-size bytes with model.safetensors.index.json, and config.json.
// import makes a checkpoint folder of such files that run.init_from starts a
// run from.
#include "checkpoint_gpt2.h"
#include "checkpoint_llama.h"
#include "hf_folder.h"

#include "base/atomic_file.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/manifest_check.h"
#include "checkpoint/safetensors.h"

#include <smp/error.h>
#include <smp/data/hf_llama.hpp>
#include <smp/sdk/input_file.hpp>
#include <smp/data/tokenizers.hpp>

#include <CLI/CLI.hpp>
#include <boost/filesystem.hpp>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <set>
#include <iostream>
#include <memory>
#include <random>
#include <sys/stat.h>
#include <unistd.h>

namespace {

namespace fs = boost::filesystem;

std::string folder_of(const std::string& path) {
  const std::string f = smp::find_checkpoint(path);
  if (f.empty()) throw smp::Error(path + " is neither a checkpoint nor a folder with a `latest` one");
  return f;
}

std::string dims(const nlohmann::json& shape) {
  std::string s;
  for (const auto& d : shape) s += (s.empty() ? "" : ", ") + std::to_string(d.get<int64_t>());
  return "[" + s + "]";
}

int inspect(const std::string& path, bool tensors) {
  const std::string folder = folder_of(path);
  const nlohmann::json m = smp::read_manifest(folder);
  std::cout << "checkpoint " << folder << "\n"
            << "  step " << m.value("step", 0) << ", adapter " << m["adapter"].value("name", "?") << " (plugin "
            << m["adapter"].value("plugin", "?") << " " << m["adapter"].value("version", "") << "), format version "
            << m["version"].get<int>() << "\n";
  if (m.contains("layout")) {
    const auto& l = m["layout"];
    std::cout << "  saved at pp=" << l.value("pp", 0) << " tp=" << l.value("tp", 0) << " dp=" << l.value("dp", 0)
              << " ep=" << l.value("ep", 0) << " (world " << l.value("world", 0) << "), zero " << l.value("zero", 0)
              << ", " << l.value("precision", "?") << "\n";
  }
  int64_t total = 0;
  std::cout << "  files:\n";
  for (const auto& f : m["files"]) {
    std::printf("    %-26s rank %-4d %12lld bytes\n", f["name"].get<std::string>().c_str(), f["rank"].get<int>(),
                static_cast<long long>(f["bytes"].get<int64_t>()));
    total += f["bytes"].get<int64_t>();
  }
  std::cout << "  " << m["tensors"].size() << " tensors, " << total << " bytes in " << m["files"].size() << " files\n";
  if (tensors)
    for (const auto& [name, t] : m["tensors"].items())
      std::printf("    %-56s %-5s %-16s %zu slice(s)\n", name.c_str(), t["dtype"].get<std::string>().c_str(),
                  dims(t["shape"]).c_str(), t["slices"].size());
  return 0;
}

int verify(const std::string& path) {
  const std::string folder = folder_of(path);
  const nlohmann::json m = smp::read_manifest(folder);
  const auto problems = smp::verify_checkpoint(folder, m);
  for (const auto& p : problems) std::cerr << "smp-checkpoint: " << p << "\n";
  if (!problems.empty()) return 1;
  std::cout << folder << ": the manifest holds (files inside the folder, slices within their shapes, no overlap "
               "or gap); " << m["files"].size() << " files intact (sizes, CRC-32C, each slice's tensor)\n";
  return 0;
}

int export_hf(const std::string& folder, const nlohmann::json& m, const smp::gpt2::Tensors& params,
              const std::string& out, const std::string& dtype, int64_t max_shard, int64_t max_positions);
void write_text(const fs::path& path, const std::string& text);

int export_to(const std::string& path, const std::string& out, const std::string& format, const std::string& dtype,
              int64_t max_shard, int64_t max_positions) {
  const std::string folder = folder_of(path);
  const nlohmann::json m = smp::read_manifest(folder);
  smp::gpt2::Tensors params;
  for (const auto& [name, t] : m["tensors"].items())
    if (name.rfind("model/", 0) == 0)
      params[name.substr(6)] = smp::read_global_tensor(folder, m, name, at::kFloat);
  if (params.empty()) throw smp::Error(folder + " holds no parameters (model/...)");
  if (format == "hf") return export_hf(folder, m, params, out, dtype, max_shard, max_positions);
  if (dtype != "fp32") throw smp::Error("--dtype " + dtype + ": only --format hf writes other than fp32");
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  std::map<std::string, std::string> meta = {{"format", format == "gpt2" ? "pt" : "smp-export"},
                                             {"smp_adapter", m["adapter"].value("name", "")},
                                             {"smp_step", std::to_string(m.value("step", 0))}};
  // The output's folder is made when missing (gpt2/model.safetensors).
  const fs::path parent = fs::absolute(fs::path(out)).parent_path();
  fs::create_directories(parent);
  std::string config_text;
  if (format == "gpt2") {
    const auto g = smp::gpt2::to_gpt2(params);
    for (const auto& [name, t] : g) tensors.emplace_back(name, t);
    config_text = smp::gpt2::config_json(g, m.value("graph", nlohmann::json::array())).dump(2) + "\n";
  } else {
    for (const auto& [name, t] : params) tensors.emplace_back(name, t);
  }
  const auto w = smp::write_safetensors(out, tensors, meta);
  std::cout << "wrote " << out << ": " << tensors.size() << " tensors, " << w.bytes << " bytes (step "
            << m.value("step", 0) << ")\n";
  if (!config_text.empty()) {  // after the weights: nothing claims success before they are written
    const fs::path config = parent / "config.json";
    write_text(config, config_text);
    std::cout << "wrote " << config.string() << "\n";
  }
  return 0;
}

// "5GB", "500MB", "1000" -> bytes (GB = 10^9, as Hugging Face's max_shard_size).
int64_t parse_bytes(const std::string& text) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    throw smp::Error("--max-shard-size '" + text + "': not a size (e.g. 5GB, 500MB)");
  }
  std::string unit = text.substr(used);
  for (auto& ch : unit) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  const std::map<std::string, double> units = {{"", 1}, {"B", 1}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9},
                                               {"KIB", 1024.0}, {"MIB", 1048576.0}, {"GIB", 1073741824.0}};
  if (!units.count(unit) || !(v > 0) || !std::isfinite(v))
    throw smp::Error("--max-shard-size '" + text + "': not a size (e.g. 5GB, 500MB)");
  const double bytes = v * units.at(unit);
  if (!(bytes < 1e18)) throw smp::Error("--max-shard-size '" + text + "': more than 10^18 bytes");
  return static_cast<int64_t>(bytes);
}

// Written whole or not at all (base/atomic_file.h, as the run's summary is):
// a full disk leaves no half-written config.json.
void write_text(const fs::path& path, const std::string& text) {
  smp::write_file_atomically(path.string(), text, "smp-checkpoint export");
}

// The files an export writes into its folder: on a failure part way (a full
// disk), those written are removed again, and the folder when it made it, so
// nothing half-written is left; keep() once all are written.
class Written {
 public:
  explicit Written(const fs::path& dir) : dir_(dir) {
    made_ = !fs::exists(dir_);
    fs::create_directories(dir_);
  }
  ~Written() {
    if (kept_) return;
    boost::system::error_code ec;
    for (const auto& p : files_) fs::remove(p, ec);
    if (made_) fs::remove(dir_, ec);  // only when empty
  }
  void add(const fs::path& p) { files_.push_back(p); }
  void put(const fs::path& p, const std::string& text) {
    add(p);
    write_text(p, text);
  }
  void keep() { kept_ = true; }

 private:
  fs::path dir_;
  std::vector<fs::path> files_;
  bool made_ = false, kept_ = false;
};

// A Llama in Hugging Face's layout: the weights (one file, or files of at most
// max_shard bytes each and their index), then config.json, then the tokenizer
// the run used, when its [model] names one.
int export_hf(const std::string& folder, const nlohmann::json& m, const smp::gpt2::Tensors& params,
              const std::string& out, const std::string& dtype, int64_t max_shard, int64_t max_positions) {
  smp::llama::Shape shape = smp::llama::shape_of_manifest(m);
  if (max_positions > 0) shape.seq_len = max_positions;
  if (shape.seq_len <= 0)
    throw smp::Error(folder + ": its [model] has no seq_len for config.json's max_position_embeddings: give "
                     "--max-position-embeddings");
  // The tokenizer the run used, checked before anything is written: model.tokenizer is its
  // kind; a BPE's files (tokenizer.json, or vocab.json and merges.txt) and a
  // SentencePiece model are copied under Hugging Face's names. Bytes have no file.
  const nlohmann::json& model = m.value("model", nlohmann::json::object());
  auto key = [&](const char* k) {
    return model.is_object() && model.contains(k) && model[k].is_string() ? model[k].get<std::string>() : "";
  };
  const std::string kind = key("tokenizer").empty() ? "bytes" : key("tokenizer");
  // Each file is read once, loaded from those bytes as a tokenizer of its
  // kind, and those very bytes written: a manifest naming any other file
  // (/etc/shadow) is refused rather than copied into a folder one publishes.
  std::string copied;
  smp::sdk::TokenizerFiles files;
  std::string tokenizer_name;
  if (kind != "bytes") {
    const std::string file = key("tokenizer_model"), merges = key("tokenizer_merges");
    try {
      if ((file + merges).find('\0') != std::string::npos) throw smp::Error("a file name with a NUL byte in it");
      files = smp::sdk::read_tokenizer_files(kind, file, merges);
    } catch (const std::exception& e) {
      auto shown = [](std::string t) {  // a NUL would end the message where a terminal reads it
        for (size_t at = t.find('\0'); at != std::string::npos; at = t.find('\0', at + 2)) t.replace(at, 1, "\\0");
        return t;
      };
      throw smp::Error(folder + ": its [model] tokenizer = \"" + kind + "\" with tokenizer_model = '" + shown(file) +
                       "'" + (merges.empty() ? "" : " and tokenizer_merges = '" + shown(merges) + "'") +
                       " is not copied beside the weights: " + e.what());
    }
    // A BPE without merges was loaded as a tokenizer.json, whatever its name.
    tokenizer_name = kind == "sentencepiece" ? "tokenizer.model" : merges.empty() ? "tokenizer.json" : "vocab.json";
  }
  const smp::llama::Tensors hf = smp::llama::to_hf(params, shape);
  const at::ScalarType type = dtype == "bf16" ? at::kBFloat16 : at::kFloat;
  // Hugging Face's order: the embedding, the layers in order, the final norm, the head.
  auto rank = [](const std::string& name) {
    if (name.rfind("model.embed_tokens", 0) == 0) return std::make_pair(int64_t{-1}, name);
    if (name.rfind("model.layers.", 0) == 0) {  // to_hf wrote the number: decimal, below the layer count
      int64_t layer = 0;
      for (size_t k = 13; k < name.size() && name[k] != '.' && layer < (int64_t{1} << 40); ++k)
        layer = layer * 10 + (name[k] - '0');
      return std::make_pair(layer, name);
    }
    return std::make_pair(std::numeric_limits<int64_t>::max(), name);
  };
  std::vector<std::pair<std::string, at::Tensor>> ordered;
  for (const auto& [name, t] : hf) ordered.emplace_back(name, t.to(type).contiguous());
  std::sort(ordered.begin(), ordered.end(), [&](const auto& a, const auto& b) { return rank(a.first) < rank(b.first); });
  std::vector<std::vector<std::pair<std::string, at::Tensor>>> shards(1);
  int64_t in_shard = 0, total = 0;
  for (auto& nt : ordered) {
    const int64_t bytes = nt.second.numel() * static_cast<int64_t>(nt.second.element_size());
    if (max_shard > 0 && in_shard > 0 && in_shard + bytes > max_shard) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(std::move(nt));
    in_shard += bytes;
    total += bytes;
  }
  const fs::path dir(out);
  Written written(dir);
  const std::map<std::string, std::string> meta = {{"format", "pt"}, {"smp_step", std::to_string(m.value("step", 0))}};
  nlohmann::json weight_map = nlohmann::json::object();
  for (size_t k = 0; k < shards.size(); ++k) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", k + 1, shards.size());
    const std::string file = shards.size() == 1 ? "model.safetensors" : name;
    written.add(dir / file);
    smp::write_safetensors((dir / file).string(), shards[k], meta);
    for (const auto& nt : shards[k]) weight_map[nt.first] = file;
  }
  if (shards.size() > 1)
    written.put(dir / "model.safetensors.index.json",
               nlohmann::json{{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}}.dump(2) + "\n");
  written.put(dir / "config.json", smp::llama::config_json(shape, dtype == "bf16" ? "bfloat16" : "float32").dump(2) + "\n");
  if (!tokenizer_name.empty()) {
    written.put(dir / tokenizer_name, files.model);
    copied += ", " + tokenizer_name;
    if (!files.merges.empty()) {
      written.put(dir / "merges.txt", files.merges);
      copied += ", merges.txt";
    }
  }

  written.keep();
  if (kind == "bytes") copied = " (the run's tokenizer is bytes: no file)";
  std::cout << "wrote " << out << ": " << ordered.size() << " tensors (" << dtype << "), " << total << " bytes in "
            << shards.size() << " file(s), config.json" << copied
            << (shape.experts > 0 ? " (MixtralForCausalLM, step " : " (LlamaForCausalLM, step ") << m.value("step", 0)
            << ")\n";
  return 0;
}

// A folder in Hugging Face's layout (hf_folder.h reads and checks it all)
// into a checkpoint folder.
int import_hf(const std::string& in, const std::string& folder, const std::string& adapter) {
  smp::llama::HfFolder hf = smp::llama::read_hf_folder(in);
  const bool mixtral = hf.shape.experts > 0;
  if (adapter != (mixtral ? "moe" : "gpt"))
    throw smp::Error(std::string("--format hf imports ") +
                     (mixtral ? "a Mixtral for the moe adapter" : "a Llama for the gpt adapter") + ", not '" + adapter +
                     "'");
  std::vector<smp::StateEntry> entries;
  for (const auto& [name, t] : hf.params) entries.push_back(smp::whole_tensor_entry("model/" + name, t));
  smp::CheckpointWriter::Options o;
  o.token = std::random_device{}();
  smp::CheckpointWriter writer(o);
  writer.save(folder, entries,
              {{"step", 0}, {"adapter", {{"name", adapter}}}, {"imported_from", in}, {"hf_config", hf.config}}, false,
              0, false);
  std::cout << "wrote " << folder << ": " << entries.size() << " parameters from " << in << " ("
            << (mixtral ? "MixtralForCausalLM, " : "LlamaForCausalLM, ") << hf.shape.layers
            << " layers); start a run of its shape from it with --set run.init_from=\"" << folder << "\"\n";
  return 0;
}

int import_from(const std::string& in, const std::string& folder, const std::string& adapter, std::string format) {
  if (format == "hf") return import_hf(in, folder, adapter);
  const smp::SafetensorsFile f(in);
  smp::gpt2::Tensors read;
  for (const auto& [name, t] : f.tensors()) {
    at::Tensor v = at::empty(t.shape, at::TensorOptions().dtype(t.dtype));
    f.read(name, 0, t.end - t.begin, v.data_ptr());
    read[name] = v;
  }
  if (format.empty())  // GPT-2's names start with "transformer." or "h."
    format = (read.count("transformer.wte.weight") || read.count("wte.weight") && read.count("h.0.ln_1.weight"))
                 ? "gpt2"
                 : "smp";
  const smp::gpt2::Tensors params = format == "gpt2" ? smp::gpt2::from_gpt2(read) : read;
  std::vector<smp::StateEntry> entries;
  for (const auto& [name, t] : params) entries.push_back(smp::whole_tensor_entry("model/" + name, t));
  smp::CheckpointWriter::Options o;
  o.token = std::random_device{}();
  smp::CheckpointWriter writer(o);
  writer.save(folder, entries, {{"step", 0}, {"adapter", {{"name", adapter}}}, {"imported_from", in}}, false, 0, false);
  std::cout << "wrote " << folder << ": " << entries.size() << " parameters from " << in << " (" << format
            << " names); start a run from it with --set run.init_from=\"" << folder << "\"\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"smp-checkpoint: inspect, verify, export and import smp checkpoints"};
  app.require_subcommand(1);
  std::string path, out, in, format, adapter, dtype = "fp32", max_shard_size;
  int64_t max_positions = 0;
  bool tensors = false;
  auto* ins = app.add_subcommand("inspect", "step, layout, files and bytes of a checkpoint");
  ins->add_option("path", path, "checkpoint folder, or a folder with a `latest`")->required();
  ins->add_flag("--tensors", tensors, "list every tensor (dtype, global shape, slices)");
  auto* ver = app.add_subcommand("verify", "check every file's size and CRC-32C against the manifest");
  ver->add_option("path", path, "checkpoint folder, or a folder with a `latest`")->required();
  auto* exp = app.add_subcommand("export", "the parameters as one safetensors file of whole tensors (fp32)");
  exp->add_option("path", path, "checkpoint folder, or a folder with a `latest`")->required();
  exp->add_option("out", out, "the .safetensors file to write (--format hf: the folder)")->required();
  exp->add_option("--format", format,
                  "smp (smp's names), gpt2 (transformers' GPT-2 names, and config.json) or hf (a Llama as "
                  "transformers' LlamaForCausalLM: a folder of weights, config.json and the tokenizer)")
      ->check(CLI::IsMember({"smp", "gpt2", "hf"}));
  exp->add_option("--dtype", dtype, "--format hf: fp32 or bf16")->check(CLI::IsMember({"fp32", "bf16"}));
  exp->add_option("--max-shard-size", max_shard_size, "--format hf: at most this much per file (5GB, 500MB; "
                                                      "default: one file)");
  exp->add_option("--max-position-embeddings", max_positions,
                  "--format hf: config.json's max_position_embeddings (default: the run's model.seq_len)")
      ->check(CLI::Range(int64_t{1}, smp::sdk::HfLimits::positions));
  auto* imp = app.add_subcommand("import", "a checkpoint folder of a safetensors file's parameters, for run.init_from");
  imp->add_option("in", in, "the .safetensors file (smp's or GPT-2's names; --format hf: the model folder)")->required();
  imp->add_option("folder", out, "the checkpoint folder to write")->required();
  imp->add_option("--adapter", adapter, "the adapter the parameters are for, e.g. gpt")->required();
  imp->add_option("--format", format, "smp, gpt2 or hf (a LlamaForCausalLM folder; default: by the tensor names)")
      ->check(CLI::IsMember({"smp", "gpt2", "hf"}));
  CLI11_PARSE(app, argc, argv);
  try {
    if (*ins) return inspect(path, tensors);
    if (*ver) return verify(path);
    if (*exp)
      return export_to(path, out, format.empty() ? "smp" : format, dtype,
                       max_shard_size.empty() ? 0 : parse_bytes(max_shard_size), max_positions);
    if (*imp) {
      // The checkpoint writer replaces what its folder holds: a folder with
      // files in it (the model folder being imported, say) is refused.
      boost::system::error_code ec;
      if (fs::exists(out) && !(fs::is_directory(out, ec) && fs::is_empty(out, ec)))
        throw smp::Error(out + " exists and is not an empty folder: import writes a new checkpoint folder (give "
                         "another name)");
      return import_from(in, out, adapter, format);
    }
  } catch (const std::exception& e) {
    std::cerr << "smp-checkpoint: error: " << e.what() << std::endl;
    return 1;
  }
  return 2;
}
