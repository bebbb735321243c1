#include "plugin/elf_check.h"

#include <smp/error.h>
#include <smp/common/input_file.hpp>

#include <elf.h>

#include <cstdint>
#include <cstdio>
#include <type_traits>
#include <vector>

namespace smp::plugin {

namespace {

// This build's ELF: class, byte order and machine, all known at compile time.
constexpr bool k64 = sizeof(void*) == 8;
using Ehdr = std::conditional_t<k64, Elf64_Ehdr, Elf32_Ehdr>;
using Phdr = std::conditional_t<k64, Elf64_Phdr, Elf32_Phdr>;
using Shdr = std::conditional_t<k64, Elf64_Shdr, Elf32_Shdr>;
constexpr unsigned char kClass = k64 ? ELFCLASS64 : ELFCLASS32;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
constexpr unsigned char kData = ELFDATA2MSB;
#else
constexpr unsigned char kData = ELFDATA2LSB;
#endif
#if defined(__x86_64__)
constexpr uint16_t kMachine = EM_X86_64;
#elif defined(__i386__)
constexpr uint16_t kMachine = EM_386;
#elif defined(__aarch64__)
constexpr uint16_t kMachine = EM_AARCH64;
#elif defined(__arm__)
constexpr uint16_t kMachine = EM_ARM;
#elif defined(__powerpc64__)
constexpr uint16_t kMachine = EM_PPC64;
#elif defined(__powerpc__)
constexpr uint16_t kMachine = EM_PPC;
#elif defined(__s390__)
constexpr uint16_t kMachine = EM_S390;
#elif defined(__riscv)
constexpr uint16_t kMachine = EM_RISCV;
#elif defined(__loongarch__)
constexpr uint16_t kMachine = 258;  // EM_LOONGARCH
#else
#error "smp: the ELF machine of this build is unknown (add it to core/src/plugin/elf_check.cpp)"
#endif

std::string machine_name(uint16_t m) {
  const char* name = nullptr;
  switch (m) {
    case EM_X86_64: name = "x86-64"; break;
    case EM_386: name = "i386"; break;
    case EM_AARCH64: name = "AArch64"; break;
    case EM_ARM: name = "ARM"; break;
    case EM_PPC64: name = "PowerPC64"; break;
    case EM_PPC: name = "PowerPC"; break;
    case EM_S390: name = "s390"; break;
    case EM_RISCV: name = "RISC-V"; break;
    case 258: name = "LoongArch"; break;
    default: break;
  }
  const std::string number = "machine " + std::to_string(m);
  return name ? std::string(name) + " (" + number + ")" : number;
}

std::string type_name(uint16_t t) {
  switch (t) {
    case ET_NONE: return "ET_NONE";
    case ET_REL: return "ET_REL (an object file, not linked)";
    case ET_EXEC: return "ET_EXEC (an executable)";
    case ET_CORE: return "ET_CORE (a core dump)";
    default: return std::to_string(t);
  }
}

std::string segment_name(uint32_t t) {
  switch (t) {
    case PT_LOAD: return "PT_LOAD";
    case PT_DYNAMIC: return "PT_DYNAMIC";
    case PT_INTERP: return "PT_INTERP";
    case PT_NOTE: return "PT_NOTE";
    case PT_PHDR: return "PT_PHDR";
    case PT_TLS: return "PT_TLS";
    case PT_GNU_EH_FRAME: return "PT_GNU_EH_FRAME";
    case PT_GNU_RELRO: return "PT_GNU_RELRO";
    default: {
      char buf[16];
      std::snprintf(buf, sizeof buf, "type 0x%x", static_cast<unsigned>(t));
      return buf;
    }
  }
}

// offset + length in decimal, exact even past 2^64.
std::string end_text(uint64_t offset, uint64_t length) {
  unsigned __int128 v = static_cast<unsigned __int128>(offset) + length;
  std::string s;
  do {
    s.insert(s.begin(), static_cast<char>('0' + static_cast<int>(v % 10)));
    v /= 10;
  } while (v != 0);
  return s;
}

// [offset, offset + length) inside a file of `size` bytes, with no overflow.
bool within(uint64_t offset, uint64_t length, uint64_t size) { return offset <= size && length <= size - offset; }

class Check {
 public:
  explicit Check(const std::string& path) : path_(path), file_(open(path)), size_(static_cast<uint64_t>(file_.size())) {}

