#include "checkpoint/manifest_check.h"

#include <smp/error.h>

#include "checkpoint/safetensors.h"

#include <smp/common/input_file.hpp>

#include <boost/filesystem.hpp>
#include <nlohmann/json.hpp>

#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <vector>

namespace smp {

namespace fs = boost::filesystem;

// The one link policy of every folder smp reads names from
// (smp/sdk/input_file.hpp), its refusals as smp::Error.
std::string path_inside(const std::string& folder, const std::string& name, const std::string& where) {
  try {
    return input::name_in_folder(folder, name, where);
  } catch (const input::Error& e) {
    throw Error(e.what());
  }
}

namespace {

struct Checker {
  std::string where;  // "checkpoint <folder>/manifest.json"

  [[noreturn]] void fail(const std::string& what) const { throw Error(where + ": " + what); }

  const nlohmann::json& field(const nlohmann::json& obj, const char* key, const std::string& of) const {
    if (!obj.is_object() || !obj.contains(key)) fail(of + " has no \"" + key + "\"");
    return obj[key];
  }
  int64_t count(const nlohmann::json& obj, const char* key, const std::string& of, int64_t least = 0) const {
    const nlohmann::json& v = field(obj, key, of);
    if (!v.is_number_integer() || v.get<int64_t>() < least)
      fail(of + ": \"" + key + "\" is " + v.dump() + ", not an integer >= " + std::to_string(least));
    return v.get<int64_t>();
  }
  std::vector<int64_t> dims(const nlohmann::json& obj, const char* key, const std::string& of) const {
    const nlohmann::json& v = field(obj, key, of);
    if (!v.is_array()) fail(of + ": \"" + key + "\" is " + v.dump() + ", not a list of sizes");
    std::vector<int64_t> out;
    for (const auto& d : v) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) fail(of + ": \"" + key + "\" has " + d.dump() + ", not a size");
      out.push_back(d.get<int64_t>());
    }
    return out;
  }
};

// The product of `shape`, refused past int64 (a shape no file holds).
int64_t product(const std::vector<int64_t>& shape, const Checker& c, const std::string& of) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / d) c.fail(of + ": the shape's element count overflows");
    n *= d;
  }
  return n;
}

struct Slice {
  std::vector<int64_t> offsets, block;
  int64_t begin = 0, end = 0;  // flat range within the block
  size_t index = 0;
  int64_t crc = -1;  // the slice's CRC-32C, -1 when the manifest gives none
};

bool boxes_disjoint(const Slice& a, const Slice& b) {
  for (size_t d = 0; d < a.offsets.size(); ++d)
    if (a.offsets[d] + a.block[d] <= b.offsets[d] || b.offsets[d] + b.block[d] <= a.offsets[d]) return true;
  return false;
}

}  // namespace

