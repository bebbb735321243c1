#include "checkpoint/safetensors.h"

#include "checkpoint/crc32c.h"

#include "base/json_depth.h"

#include <smp/common/input_file.hpp>

#include <smp/error.h>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <memory>

namespace smp {

namespace {

const std::pair<at::ScalarType, const char*> kDtypes[] = {
    {at::kDouble, "F64"}, {at::kFloat, "F32"}, {at::kHalf, "F16"}, {at::kBFloat16, "BF16"}, {at::kLong, "I64"},
    {at::kInt, "I32"},    {at::kShort, "I16"}, {at::kChar, "I8"},  {at::kByte, "U8"},       {at::kBool, "BOOL"}};

std::string system_error(int err) { return std::strerror(err); }

// A header's list of integers (a shape, data_offsets). Only JSON integers:
// nlohmann converts any number to int64, and a float outside int64's range
// (92233720368547758070) would make that conversion undefined.
std::vector<int64_t> integers(const nlohmann::json& v, const char* key) {
  if (!v.is_array()) throw Error(std::string(key) + " is " + v.dump() + ", not a list of integers");
  std::vector<int64_t> out;
  for (const auto& x : v) {
    if (!x.is_number_integer() || (x.is_number_unsigned() && x.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())))
      throw Error(std::string(key) + " has " + x.dump() + ", not an integer of 64 bits");
    out.push_back(x.get<int64_t>());
  }
  return out;
}

// Closes on scope exit.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

void write_all(int fd, const void* data, size_t n, const std::string& path, int64_t needed) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) {
      const int err = errno;
      std::string msg = "checkpoint: writing " + path + " failed: " + system_error(err);
      if (err == ENOSPC || err == EDQUOT)
        msg += " (the file needs " + std::to_string(needed) + " bytes)";
      throw Error(msg);
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

}  // namespace

std::string safetensors_dtype(at::ScalarType t) {
  for (const auto& [type, name] : kDtypes)
    if (type == t) return name;
  throw Error(std::string("checkpoint: no safetensors dtype for ") + c10::toString(t));
}

at::ScalarType scalar_type_of(const std::string& name) {
  for (const auto& [type, n] : kDtypes)
    if (name == n) return type;
  throw Error("checkpoint: unknown safetensors dtype '" + name + "'");
}

