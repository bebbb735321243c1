// Text data for model adapters: a file, or every regular file of a folder in
// name order (hidden files skipped), each kept apart so an adapter can see
// document boundaries. Errors name the [model] key and the path.
#pragma once

#include <smp/sdk/host.hpp>
#include <smp/sdk/input_file.hpp>

#include <algorithm>
#include <dirent.h>
#include <fstream>
#include <iterator>
#include <string>
#include <sys/stat.h>
#include <vector>

namespace smp::sdk {

struct TextFile {
  std::string path;
  std::string bytes;
};

// `key` is the [model] key the path came from (e.g. "data": messages say
// "model.data"), or a label used as it is when it names no [model] key (one
// starting with "-", or holding a '.': "--input", "job.corpus").
inline std::vector<TextFile> read_text_files(const std::string& path, const std::string& key = "data") {
  const std::string label = key.find('.') != std::string::npos || (!key.empty() && key[0] == '-') ? key : "model." + key;
  // A regular file only (a named pipe would block the reader forever); text
  // corpora are bounded by memory alone.
  auto read = [&](const std::string& file) {
    try {
      return TextFile{file, input::read_file(file, label, int64_t{1} << 40)};
    } catch (const input::Error& e) {
      throw Error(e.what());
    }
  };
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) throw Error(label + ": no such file or folder: " + path);
  if (!S_ISDIR(st.st_mode)) return {read(path)};
  std::vector<std::string> names;
  if (DIR* d = opendir(path.c_str())) {
    while (dirent* e = readdir(d)) {
      const std::string f = path + "/" + e->d_name;
      struct stat fs {};
      if (e->d_name[0] != '.' && stat(f.c_str(), &fs) == 0 && S_ISREG(fs.st_mode)) names.push_back(f);
    }
    closedir(d);
  } else {
    throw Error(label + ": cannot list folder " + path);
  }
  std::sort(names.begin(), names.end());
  std::vector<TextFile> out;
  for (const auto& f : names) out.push_back(read(f));
  if (out.empty()) throw Error(label + ": folder " + path + " has no files");
  return out;
}

}  // namespace smp::sdk
