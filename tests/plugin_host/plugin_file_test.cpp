// A plugin file is checked before dlopen (core/src/plugin/elf_check.cpp):
// damaged copies of real built plugins (truncated at 4 KiB, truncated in the
// middle of a segment, another class, byte order, machine or type, hostile
// header fields), a text file, an empty file and a named pipe are each refused
// with an smp::Error naming the file, without a crash or a hang, and the
// registry still loads the real plugin afterwards.
//
// Without the check, the truncated copies are SIGBUS inside dlopen (the loader
// maps the segments the headers claim, past the file's end).
#include <smp/error.h>
#include <smp/plugin_registry.h>

#include "plugin/elf_check.h"

#include <gtest/gtest.h>

#include <elf.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

// Boost, not std::filesystem: pip torch's libtorch.so exports its own copy of
// std::filesystem, which interposes on libstdc++'s.
#include <boost/filesystem.hpp>

namespace {

namespace fs = boost::filesystem;

std::string plugin(const std::string& name) { return std::string(SMP_TEST_PLUGIN_DIR) + "/" + name + ".so"; }

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << path << " was not built";
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// A private folder (canonical: the registry names a plugin by its canonical path).
class PluginFile : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::canonical(fs::temp_directory_path()) / fs::unique_path("smp-plugin-file-%%%%-%%%%");
    fs::create_directories(dir_);
  }
  void TearDown() override {
    boost::system::error_code ec;
    fs::remove_all(dir_, ec);
  }

  std::string write(const std::string& name, const std::string& bytes) {
    const std::string path = (dir_ / name).string();
    std::ofstream out(path, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    EXPECT_TRUE(out.good()) << path;
    return path;
  }

  // Loads `path`, expects an smp::Error naming it and holding every needle,
  // then the registry unchanged and the real plugin still loading into it.
  std::string expect_refused(const std::string& path, const std::vector<std::string>& needles) {
    smp::PluginRegistry reg;
    std::string message;
    alarm(60);  // a check that blocked (a named pipe) fails the test instead of hanging it
    try {
      reg.load(path);
      ADD_FAILURE() << path << " was loaded; it should have been refused";
    } catch (const smp::Error& e) {
      message = e.what();
    } catch (const std::exception& e) {
      ADD_FAILURE() << path << ": refused with a " << typeid(e).name() << " instead of smp::Error: " << e.what();
    }
    alarm(0);
    EXPECT_NE(message.find(path), std::string::npos) << "message does not name the file: " << message;
    for (const auto& n : needles) EXPECT_NE(message.find(n), std::string::npos) << "'" << n << "' missing from: " << message;
    EXPECT_TRUE(reg.plugins().empty()) << "a refused plugin was registered";
    EXPECT_EQ(reg.load(plugin("good_c_plugin")).name, "good_c_plugin");
    return message;
  }

  fs::path dir_;
};

// The real file's headers, to damage a copy where it matters.
struct Elf {
  std::string bytes;
  Elf64_Ehdr eh{};
  std::vector<Elf64_Phdr> ph;
  explicit Elf(const std::string& b) : bytes(b) {
    EXPECT_GE(bytes.size(), sizeof eh);
    std::memcpy(&eh, bytes.data(), sizeof eh);
    ph.resize(eh.e_phnum);
    for (size_t i = 0; i < ph.size(); ++i)
      std::memcpy(&ph[i], bytes.data() + eh.e_phoff + i * sizeof(Elf64_Phdr), sizeof(Elf64_Phdr));
  }
  template <class T>
  std::string with(size_t offset, T value) const {
    std::string b = bytes;
    std::memcpy(b.data() + offset, &value, sizeof value);
    return b;
  }
};

static_assert(sizeof(void*) == 8, "these tests patch 64-bit ELF headers");

