// safetensors files (https://github.com/huggingface/safetensors): an 8-byte
// little-endian header length, a JSON header naming each tensor's dtype,
// shape and byte range, then the raw little-endian data. Each checkpoint shard
// is one, so any safetensors reader opens it.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace smp {

// "F32" etc. for a dtype, and back; throws naming the dtype it cannot map.
std::string safetensors_dtype(at::ScalarType t);
at::ScalarType scalar_type_of(const std::string& safetensors_dtype);

struct SafetensorsWritten {
  int64_t bytes = 0;    // the whole file
  uint32_t crc32c = 0;  // of the whole file
};

// Writes `tensors` (CPU; any strides) to `path` and fsyncs it. Throws smp::Error
// naming the path (and, when the disk is full, the bytes the file needed).
SafetensorsWritten write_safetensors(const std::string& path,
                                     const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                                     const std::map<std::string, std::string>& metadata);

struct SafetensorsTensor {
  at::ScalarType dtype;
  std::vector<int64_t> shape;
  int64_t begin = 0, end = 0;  // bytes, from the start of the file
};

// A file's header, checked against the file's size: every range inside it and
// of the size its dtype and shape make. Throws naming the file and tensor.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(std::string path);  // opens it once; read() reads through that descriptor
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  const std::string& path() const { return path_; }
  const std::map<std::string, SafetensorsTensor>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const SafetensorsTensor& at(const std::string& name) const;
  // Bytes [begin, end) of tensor `name`'s data into `out` (end - begin bytes).
  void read(const std::string& name, int64_t begin, int64_t end, void* out) const;

 private:
  std::string path_;
  int fd_ = -1;
  int64_t size_ = 0;
  std::map<std::string, SafetensorsTensor> tensors_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace smp
