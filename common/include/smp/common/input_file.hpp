// The one reading discipline for files smp did not write itself (Hugging Face
// folders, tokenizers, job and cluster files, plugin files): a regular file
// only (a named pipe would block the reader forever, a device never ends), its
// size bounded before a byte is read, JSON parsed with its nesting bounded and
// duplicate keys refused, and names resolved inside the folder they were given
// in under one link policy. Every refusal names the file.
//
// Header-only, with no LibTorch: the core, the launcher tools, the SDK's
// tokenizers and the fuzz harnesses share it. It throws smp::input::Error; a
// caller that owns another error type rewraps the message.
#pragma once

#include <nlohmann/json.hpp>

#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <set>
#include <stdexcept>
#include <string>
#include <sys/stat.h>
#include <unistd.h>
#include <vector>

namespace smp::input {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

inline constexpr int64_t kMiB = int64_t{1} << 20;
// Deeper than any file smp reads nests (a manifest's job tables included).
inline constexpr int kMaxJsonDepth = 64;
// Bounds by kind, each well above the largest real file of its kind:
inline constexpr int64_t kMaxConfigBytes = 16 * kMiB;     // config.json, an index, a TOML job or cluster file
inline constexpr int64_t kMaxTokenizerBytes = 256 * kMiB;  // tokenizer.json of a 250k vocabulary is ~20 MB
// safetensors' own reader refuses headers over 100 MB (MAX_HEADER_SIZE).
inline constexpr int64_t kMaxSafetensorsHeaderBytes = 100'000'000;

inline std::string kind_of_mode(mode_t m) {
  if (S_ISDIR(m)) return "a folder";
  if (S_ISFIFO(m)) return "a named pipe";
  if (S_ISCHR(m) || S_ISBLK(m)) return "a device";
  if (S_ISSOCK(m)) return "a socket";
  return "not a regular file";
}

// An open regular file: the descriptor is checked with fstat after open, so
// what is read is what was checked. O_NONBLOCK keeps open() of a named pipe
// with no writer from blocking; it is cleared once the file is known regular.
class File {
 public:
  File(const std::string& path, const std::string& what) : path_(path) {
    // A NUL would cut the name the kernel sees short of the one checked and shown.
    if (path.find('\0') != std::string::npos)
      throw Error(what + ": a file name with a NUL byte in it: " + path.substr(0, path.find('\0')) + "\\0...");
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd_ < 0) throw Error(what + ": cannot open " + path + ": " + std::strerror(errno));
    struct stat st {};
    if (::fstat(fd_, &st) != 0) {
      const int e = errno;
      ::close(fd_);
      throw Error(what + ": cannot stat " + path + ": " + std::strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
      ::close(fd_);
      throw Error(what + ": " + path + " is " + kind_of_mode(st.st_mode) + ", not a regular file");
    }
    const int flags = ::fcntl(fd_, F_GETFL);
    if (flags >= 0) ::fcntl(fd_, F_SETFL, flags & ~O_NONBLOCK);
    size_ = static_cast<int64_t>(st.st_size);
  }
  ~File() {
    if (fd_ >= 0) ::close(fd_);
  }
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  int fd() const { return fd_; }
  int64_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // Gives the descriptor to the caller (who closes it).
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }

  // Exactly `n` bytes at `offset`, or an Error naming the file (truncated).
  void read_at(void* out, int64_t n, int64_t offset, const std::string& what) const {
    char* p = static_cast<char*>(out);
    while (n > 0) {
      const ssize_t r = ::pread(fd_, p, static_cast<size_t>(n), offset);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) throw Error(what + ": " + path_ + ": read failed at byte " + std::to_string(offset) + " (truncated?)");
      p += r;
      offset += r;
      n -= r;
    }
  }

 private:
  std::string path_;
  int fd_ = -1;
  int64_t size_ = 0;
};

// The whole of a regular file of at most `max_bytes`.
inline std::string read_file(const std::string& path, const std::string& what, int64_t max_bytes) {
  const File f(path, what);
  if (f.size() > max_bytes)
    throw Error(what + ": " + path + " is " + std::to_string(f.size()) + " bytes, more than the " +
                std::to_string(max_bytes) + " such a file may have");
  std::string text(static_cast<size_t>(f.size()), '\0');
  f.read_at(text.data(), f.size(), 0, what);
  return text;
}