  void run() {
    header();
    program_headers();
    section_headers();
  }

 private:
  static smp::input::File open(const std::string& path) {
    try {
      return smp::input::File(path, "plugin");
    } catch (const smp::input::Error& e) {
      throw Error(e.what());
    }
  }

  [[noreturn]] void fail(const std::string& why) const { throw Error("plugin " + path_ + " " + why); }
  [[noreturn]] void truncated(const std::string& what, uint64_t offset, uint64_t length) const {
    fail("is truncated: " + what + " ends at byte " + end_text(offset, length) + ", the file has " +
         std::to_string(size_));
  }

  void read(void* out, uint64_t n, uint64_t offset) const {
    try {
      file_.read_at(out, static_cast<int64_t>(n), static_cast<int64_t>(offset), "plugin");
    } catch (const smp::input::Error& e) {
      throw Error(e.what());
    }
  }

  void header() {
    const char* const not_elf = "is not a shared object: it does not start with the ELF magic (\\x7fELF)";
    unsigned char ident[EI_NIDENT] = {};
    const uint64_t have = size_ < EI_NIDENT ? size_ : EI_NIDENT;
    read(ident, have, 0);
    if (have < SELFMAG) {
      if (size_ == 0) fail("is empty, not a shared object");
      fail(std::string(not_elf) + "; it has " + std::to_string(size_) + " bytes");
    }
    if (ident[EI_MAG0] != ELFMAG0 || ident[EI_MAG1] != ELFMAG1 || ident[EI_MAG2] != ELFMAG2 ||
        ident[EI_MAG3] != ELFMAG3)
      fail(not_elf);
    if (size_ < sizeof(Ehdr))
      fail("is truncated: an ELF header has " + std::to_string(sizeof(Ehdr)) + " bytes, the file has " +
           std::to_string(size_));
    read(&eh_, sizeof eh_, 0);
    const std::string mine = k64 ? "64-bit" : "32-bit";
    if (eh_.e_ident[EI_CLASS] != kClass) {
      if (eh_.e_ident[EI_CLASS] == ELFCLASS32 || eh_.e_ident[EI_CLASS] == ELFCLASS64)
        fail("is a " + std::string(eh_.e_ident[EI_CLASS] == ELFCLASS32 ? "32-bit" : "64-bit") +
             " ELF file; this smp is " + mine);
      fail("has ELF class " + std::to_string(eh_.e_ident[EI_CLASS]) + " (EI_CLASS), neither 32- nor 64-bit");
    }
    const std::string order = kData == ELFDATA2LSB ? "little-endian" : "big-endian";
    if (eh_.e_ident[EI_DATA] != kData) {
      if (eh_.e_ident[EI_DATA] == ELFDATA2LSB || eh_.e_ident[EI_DATA] == ELFDATA2MSB)
        fail("is " + std::string(eh_.e_ident[EI_DATA] == ELFDATA2LSB ? "little-endian" : "big-endian") +
             "; this machine is " + order);
      fail("has ELF data encoding " + std::to_string(eh_.e_ident[EI_DATA]) + " (EI_DATA), neither little- nor big-endian");
    }
    if (eh_.e_ident[EI_VERSION] != EV_CURRENT || eh_.e_version != EV_CURRENT)
      fail("has ELF version " + std::to_string(eh_.e_ident[EI_VERSION] != EV_CURRENT ? eh_.e_ident[EI_VERSION]
                                                                                      : eh_.e_version) +
           ", not " + std::to_string(EV_CURRENT));
    if (eh_.e_machine != kMachine)
      fail("is built for " + machine_name(eh_.e_machine) + "; this smp runs on " + host_machine_name());
    if (eh_.e_type != ET_DYN) fail("is not a shared object: its ELF type is " + type_name(eh_.e_type) + ", not ET_DYN");
  }