TEST_F(PluginFile, TheRealPluginsPassTheCheckAndLoad) {
  for (const char* name : {"good_c_plugin", "example_scale_intree"}) {
    EXPECT_NO_THROW(smp::plugin::check_elf_file(plugin(name))) << name;
    smp::PluginRegistry reg;
    EXPECT_EQ(reg.load(plugin(name)).path, fs::canonical(plugin(name)).string());
  }
  // And a copy of one, in a folder of its own.
  const std::string copy = write("copy.so", read_all(plugin("example_scale_intree")));
  smp::PluginRegistry reg;
  EXPECT_NO_THROW(reg.load(copy));
}

// The case: the first 4 KiB of a plugin was SIGBUS inside dlopen.
TEST_F(PluginFile, TheFirst4KiBOfAPluginIsRefusedAsTruncated) {
  for (const char* name : {"good_c_plugin", "example_scale_intree"}) {
    const std::string real = read_all(plugin(name));
    ASSERT_GT(real.size(), 4096u) << name;
    const std::string path = write(std::string(name) + "-4k.so", real.substr(0, 4096));
    expect_refused(path, {"is truncated", "ends at byte", "the file has 4096"});
  }
}

TEST_F(PluginFile, ACopyTruncatedInTheMiddleOfASegmentIsRefusedNamingIt) {
  const Elf real(read_all(plugin("example_scale_intree")));
  // The loaded segment with the most file bytes, cut in its middle.
  size_t at = real.ph.size();
  for (size_t i = 0; i < real.ph.size(); ++i)
    if (real.ph[i].p_type == PT_LOAD && (at == real.ph.size() || real.ph[i].p_filesz > real.ph[at].p_filesz)) at = i;
  ASSERT_LT(at, real.ph.size());
  const Elf64_Phdr& seg = real.ph[at];
  const size_t cut = seg.p_offset + seg.p_filesz / 2;
  ASSERT_GT(cut, 8192u) << "want a cut past the first pages";
  const std::string path = write("middle.so", real.bytes.substr(0, cut));
  // An earlier segment may end past the cut as well (they can overlap); the
  // first one that does is named.
  size_t first = at;
  for (size_t i = 0; i < at; ++i)
    if ((real.ph[i].p_type == PT_LOAD || real.ph[i].p_filesz > 0) && real.ph[i].p_offset + real.ph[i].p_filesz > cut) {
      first = i;
      break;
    }
  expect_refused(path, {"is truncated: its segment " + std::to_string(first) + " (",
                        "ends at byte " + std::to_string(real.ph[first].p_offset + real.ph[first].p_filesz),
                        "the file has " + std::to_string(cut)});
}

TEST_F(PluginFile, ACopyMissingOnlyItsSectionHeadersIsRefused) {
  const Elf real(read_all(plugin("good_c_plugin")));
  ASSERT_NE(real.eh.e_shoff, 0u);
  const size_t cut = real.bytes.size() - 1;
  expect_refused(write("no-sections.so", real.bytes.substr(0, cut)),
                 {"is truncated: its section header table", "the file has " + std::to_string(cut)});
}

TEST_F(PluginFile, ATextFileAnEmptyFileAndAShortFileAreRefused) {
  expect_refused(write("text.so", "#!/bin/sh\necho not a plugin\n"), {"does not start with the ELF magic"});
  expect_refused(write("empty.so", ""), {"is empty"});
  expect_refused(write("short.so", "\x7f" "EL"), {"ELF magic"});
  expect_refused(write("header-only.so", read_all(plugin("good_c_plugin")).substr(0, 40)),
                 {"is truncated: an ELF header has 64 bytes, the file has 40"});
}

