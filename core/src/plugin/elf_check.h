// A plugin file checked before dlopen. The dynamic loader maps a shared
// object's segments as its program headers describe them, past the file's end
// if they say so: touching such a page is SIGBUS inside dlopen (the first 4 KiB
// of a real plugin is enough). So before a plugin is loaded its headers are
// read, bounded, and checked against the file: an ELF shared object (ET_DYN)
// of this build's class, byte order and machine; its program header table,
// every segment's bytes and its section header table inside the file, with no
// arithmetic overflow. Nothing but the headers is read; nothing is mapped.
#pragma once

#include <string>

namespace smp::plugin {

// Throws smp::Error naming `path` and what is wrong: not a regular file (a
// named pipe is refused without blocking), not ELF, another class, byte order
// or machine, not a shared object, or a table or segment past the file's end
// ("... is truncated: its segment 2 ends at byte N, the file has M").
void check_elf_file(const std::string& path);

// The machine smp was built for, as ELF names it ("x86-64 (62)").
std::string host_machine_name();

}  // namespace smp::plugin