void check_manifest(const std::string& folder, const nlohmann::json& manifest) {
  const Checker c{"checkpoint " + (fs::path(folder) / "manifest.json").string()};
  if (manifest.contains("step")) c.count(manifest, "step", "the manifest");
  const nlohmann::json& files = c.field(manifest, "files", "the manifest");
  if (!files.is_array()) c.fail("\"files\" is not a list");
  std::set<std::string> listed;
  std::map<std::string, int64_t> file_bytes, slice_bytes;  // by file: its size, and what its slices need
  for (size_t i = 0; i < files.size(); ++i) {
    const std::string of = "files[" + std::to_string(i) + "]";
    const nlohmann::json& name = c.field(files[i], "name", of);
    if (!name.is_string()) c.fail(of + ": \"name\" is " + name.dump() + ", not a file name");
    path_inside(folder, name.get<std::string>(), c.where + ": " + of);
    if (!listed.insert(name.get<std::string>()).second) c.fail(of + ": '" + name.get<std::string>() + "' is listed twice");
    file_bytes[name.get<std::string>()] = c.count(files[i], "bytes", of);
    const int64_t crc = c.count(files[i], "crc32c", of);
    if (crc > 0xffffffffLL) c.fail(of + ": \"crc32c\" " + std::to_string(crc) + " is not a 32-bit value");
  }
  const nlohmann::json& tensors = c.field(manifest, "tensors", "the manifest");
  if (!tensors.is_object()) c.fail("\"tensors\" is not an object");
  for (const auto& [name, t] : tensors.items()) {
    const std::string of = "tensor '" + name + "'";
    const nlohmann::json& dtype = c.field(t, "dtype", of);
    if (!dtype.is_string()) c.fail(of + ": \"dtype\" is " + dtype.dump());
    int64_t element_bytes = 0;
    try {
      element_bytes = static_cast<int64_t>(c10::elementSize(scalar_type_of(dtype.get<std::string>())));
    } catch (const Error&) {
      c.fail(of + ": unknown dtype " + dtype.dump());
    }
    // A slice's bytes, counted against its file's size: the shapes and counts
    // of a manifest whose files are on disk with their sizes (which loading
    // checks before it allocates) can then ask for no more memory than the
    // files hold.
    auto in_file = [&](const std::string& file, int64_t elements, const std::string& sof) {
      int64_t& used = slice_bytes[file];
      const int64_t left = file_bytes.at(file) - used;
      if (elements > left / element_bytes)
        c.fail(sof + ": its " + std::to_string(elements) + " elements of " + dtype.get<std::string>() +
               " and the slices before it in '" + file + "' need more than its \"bytes\" " +
               std::to_string(file_bytes.at(file)));
      used += elements * element_bytes;
    };
    const std::vector<int64_t> shape = c.dims(t, "shape", of);
    const int64_t total = product(shape, c, of);
    const nlohmann::json& slices = c.field(t, "slices", of);
    if (!slices.is_array() || slices.empty()) c.fail(of + ": \"slices\" is not a non-empty list");
    std::vector<Slice> parts;
    int64_t held = 0;
    for (size_t k = 0; k < slices.size(); ++k) {
      const nlohmann::json& s = slices[k];
      const std::string sof = of + " slice " + std::to_string(k);
      const nlohmann::json& file = c.field(s, "file", sof);
      if (!file.is_string() || !listed.count(file.get<std::string>()))
        c.fail(sof + ": \"file\" " + file.dump() + " is not one of the manifest's files");
      if (shape.empty()) {  // a counter: one element, its CRC checked as a slice's (a float one was undefined)
        if (s.contains("crc32c")) {
          const int64_t crc = c.count(s, "crc32c", sof);
          if (crc > 0xffffffffLL) c.fail(sof + ": \"crc32c\" " + std::to_string(crc) + " is not a 32-bit value");
        }
        in_file(file.get<std::string>(), 1, sof);
        held += 1;
        continue;
      }
      Slice p;
      p.index = k;
      p.offsets = c.dims(s, "offsets", sof);
      p.block = c.dims(s, "block_shape", sof);
      if (p.offsets.size() != shape.size() || p.block.size() != shape.size())
        c.fail(sof + ": offsets and block_shape need " + std::to_string(shape.size()) + " dimensions, like the shape");
      for (size_t d = 0; d < shape.size(); ++d)
        if (p.block[d] > shape[d] || p.offsets[d] > shape[d] - p.block[d])
          c.fail(sof + ": the block at offset " + std::to_string(p.offsets[d]) + " of size " +
                 std::to_string(p.block[d]) + " leaves the shape's " + std::to_string(shape[d]) + " in dimension " +
                 std::to_string(d));
      const int64_t block_elements = product(p.block, c, sof);
      const nlohmann::json& flat = c.field(s, "flat_begin", sof);
      if (!flat.is_number_integer() || flat.get<int64_t>() < -1) c.fail(sof + ": \"flat_begin\" is " + flat.dump());
      const int64_t numel = c.count(s, "numel", sof);
      p.begin = flat.get<int64_t>() < 0 ? 0 : flat.get<int64_t>();
      if (flat.get<int64_t>() < 0 ? numel != block_elements : numel > block_elements - p.begin)
        c.fail(sof + ": " + std::to_string(numel) + " elements from flat index " + flat.dump() + " do not fit its block of " +
               std::to_string(block_elements));
      p.end = p.begin + numel;
      if (s.contains("crc32c")) {  // loading compares it with the slice's bytes
        p.crc = c.count(s, "crc32c", sof);
        if (p.crc > 0xffffffffLL) c.fail(sof + ": \"crc32c\" " + std::to_string(p.crc) + " is not a 32-bit value");
      }
      in_file(file.get<std::string>(), numel, sof);
      // Repeated slices (below) may hold more than the shape until they are
      // counted once; past int64 no checkpoint is.
      if (numel > std::numeric_limits<int64_t>::max() - held) c.fail(sof + ": the slices' element counts overflow");
      held += numel;
      parts.push_back(p);
    }
    std::vector<bool> repeated(parts.size(), false);
    for (size_t a = 0; a < parts.size(); ++a)
      for (size_t b = a + 1; b < parts.size(); ++b) {
        const Slice &x = parts[a], &y = parts[b];
        if (boxes_disjoint(x, y)) continue;
        if (x.offsets != y.offsets || x.block != y.block)
          c.fail(of + ": slices " + std::to_string(x.index) + " and " + std::to_string(y.index) +
                 " overlap (their blocks intersect)");
        // The same values written twice (same range, same CRC: checkpoints
        // of smp before 2026-12-04 under ZeRO 1-2 wrote whole parameters from
        // every dp rank) hold nothing new: counted once.
        if (x.begin == y.begin && x.end == y.end && x.crc >= 0 && x.crc == y.crc) {
          if (!repeated[b]) held -= y.end - y.begin;
          repeated[b] = true;
          continue;
        }
        if (x.begin < y.end && y.begin < x.end)
          c.fail(of + ": slices " + std::to_string(x.index) + " and " + std::to_string(y.index) +
                 " overlap (the same block, flat ranges intersecting)");
      }
    if (held != total)
      c.fail(of + ": its slices hold " + std::to_string(held) + " elements, the shape has " + std::to_string(total) +
             (held < total ? " (a gap: some elements are in no file)" : ""));
  }
}

