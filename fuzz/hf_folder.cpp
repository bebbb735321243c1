// A Hugging Face model folder as `smp-checkpoint import --format hf` reads it
// (convert/hf_folder.cpp: config.json, the index, the safetensors headers
// checked against the config, then the tensors read and renamed). The input
// holds three files: [u32 length][config.json][u32 length][index][shard]; an
// empty index means a folder of one model.safetensors, else the shard is
// written under both names an index of the seeds uses.
#include "support/fuzz_target.h"

#include "hf_folder.h"

SMP_FUZZ_TARGET(hf_folder) {
  const auto [config, rest] = smp::fuzz::split_two(data, size);
  const auto [index, shard] =
      smp::fuzz::split_two(reinterpret_cast<const uint8_t*>(rest.data()), rest.size());
  const std::string dir = smp::fuzz::work_dir() + "/hf";
  smp::fuzz::remove_tree(dir);
  smp::fuzz::make_dir(dir);
  smp::fuzz::write_file(dir + "/config.json", config);
  if (!index.empty()) {
    smp::fuzz::write_file(dir + "/model.safetensors.index.json", index);
    smp::fuzz::write_file(dir + "/model-00001-of-00002.safetensors", shard);
    smp::fuzz::write_file(dir + "/model-00002-of-00002.safetensors", shard);
  } else {
    smp::fuzz::write_file(dir + "/model.safetensors", shard);
  }
  const smp::llama::HfFolder f = smp::llama::read_hf_folder(dir);
  double sum = 0;
  for (const auto& [name, t] : f.params) sum += static_cast<double>(t.numel());
  (void)sum;
}
