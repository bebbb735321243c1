#include "hf_folder.h"

#include "checkpoint/safetensors.h"

#include <smp/error.h>
#include <smp/data/hf_llama.hpp>
#include <smp/sdk/input_file.hpp>

#include <ATen/ATen.h>

#include <sys/stat.h>

#include <map>
#include <memory>
#include <set>
#include <vector>

namespace smp::llama {

namespace {

// The tensors of a Hugging Face folder's files as their headers describe them,
// each with the file that holds it.
struct HfTensor {
  std::string file;
  smp::SafetensorsTensor t;
};

std::string dims_text(const std::vector<int64_t>& d) {
  std::string s;
  for (int64_t v : d) s += (s.empty() ? "" : ", ") + std::to_string(v);
  return "[" + s + "]";
}

// Every tensor of the files checked against what config.json implies — its
// name, shape and a floating dtype; every required one present; the index's
// map naming each tensor's file and nothing else — before a byte of data is
// read or anything written. Headers refuse overlaps and duplicate names.
void check_hf_tensors(const std::map<std::string, HfTensor>& tensors, const Shape& shape,
                      const std::string& in) {
  const std::string model = shape.experts > 0 ? "MixtralForCausalLM" : "LlamaForCausalLM";
  std::set<std::string> present;
  for (const auto& [name, h] : tensors) {
    const std::string where = h.file + ": tensor '" + name + "'";
    const auto want = hf_shape_of(name, shape);
    if (!want)
      throw smp::Error(where + " is not one of the " + model + " config.json describes (" +
                       std::to_string(shape.layers) + " layers" +
                       (shape.experts > 0 ? ", " + std::to_string(shape.experts) + " experts" : "") + ")");
    if (h.t.shape != *want)
      throw smp::Error(where + " has the shape " + dims_text(h.t.shape) + "; config.json implies " + dims_text(*want));
    if (!at::isFloatingType(h.t.dtype))
      throw smp::Error(where + " is " + smp::safetensors_dtype(h.t.dtype) +
                       ": a model's weights are floating point (F32, F16, BF16, F64)");
    if (hf_required(name, shape)) present.insert(name);
  }
  const int64_t need = hf_required_count(shape);
  if (static_cast<int64_t>(present.size()) != need) {
    std::string missing;
    for (const auto& n : hf_missing(present, shape, 8)) missing += (missing.empty() ? "" : ", ") + n;
    const int64_t lacking = need - static_cast<int64_t>(present.size());
    throw smp::Error(in + ": the files lack " + std::to_string(lacking) + " of the " + std::to_string(need) +
                     " tensors of " + model + " its config.json describes (" + missing + (lacking > 8 ? ", ..." : "") +
                     ")");
  }
}

}  // namespace

HfFolder read_hf_folder(const std::string& in) {
  struct stat st {};
  if (::stat(in.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    throw Error(in + ": not a folder (a Hugging Face model folder holds config.json)");
  const std::string config_path = smp::input::name_in_folder(in, "config.json", in);
  const nlohmann::json config = smp::sdk::read_hf_config(config_path);
  const bool mixtral = config.is_object() && config.contains("model_type") && config["model_type"] == "mixtral";
  const Shape shape = mixtral ? shape_of_mixtral_config(config, config_path)
                                          : shape_of_config(config, config_path);
  // The files, and (sharded) which file the index says holds each tensor.
  std::vector<std::string> files;
  std::map<std::string, std::string> mapped;  // tensor -> file, from the index
  const std::string index = in + "/model.safetensors.index.json";
  const bool sharded = ::lstat(index.c_str(), &st) == 0;
  if (sharded) {
    const std::string index_path = smp::input::name_in_folder(in, "model.safetensors.index.json", in);
    const nlohmann::json j = smp::input::read_json(index_path, "the Hugging Face index");
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      throw smp::Error(index + ": no \"weight_map\" object");
    std::set<std::string> names;
    for (const auto& [tensor, file] : j["weight_map"].items()) {
      if (!file.is_string()) throw smp::Error(index + ": \"weight_map\": tensor '" + tensor + "' maps to " + file.dump());
      smp::input::name_in_folder(in, file.get<std::string>(), index + ": \"weight_map\": tensor '" + tensor + "'");
      names.insert(file.get<std::string>());
      mapped[tensor] = file.get<std::string>();
    }
    files.assign(names.begin(), names.end());
  } else {
    files.push_back("model.safetensors");
  }
  std::vector<std::unique_ptr<smp::SafetensorsFile>> opened;
  std::map<std::string, HfTensor> headers;
  for (const auto& file : files) {
    opened.push_back(std::make_unique<smp::SafetensorsFile>(smp::input::name_in_folder(in, file, in)));
    const smp::SafetensorsFile& f = *opened.back();
    for (const auto& [name, t] : f.tensors()) {
      if (!headers.emplace(name, HfTensor{f.path(), t}).second)
        throw smp::Error(f.path() + ": tensor '" + name + "' is in " + headers.at(name).file + " too");
      if (sharded && (!mapped.count(name) || mapped.at(name) != file))
        throw smp::Error(f.path() + " holds tensor '" + name + "', which " + index + " maps to " +
                         (mapped.count(name) ? "'" + mapped.at(name) + "'" : "no file"));
    }
  }
  for (const auto& [tensor, file] : mapped)
    if (!headers.count(tensor))
      throw smp::Error(index + ": \"weight_map\" maps tensor '" + tensor + "' to '" + file + "', which does not hold it");
  check_hf_tensors(headers, shape, in);
  Tensors read;
  for (const auto& f : opened)
    for (const auto& [name, t] : f->tensors()) {
      at::Tensor v = at::empty(t.shape, at::TensorOptions().dtype(t.dtype));
      f->read(name, 0, t.end - t.begin, v.data_ptr());
      read.emplace(name, v.to(at::kFloat));
    }
  HfFolder out;
  out.params = from_hf(read, shape);
  out.config = config;
  out.shape = shape;
  return out;
}

}  // namespace smp::llama
