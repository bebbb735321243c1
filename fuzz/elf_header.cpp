// The check a plugin file gets before dlopen (core/src/plugin/elf_check.cpp):
// the input is the whole file, checked by path as PluginRegistry::load checks
// it. Only the check runs, never dlopen. A file the check accepts is then read
// here again, independently: every table and loaded segment it promised to be
// inside the file must be (a broken promise is a finding: dlopen would have
// mapped past the file's end).
#include "support/fuzz_target.h"

#include "plugin/elf_check.h"

#include <elf.h>

namespace {

template <class T>
T field(const uint8_t* data, size_t size, uint64_t offset) {
  T v{};
  if (offset > size || sizeof v > size - offset) smp::fuzz::finding("the ELF check accepted a header past the file's end");
  std::memcpy(&v, data + offset, sizeof v);
  return v;
}

bool inside(uint64_t offset, uint64_t length, size_t size) {
  return static_cast<unsigned __int128>(offset) + length <= size;
}

}  // namespace

SMP_FUZZ_TARGET(elf_header) {
  const std::string path = smp::fuzz::work_dir() + "/plugin.so";
  smp::fuzz::write_file(path, std::string_view(reinterpret_cast<const char*>(data), size));
  smp::plugin::check_elf_file(path);
  // Accepted: what dlopen will map must be in the file.
  const auto eh = field<Elf64_Ehdr>(data, size, 0);
  if (std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 || eh.e_type != ET_DYN)
    smp::fuzz::finding("the ELF check accepted a file that is not an ELF shared object");
  if (eh.e_phentsize != sizeof(Elf64_Phdr) || !inside(eh.e_phoff, uint64_t{eh.e_phnum} * sizeof(Elf64_Phdr), size))
    smp::fuzz::finding("the ELF check accepted a program header table past the file's end");
  for (uint64_t i = 0; i < eh.e_phnum; ++i) {
    const auto ph = field<Elf64_Phdr>(data, size, eh.e_phoff + i * sizeof(Elf64_Phdr));
    if (ph.p_type == PT_LOAD && !inside(ph.p_offset, ph.p_filesz, size))
      smp::fuzz::finding("the ELF check accepted segment " + std::to_string(i) + " past the file's end");
  }
}
