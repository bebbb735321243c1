// smp-checkpoint: look into, check and convert smp checkpoints (docs/checkpoints.md).
//
//   smp-checkpoint inspect PATH [--tensors]       step, layout, files, bytes per rank
//   smp-checkpoint verify PATH                    every file's size and CRC-32C
//   smp-checkpoint export PATH OUT.safetensors [--format smp|gpt2]
//   smp-checkpoint import IN.safetensors FOLDER --adapter NAME [--format smp|gpt2]
//
// PATH is a checkpoint folder or a folder of them (its `latest`). export writes
// the parameters as whole global tensors in fp32 (the masters where a 16-bit
// run kept them); gpt2 uses transformers' GPT2LMHeadModel names and writes its
// config.json beside OUT. import makes a checkpoint folder of such a file that
// run.init_from starts a run from.
#include "checkpoint_gpt2.h"

#include "checkpoint/checkpoint.h"
#include "checkpoint/safetensors.h"

#include <smp/error.h>

#include <CLI/CLI.hpp>
#include <boost/filesystem.hpp>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <random>

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

int export_to(const std::string& path, const std::string& out, const std::string& format) {
  const std::string folder = folder_of(path);
  const nlohmann::json m = smp::read_manifest(folder);
  smp::gpt2::Tensors params;
  for (const auto& [name, t] : m["tensors"].items())
    if (name.rfind("model/", 0) == 0)
      params[name.substr(6)] = smp::read_global_tensor(folder, m, name, at::kFloat);
  if (params.empty()) throw smp::Error(folder + " holds no parameters (model/...)");
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
    std::ofstream f(config.string());
    f << config_text;
    f.close();
    if (!f) throw smp::Error("cannot write " + config.string());
    std::cout << "wrote " << config.string() << "\n";
  }
  return 0;
}

int import_from(const std::string& in, const std::string& folder, const std::string& adapter, std::string format) {
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
  std::string path, out, in, format, adapter;
  bool tensors = false;
  auto* ins = app.add_subcommand("inspect", "step, layout, files and bytes of a checkpoint");
  ins->add_option("path", path, "checkpoint folder, or a folder with a `latest`")->required();
  ins->add_flag("--tensors", tensors, "list every tensor (dtype, global shape, slices)");
  auto* ver = app.add_subcommand("verify", "check every file's size and CRC-32C against the manifest");
  ver->add_option("path", path, "checkpoint folder, or a folder with a `latest`")->required();
  auto* exp = app.add_subcommand("export", "the parameters as one safetensors file of whole tensors (fp32)");
  exp->add_option("path", path, "checkpoint folder, or a folder with a `latest`")->required();
  exp->add_option("out", out, "the .safetensors file to write")->required();
  exp->add_option("--format", format, "smp (smp's names) or gpt2 (transformers' GPT-2 names, and config.json)")
      ->check(CLI::IsMember({"smp", "gpt2"}));
  auto* imp = app.add_subcommand("import", "a checkpoint folder of a safetensors file's parameters, for run.init_from");
  imp->add_option("in", in, "the .safetensors file (smp's or GPT-2's names)")->required();
  imp->add_option("folder", out, "the checkpoint folder to write")->required();
  imp->add_option("--adapter", adapter, "the adapter the parameters are for, e.g. gpt")->required();
  imp->add_option("--format", format, "smp or gpt2 (default: by the tensor names)")->check(CLI::IsMember({"smp", "gpt2"}));
  CLI11_PARSE(app, argc, argv);
  try {
    if (*ins) return inspect(path, tensors);
    if (*ver) return verify(path);
    if (*exp) return export_to(path, out, format.empty() ? "smp" : format);
    if (*imp) return import_from(in, out, adapter, format);
  } catch (const std::exception& e) {
    std::cerr << "smp-checkpoint: error: " << e.what() << std::endl;
    return 1;
  }
  return 2;
}