namespace {

// A counter's value as a message shows it: whole numbers without a fraction.
std::string number(double v) {
  if (std::isfinite(v) && v == std::floor(v) && std::fabs(v) < 9007199254740992.0)
    return std::to_string(static_cast<int64_t>(v));
  if (!std::isfinite(v)) return std::isnan(v) ? "nan" : v > 0 ? "inf" : "-inf";
  nlohmann::json j = v;
  return j.dump();
}

}  // namespace

void check_counter(const std::string& where, const std::string& name, double value) {
  static const std::set<std::string> counts{"train/step", "optim/step", "loss_scaler/good_steps",
                                            "loss_scaler/skipped"};
  if (counts.count(name)) {
    if (!std::isfinite(value) || value < 0 || value != std::floor(value) || value > 9007199254740992.0)
      throw Error(where + ": counter '" + name + "' is " + number(value) + ", not a count (an integer >= 0)");
  } else if (name == "loss_scaler/scale") {
    if (!std::isfinite(value) || value <= 0)
      throw Error(where + ": counter '" + name + "' is " + number(value) + ", not a positive finite loss scale");
  }
}

void check_counters(const std::string& where, const std::map<std::string, double>& values,
                    const nlohmann::json& manifest) {
  for (const auto& [name, value] : values) check_counter(where, name, value);
  const auto step = values.find("train/step");
  if (step == values.end()) return;
  if (manifest.is_object() && manifest.contains("step") && manifest["step"].is_number_integer() &&
      static_cast<double>(manifest["step"].get<int64_t>()) != step->second)
    throw Error(where + ": counter 'train/step' is " + number(step->second) + ", the manifest's \"step\" is " +
                manifest["step"].dump());
  for (const char* name : {"optim/step", "loss_scaler/good_steps", "loss_scaler/skipped"}) {
    const auto it = values.find(name);
    if (it != values.end() && it->second > step->second)
      throw Error(where + ": counter '" + name + "' is " + number(it->second) + ", more than the " +
                  number(step->second) + " steps of 'train/step'");
  }
  // A step either updates or is skipped by the loss scaler.
  const auto updates = values.find("optim/step"), skipped = values.find("loss_scaler/skipped");
  if (updates != values.end() && skipped != values.end() && updates->second + skipped->second > step->second)
    throw Error(where + ": counters 'optim/step' " + number(updates->second) + " and 'loss_scaler/skipped' " +
                number(skipped->second) + " add up to more than the " + number(step->second) +
                " steps of 'train/step'");
}

}  // namespace smp
