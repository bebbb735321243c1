// The safetensors reader (core/src/checkpoint/safetensors.cpp) on one file:
// the input is the whole file, opened by path as a checkpoint load opens a
// shard, then every tensor's bytes read back through the same descriptor.
#include "support/fuzz_target.h"

#include "checkpoint/safetensors.h"

SMP_FUZZ_TARGET(safetensors) {
  const std::string path = smp::fuzz::work_dir() + "/rank-00000.safetensors";
  smp::fuzz::write_file(path, std::string_view(reinterpret_cast<const char*>(data), size));
  const smp::SafetensorsFile file(path);
  std::vector<char> buffer;
  for (const auto& [name, t] : file.tensors()) {
    // The header's claims were checked against the file: the range is inside it.
    buffer.resize(static_cast<size_t>(t.end - t.begin));
    file.read(name, 0, t.end - t.begin, buffer.data());
  }
  for (const auto& [key, value] : file.metadata()) buffer.assign(value.begin(), value.end());
}