SafetensorsWritten write_safetensors(const std::string& path,
                                     const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                                     const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<at::Tensor> data;
  int64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (name == "__metadata__" || header.contains(name)) throw Error("checkpoint: tensor name '" + name + "' twice in " + path);
    at::Tensor c = t.detach().to(at::kCPU).contiguous();
    const int64_t bytes = static_cast<int64_t>(c.numel()) * static_cast<int64_t>(c.element_size());
    header[name] = {{"dtype", safetensors_dtype(c.scalar_type())}, {"shape", c.sizes().vec()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    data.push_back(c);
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  const uint64_t n = text.size();
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
  SafetensorsWritten out;
  out.bytes = 8 + static_cast<int64_t>(n) + offset;
  Fd f;
  f.fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (f.fd < 0) throw Error("checkpoint: cannot create " + path + ": " + system_error(errno));
  uint32_t crc = crc32c(0, len, 8);
  write_all(f.fd, len, 8, path, out.bytes);
  crc = crc32c(crc, text.data(), text.size());
  write_all(f.fd, text.data(), text.size(), path, out.bytes);
  for (const at::Tensor& c : data) {
    const size_t bytes = static_cast<size_t>(c.numel()) * c.element_size();
    crc = crc32c(crc, c.data_ptr(), bytes);
    write_all(f.fd, c.data_ptr(), bytes, path, out.bytes);
  }
  if (::fsync(f.fd) != 0) throw Error("checkpoint: fsync of " + path + " failed: " + system_error(errno));
  const int fd = f.fd;
  f.fd = -1;
  if (::close(fd) != 0) throw Error("checkpoint: closing " + path + " failed: " + system_error(errno));
  out.crc32c = crc;
  return out;
}

SafetensorsFile::SafetensorsFile(std::string path) : path_(std::move(path)) {
  // A regular file only (a named pipe would block here forever), under the
  // one reading discipline (smp/sdk/input_file.hpp).
  std::unique_ptr<input::File> file;
  try {
    file = std::make_unique<input::File>(path_, "checkpoint");
  } catch (const input::Error& e) {
    throw Error(e.what());
  }
  Fd f;  // closes it if the header is refused (no destructor runs then)
  f.fd = file->release();
  fd_ = f.fd;
  size_ = file->size();
  unsigned char len[8];
  if (size_ < 8 || ::pread(f.fd, len, 8, 0) != 8)
    throw Error("checkpoint: " + path_ + " is truncated (" + std::to_string(size_) + " bytes, no safetensors header)");
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(len[i]) << (8 * i);
  // Bounded before it is allocated, as safetensors' own reader does.
  if (n > static_cast<uint64_t>(input::kMaxSafetensorsHeaderBytes))
    throw Error("checkpoint: " + path_ + ": a safetensors header of " + std::to_string(n) + " bytes, more than the " +
                std::to_string(input::kMaxSafetensorsHeaderBytes) + " safetensors allows");
  if (n > static_cast<uint64_t>(size_ - 8))
    throw Error("checkpoint: " + path_ + " is truncated or not a safetensors file (header of " + std::to_string(n) +
                " bytes in a file of " + std::to_string(size_) + ")");
  std::string text(n, '\0');
  if (::pread(f.fd, text.data(), n, 8) != static_cast<ssize_t>(n)) throw Error("checkpoint: " + path_ + ": cannot read its header");
  // Nesting bounded and a tensor named twice refused by the parser.
  const nlohmann::json header = parse_json_bounded(text, "checkpoint: " + path_ + ": the safetensors header");
  if (!header.is_object()) throw Error("checkpoint: " + path_ + ": the safetensors header is not a JSON object");
  const int64_t data_start = 8 + static_cast<int64_t>(n);
  for (const auto& [name, v] : header.items()) {
    if (name == "__metadata__") {  // safetensors' format: a map of strings to strings, or null
      if (v.is_null()) continue;
      if (!v.is_object()) throw Error("checkpoint: " + path_ + ": the safetensors __metadata__ is not an object");
      for (const auto& [k, s] : v.items()) {
        if (!s.is_string())
          throw Error("checkpoint: " + path_ + ": the safetensors __metadata__ \"" + k + "\" is not a string");
        metadata_[k] = s.get<std::string>();
      }
      continue;
    }
    try {
      SafetensorsTensor t;
      t.dtype = scalar_type_of(v.at("dtype").get<std::string>());
      t.shape = integers(v.at("shape"), "shape");
      const auto range = integers(v.at("data_offsets"), "data_offsets");
      if (range.size() != 2) throw Error("data_offsets is not [begin, end]");
      // The shape's byte count, refused before it could overflow: every
      // figure the header gives is checked before it is added or multiplied.
      int64_t bytes = static_cast<int64_t>(c10::elementSize(t.dtype));
      for (int64_t d : t.shape) {
        if (d < 0) throw Error("its shape has the size " + std::to_string(d));
        if (d != 0 && bytes > std::numeric_limits<int64_t>::max() / d)
          throw Error("its shape's byte count overflows (no file holds it)");
        bytes *= d;
      }
      if (range[0] < 0 || range[1] < range[0] || range[1] - range[0] != bytes)
        throw Error("its byte range does not hold its dtype and shape");
      if (range[1] > size_ - data_start)
        throw Error("its data ends " + std::to_string(range[1]) + " bytes after the header (byte " +
                    std::to_string(data_start) + "), the file has " + std::to_string(size_) + " (truncated)");
      t.begin = data_start + range[0];
      t.end = data_start + range[1];
      tensors_.emplace(name, t);
    } catch (const std::exception& e) {
      throw Error("checkpoint: " + path_ + ": tensor '" + name + "': " + e.what());
    }
  }
  // No two tensors share a byte (safetensors' own reader refuses overlaps too).
  std::vector<std::pair<int64_t, const std::string*>> starts;
  for (const auto& [name, t] : tensors_)
    if (t.end > t.begin) starts.emplace_back(t.begin, &name);
  std::sort(starts.begin(), starts.end());
  for (size_t k = 1; k < starts.size(); ++k) {
    const SafetensorsTensor& prev = tensors_.at(*starts[k - 1].second);
    if (starts[k].first < prev.end)
      throw Error("checkpoint: " + path_ + ": tensors '" + *starts[k - 1].second + "' and '" + *starts[k].second +
                  "' overlap (bytes " + std::to_string(starts[k].first - data_start) + " to " +
                  std::to_string(prev.end - data_start) + " of the data)");
  }
  f.fd = -1;  // kept open for read()
}

SafetensorsFile::~SafetensorsFile() {
  if (fd_ >= 0) ::close(fd_);
}

const SafetensorsTensor& SafetensorsFile::at(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) throw Error("checkpoint: " + path_ + " has no tensor '" + name + "'");
  return it->second;
}

void SafetensorsFile::read(const std::string& name, int64_t begin, int64_t end, void* out) const {
  const SafetensorsTensor& t = at(name);
  if (begin < 0 || end < begin || t.begin + end > t.end)
    throw Error("checkpoint: " + path_ + ": bytes [" + std::to_string(begin) + ", " + std::to_string(end) +
                ") outside tensor '" + name + "'");
  char* p = static_cast<char*>(out);
  int64_t at_byte = t.begin + begin, left = end - begin;
  while (left > 0) {
    const ssize_t r = ::pread(fd_, p, static_cast<size_t>(left), at_byte);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) throw Error("checkpoint: " + path_ + ": reading tensor '" + name + "' failed (truncated?)");
    p += r;
    at_byte += r;
    left -= r;
  }
}

}  // namespace smp