namespace detail {

// A SAX pass that builds nothing: it bounds the nesting and refuses a key
// given twice in one object, so the DOM parse after it cannot recurse past
// the bound. (nlohmann's parse callback would do both in one pass, but its
// parser rescans the enclosing array at every object's end: quadratic, 80k
// objects took 4.5 s.)
class JsonShapeCheck : public nlohmann::json_sax<nlohmann::json> {
 public:
  JsonShapeCheck(const std::string& what, int max_depth) : what_(what), max_(max_depth) {}
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override {
    enter();
    keys_.emplace_back();
    return true;
  }
  bool key(string_t& k) override {
    if (!keys_.back().insert(k).second) throw Error(what_ + ": the key \"" + k + "\" is given twice in one object");
    return true;
  }
  bool end_object() override {
    keys_.pop_back();
    --depth_;
    return true;
  }
  bool start_array(std::size_t) override {
    enter();
    return true;
  }
  bool end_array() override {
    --depth_;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    throw Error(what_ + ": not JSON: " + e.what());
  }

 private:
  void enter() {
    if (++depth_ > max_)
      throw Error(what_ + ": nested deeper than " + std::to_string(max_) + " levels (no such file nests so)");
  }
  const std::string& what_;
  int max_;
  int depth_ = 0;
  std::vector<std::set<std::string>> keys_;  // one set per open object
};

}  // namespace detail

// JSON text parsed with nesting bounded (messages dump values, which recurses
// once per level; a file of nothing but brackets would overflow the stack)
// and a key given twice in one object refused (which value a reader keeps
// differs between parsers). Syntax errors name `what`. Linear in the text.
inline nlohmann::json parse_json(const std::string& text, const std::string& what, int max_depth = kMaxJsonDepth) {
  detail::JsonShapeCheck check(what, max_depth);
  nlohmann::json::sax_parse(text, &check);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(what + ": not JSON: " + e.what());
  }
}

inline nlohmann::json read_json(const std::string& path, const std::string& what, int64_t max_bytes = kMaxConfigBytes) {
  return parse_json(read_file(path, what, max_bytes), what + " (" + path + ")");
}

inline std::string canonical(const std::string& path) {
  char buf[PATH_MAX];
  return ::realpath(path.c_str(), buf) ? std::string(buf) : std::string();
}

inline std::string parent_of(const std::string& path) {
  const size_t at = path.rfind('/');
  return at == std::string::npos || at == 0 ? std::string("/") : path.substr(0, at);
}

inline std::string base_of(const std::string& path) {
  const size_t at = path.rfind('/');
  return at == std::string::npos ? path : path.substr(at + 1);
}

// `name`, a file another file named, as a path inside `folder`. One policy for
// every folder smp reads names from (a checkpoint, a Hugging Face model):
// - a plain name: no '/', no "..", no NUL;
// - a link must resolve to a file directly inside the folder, or, where the
//   folder is a Hugging Face hub cache snapshot (<repo>/snapshots/<rev>, whose
//   files are links to ../../blobs/<hash>), directly inside that <repo>/blobs:
//   still under the cache root the folder was given in. Anything else is
//   refused naming the link and where it points.
inline std::string name_in_folder(const std::string& folder, const std::string& name, const std::string& what) {
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos ||
      name.find('\\') != std::string::npos || name.find('\0') != std::string::npos)
    throw Error(what + " names '" + name + "': only a plain name inside " + folder +
                " is allowed (no path, no \"..\")");
  const std::string path = (folder.empty() ? std::string(".") : folder) + "/" + name;
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) return path;
  const std::string target = canonical(path), home = canonical(folder.empty() ? "." : folder);
  char link[PATH_MAX];
  const ssize_t n = ::readlink(path.c_str(), link, sizeof link - 1);
  const std::string shown = n > 0 ? std::string(link, static_cast<size_t>(n)) : std::string("?");
  if (target.empty() || home.empty())
    throw Error(what + " names '" + name + "', a link to " + shown + " that does not resolve");
  const std::string where = parent_of(target);
  if (where == home) return path;
  // The hub cache: home = <repo>/snapshots/<rev>, target in <repo>/blobs.
  const std::string snapshots = parent_of(home);
  if (base_of(snapshots) == "snapshots" && where == parent_of(snapshots) + "/blobs") return path;
  throw Error(what + " names '" + name + "', a link to " + shown + " outside " + folder +
              " (links may point inside the folder, or from a hub cache snapshot into its own blobs/)");
}

// A number from outside that a finite value of at least `least` (and at most
// `most`) is meant to be: NaN and infinity refused, naming `what`.
inline std::string number_text(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

inline double finite_in(double v, double least, double most, const std::string& what) {
  if (!std::isfinite(v) || v < least || v > most)
    throw Error(what + " is " + number_text(v) + ": expected a finite number in [" + number_text(least) + ", " +
                number_text(most) + "]");
  return v;
}

}  // namespace smp::input
