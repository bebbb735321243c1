// smp_embed: a program using libsmp_core's public C++ API (<smp/smp.h>).
//
//   smp_embed [plugin ...]
//
// Loads each plugin, given by path or by name (found on SMP_PLUGIN_PATH, then in
// the install's plugin folder), and lists what it provides. Without arguments it
// loads every plugin in those folders. Exit status 1 if any plugin was refused.
#include <smp/smp.h>

#include <dirent.h>

#include <algorithm>
#include <iostream>
#include <set>
#include <string>
#include <vector>

namespace {

std::string join(const std::vector<std::string>& items) {
  std::string s;
  for (const auto& i : items) s += (s.empty() ? "" : ", ") + i;
  return s.empty() ? "-" : s;
}

// Every *.so in the plugin search path, first folder first, each name once.
std::vector<std::string> all_plugins() {
  std::vector<std::string> found;
  std::set<std::string> names;
  for (const auto& dir : smp::PluginRegistry::search_path()) {
    // POSIX, not std::filesystem: pip torch's libtorch.so exports its own copy of
    // std::filesystem, which interposes on libstdc++'s.
    std::vector<std::string> files;
    if (DIR* d = ::opendir(dir.c_str())) {
      while (const dirent* e = ::readdir(d)) {
        const std::string name = e->d_name;
        if (name.size() > 3 && name.compare(name.size() - 3, 3, ".so") == 0) files.push_back(name);
      }
      ::closedir(d);
    }
    std::sort(files.begin(), files.end());
    for (const auto& f : files)
      if (names.insert(f).second) found.push_back(dir + "/" + f);
  }
  return found;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> plugins(argv + 1, argv + argc);
  if (plugins.empty()) plugins = all_plugins();
  if (plugins.empty()) {
    std::cerr << "no plugins found (searched: " << join(smp::PluginRegistry::search_path()) << ")\n";
    return 1;
  }

  std::cout << "plugin search path: " << join(smp::PluginRegistry::search_path()) << "\n";
  smp::PluginRegistry registry;
  int refused = 0;
  for (const auto& p : plugins) {
    try {
      const smp::PluginInfo& info = registry.load(p);
      std::cout << "plugin " << info.name << " " << info.version << " (ABI " << info.abi_major << "."
                << info.abi_minor << ", LibTorch " << (info.torch_version.empty() ? "-" : info.torch_version)
                << ") from " << info.path << "\n"
                << "  module kinds: " << join(info.module_kinds) << "\n"
                << "  model adapters: " << join(info.adapters) << "\n"
                << "  partition strategies: " << join(info.partitioners) << "\n"
                << "  rules (axis:kind): " << join(info.rules) << "\n";
    } catch (const smp::Error& e) {
      std::cout << "refused: " << e.what() << "\n";
      ++refused;
    }
  }
  std::cout << registry.plugins().size() << " plugin(s) loaded, " << refused << " refused; module kinds: "
            << join(registry.module_kinds()) << "\n";
  return refused ? 1 : 0;
}