TEST_F(PluginFile, AnotherClassByteOrderMachineOrTypeIsRefused) {
  const Elf real(read_all(plugin("good_c_plugin")));
  expect_refused(write("elf32.so", real.with<uint8_t>(EI_CLASS, ELFCLASS32)), {"is a 32-bit ELF file", "64-bit"});
  expect_refused(write("class9.so", real.with<uint8_t>(EI_CLASS, 9)), {"ELF class 9"});
  expect_refused(write("big-endian.so", real.with<uint8_t>(EI_DATA, ELFDATA2MSB)), {"is big-endian", "little-endian"});
  expect_refused(write("version.so", real.with<uint8_t>(EI_VERSION, 2)), {"ELF version 2"});
  const uint16_t other = real.eh.e_machine == EM_AARCH64 ? EM_X86_64 : EM_AARCH64;
  const std::string m = expect_refused(write("arm.so", real.with<uint16_t>(offsetof(Elf64_Ehdr, e_machine), other)),
                                       {"is built for", "this smp runs on " + smp::plugin::host_machine_name()});
  EXPECT_NE(m.find(other == EM_AARCH64 ? "AArch64" : "x86-64"), std::string::npos) << m;
  expect_refused(write("exec.so", real.with<uint16_t>(offsetof(Elf64_Ehdr, e_type), ET_EXEC)), {"ET_EXEC", "not ET_DYN"});
  expect_refused(write("rel.so", real.with<uint16_t>(offsetof(Elf64_Ehdr, e_type), ET_REL)), {"ET_REL"});
}

TEST_F(PluginFile, HostileHeaderFieldsAreRefusedWithoutOverflow) {
  const Elf real(read_all(plugin("good_c_plugin")));
  const size_t phoff = offsetof(Elf64_Ehdr, e_phoff), phnum = offsetof(Elf64_Ehdr, e_phnum);
  expect_refused(write("phoff.so", real.with<uint64_t>(phoff, ~uint64_t{0} - 8)),
                 {"is truncated: its program header table", "ends at byte 184467440737095"});
  expect_refused(write("phnum.so", real.with<uint16_t>(phnum, 0xffff)), {"65535 program headers"});
  expect_refused(write("phnum0.so", real.with<uint16_t>(phnum, 0)), {"no program headers"});
  expect_refused(write("phentsize.so", real.with<uint16_t>(offsetof(Elf64_Ehdr, e_phentsize), 32)),
                 {"program headers of 32 bytes"});
  // Segment 0's offset and size past 2^64 together.
  const size_t seg0 = real.eh.e_phoff;
  expect_refused(write("p_offset.so", real.with<uint64_t>(seg0 + offsetof(Elf64_Phdr, p_offset), ~uint64_t{0})),
                 {"its segment 0 (", "ends at byte 184467440737095"});
  expect_refused(write("p_filesz.so", real.with<uint64_t>(seg0 + offsetof(Elf64_Phdr, p_filesz), uint64_t{1} << 40)),
                 {"is truncated: its segment 0 (", "ends at byte"});
  expect_refused(write("shoff.so", real.with<uint64_t>(offsetof(Elf64_Ehdr, e_shoff), ~uint64_t{0})),
                 {"its section header table"});
  expect_refused(write("shentsize.so", real.with<uint16_t>(offsetof(Elf64_Ehdr, e_shentsize), 1)),
                 {"section headers of 1 bytes"});
  // The dynamic section moved outside every loaded segment.
  for (size_t i = 0; i < real.ph.size(); ++i)
    if (real.ph[i].p_type == PT_DYNAMIC)
      expect_refused(write("dynamic.so", real.with<uint64_t>(seg0 + i * sizeof(Elf64_Phdr) + offsetof(Elf64_Phdr, p_vaddr),
                                                             uint64_t{1} << 46)),
                     {"its dynamic section (segment " + std::to_string(i)});
}

TEST_F(PluginFile, ANamedPipeIsRefusedWithoutBlocking) {
  const std::string path = (dir_ / "pipe.so").string();
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
  expect_refused(path, {"a named pipe", "not a regular file"});
}

TEST_F(PluginFile, AFolderIsRefused) {
  fs::create_directories(dir_ / "folder.so");
  expect_refused((dir_ / "folder.so").string(), {"a folder"});
}

}  // namespace
