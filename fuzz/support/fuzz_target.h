// What every harness shares: the entry macro, a private folder for the files a
// reader opens, and the split of one input into two files.
//
// A harness is written once and built two ways. With SMP_FUZZ_LIBFUZZER
// (fuzz/CMakeLists.txt, clang) the macro defines libFuzzer's
// LLVMFuzzerTestOneInput; without it (tests/fuzz, the normal build) it
// registers the body under its name, so the suite replays the corpus and the
// regressions through the very same function.
#pragma once

#include <fcntl.h>
#include <ftw.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace smp::fuzz {

using Body = void (*)(const uint8_t* data, size_t size);

struct Target {
  const char* name;  // the folder of its corpus and regressions
  Body body;
};
inline std::vector<Target>& targets() {
  static std::vector<Target> all;
  return all;
}
inline bool add_target(const char* name, Body body) {
  targets().push_back({name, body});
  return true;
}

// The lowest free descriptor: a reader that leaks one per refused file would,
// under a long run, end up refusing every file for "cannot open", which hides
// every later bug; so a leak is a finding of its own.
inline int lowest_free_fd() {
  const int fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) ::close(fd);
  return fd;
}

// A broken promise of a reader that returned normally (an id outside the
// vocabulary it reports): a finding like a crash.
[[noreturn]] inline void finding(const std::string& what) {
  std::fprintf(stderr, "smp fuzz: %s\n", what.c_str());
  std::abort();
}

// SMP_FUZZ_VERBOSE in the environment: each refusal's message on stderr, to
// see how far a seed gets.
inline bool verbose() {
  static const bool on = std::getenv("SMP_FUZZ_VERBOSE") != nullptr;
  return on;
}
inline void refused(const char* what) {
  if (verbose()) std::fprintf(stderr, "smp fuzz: refused: %s\n", what);
}

// One input. A reader refusing it (any std::exception: smp::Error,
// smp::sdk::Error, a JSON type error) is its normal answer; crashes,
// sanitizer reports, hangs and memory blow-ups are what the fuzzer looks for.
inline void run_one(Body body, const uint8_t* data, size_t size) {
  // Measured around each input: libFuzzer opens descriptors of its own
  // between inputs (the symbolizer's pipes).
  const int baseline = lowest_free_fd();
  try {
    body(data, size);
    if (verbose()) std::fprintf(stderr, "smp fuzz: done\n");
  } catch (const std::exception& e) {
    refused(e.what());
  }
  if (lowest_free_fd() > baseline) {
    std::fprintf(stderr, "smp fuzz: the reader leaked a file descriptor on this input\n");
    std::abort();
  }
}

// POSIX, not std::filesystem: pip torch's libtorch.so exports a copy of
// std::filesystem that interposes on libstdc++'s, and remove_all crashed
// through it (core/src/base/logging.cpp says the same).
inline void remove_tree(const std::string& path) {
  ::nftw(
      path.c_str(),
      [](const char* p, const struct stat*, int, struct FTW*) {
        ::remove(p);  // what cannot be removed stays: a temporary folder
        return 0;
      },
      16,
      FTW_DEPTH | FTW_PHYS);
}
inline void make_dir(const std::string& path) {
  if (::mkdir(path.c_str(), 0700) != 0 && errno != EEXIST) {
    std::perror(("smp fuzz: mkdir " + path).c_str());
    std::abort();
  }
}

// A folder of this process's own (removed at normal exit); every harness
// writes its files here under fixed names, rewritten for each input.
inline const std::string& work_dir() {
  static const std::string dir = [] {
    std::string base = std::getenv("TMPDIR") && *std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp";
    std::string templ = base + "/smp-fuzz-XXXXXX";
    if (!::mkdtemp(templ.data())) {
      std::perror("smp fuzz: mkdtemp");
      std::abort();
    }
    static struct Cleanup {
      std::string path;
      ~Cleanup() { remove_tree(path); }
    } cleanup{templ};
    return templ;
  }();
  return dir;
}

inline void write_file(const std::string& path, std::string_view bytes) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f || (!bytes.empty() && std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size()) || std::fclose(f) != 0) {
    std::perror(("smp fuzz: writing " + path).c_str());
    std::abort();
  }
}

// Two files from one input: its first 4 bytes (little-endian) are the length
// of the first, the rest of the input is the second (both cut to what is there).
inline std::pair<std::string_view, std::string_view> split_two(const uint8_t* data, size_t size) {
  const char* p = reinterpret_cast<const char*>(data);
  if (size < 4) return {std::string_view(), std::string_view()};
  uint32_t first = 0;
  std::memcpy(&first, data, 4);
  const size_t a = std::min<size_t>(first, size - 4);
  return {std::string_view(p + 4, a), std::string_view(p + 4 + a, size - 4 - a)};
}

}  // namespace smp::fuzz

#define SMP_FUZZ_BODY_(name) smp_fuzz_body_##name
#ifdef SMP_FUZZ_LIBFUZZER
#define SMP_FUZZ_TARGET(name)                                                        \
  static void SMP_FUZZ_BODY_(name)(const uint8_t* data, size_t size);                \
  extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {          \
    smp::fuzz::run_one(SMP_FUZZ_BODY_(name), data, size);                            \
    return 0;                                                                        \
  }                                                                                  \
  static void SMP_FUZZ_BODY_(name)(const uint8_t* data, size_t size)
#else
#define SMP_FUZZ_TARGET(name)                                                                          \
  static void SMP_FUZZ_BODY_(name)(const uint8_t* data, size_t size);                                  \
  [[maybe_unused]] static const bool smp_fuzz_registered_##name =                                       \
      smp::fuzz::add_target(#name, SMP_FUZZ_BODY_(name));                                              \
  static void SMP_FUZZ_BODY_(name)(const uint8_t* data, size_t size)
#endif