  void program_headers() {
    if (eh_.e_phnum == 0) fail("has no program headers (e_phnum is 0): nothing to load");
    if (eh_.e_phnum >= PN_XNUM)
      fail("claims " + std::to_string(eh_.e_phnum) + " program headers (e_phnum), which no loader reads");
    if (eh_.e_phentsize != sizeof(Phdr))
      fail("has program headers of " + std::to_string(eh_.e_phentsize) + " bytes (e_phentsize), not " +
           std::to_string(sizeof(Phdr)));
    const uint64_t table = uint64_t{eh_.e_phnum} * sizeof(Phdr);  // at most 65534 * 56 bytes
    if (!within(eh_.e_phoff, table, size_))
      truncated("its program header table (" + std::to_string(eh_.e_phnum) + " entries from byte " +
                    std::to_string(eh_.e_phoff) + ")",
                eh_.e_phoff, table);
    std::vector<Phdr> ph(eh_.e_phnum);
    read(ph.data(), table, eh_.e_phoff);
    size_t loads = 0;
    const Phdr* dynamic = nullptr;
    size_t dynamic_at = 0;
    for (size_t i = 0; i < ph.size(); ++i) {
      const Phdr& p = ph[i];
      // A loaded segment is mapped from p_offset even when it has no file bytes;
      // any other segment is read from the file only where it has some.
      if ((p.p_type == PT_LOAD || p.p_filesz > 0) && !within(p.p_offset, p.p_filesz, size_))
        truncated("its segment " + std::to_string(i) + " (" + segment_name(p.p_type) + ", " +
                      std::to_string(p.p_filesz) + " bytes from byte " + std::to_string(p.p_offset) + ")",
                  p.p_offset, p.p_filesz);
      if (p.p_type == PT_LOAD) ++loads;
      if (p.p_type == PT_DYNAMIC && !dynamic) {
        dynamic = &p;
        dynamic_at = i;
      }
    }
    if (loads == 0) fail("has no loadable segment (PT_LOAD)");
    if (!dynamic) fail("has no dynamic section (PT_DYNAMIC): not a shared object");
    // The loader reads the dynamic section where it is mapped: it must lie in
    // the file-backed bytes of a loaded segment.
    for (const Phdr& p : ph)
      if (p.p_type == PT_LOAD && dynamic->p_vaddr >= p.p_vaddr &&
          within(dynamic->p_vaddr - p.p_vaddr, dynamic->p_filesz, p.p_filesz))
        return;
    fail("is damaged: its dynamic section (segment " + std::to_string(dynamic_at) + ", " +
         std::to_string(dynamic->p_filesz) + " bytes at address " + std::to_string(dynamic->p_vaddr) +
         ") lies outside the file bytes of every loaded segment");
  }

  void section_headers() {
    if (eh_.e_shoff == 0) return;  // none (the loader does not need them)
    if (eh_.e_shentsize != sizeof(Shdr))
      fail("has section headers of " + std::to_string(eh_.e_shentsize) + " bytes (e_shentsize), not " +
           std::to_string(sizeof(Shdr)));
    uint64_t count = eh_.e_shnum;
    if (count == 0) {  // more than SHN_LORESERVE sections: the count is section 0's sh_size
      if (!within(eh_.e_shoff, sizeof(Shdr), size_))
        truncated("its section header table (from byte " + std::to_string(eh_.e_shoff) + ")", eh_.e_shoff,
                  sizeof(Shdr));
      Shdr first{};
      read(&first, sizeof first, eh_.e_shoff);
      count = first.sh_size;
    }
    const std::string what = "its section header table (" + std::to_string(count) + " entries from byte " +
                             std::to_string(eh_.e_shoff) + ")";
    if (count > UINT64_MAX / sizeof(Shdr)) fail("is damaged: " + what + " ends past byte 2^64");
    if (!within(eh_.e_shoff, count * sizeof(Shdr), size_)) truncated(what, eh_.e_shoff, count * sizeof(Shdr));
  }

  std::string path_;
  smp::input::File file_;
  uint64_t size_;
  Ehdr eh_{};
};

}  // namespace

std::string host_machine_name() { return machine_name(kMachine); }

void check_elf_file(const std::string& path) { Check(path).run(); }

}  // namespace smp::plugin
