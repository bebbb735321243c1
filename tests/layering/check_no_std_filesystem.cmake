# No C++ source of smp uses std::filesystem: pip torch's libtorch.so exports
# its own copy of it, which interposes on libstdc++'s, and remove_all crashed
# through it (CI leg 2, pip torch 2.11). Boost.Filesystem or POSIX instead.
# Comments do not count. -DROOTS=<dir,dir...>: where to look (commas: a ';'
# does not survive ctest's command lines, which left only the first root checked).
# Exit non-zero naming each file:line that does.
set(found 0)
set(files 0)
string(REPLACE "," ";" ROOTS "${ROOTS}")
foreach(root ${ROOTS})
  file(GLOB_RECURSE sources "${root}/*.cpp" "${root}/*.h" "${root}/*.hpp" "${root}/*.cc")
  foreach(src ${sources})
    file(RELATIVE_PATH rel "${root}" "${src}")
    if(rel MATCHES "(^|/)fixture/")  # the checks' own fixtures (this one's included)
      continue()
    endif()
    math(EXPR files "${files} + 1")
    file(STRINGS "${src}" lines)
    set(n 0)
    foreach(line IN LISTS lines)
      math(EXPR n "${n} + 1")
      string(REGEX REPLACE "//.*$" "" code "${line}")
      if(code MATCHES "std::filesystem|#include <filesystem>|std::experimental::filesystem")
        message("${src}:${n}: uses std::filesystem (pip torch's libtorch.so interposes on it): use boost::filesystem or POSIX")
        math(EXPR found "${found} + 1")
      endif()
    endforeach()
  endforeach()
endforeach()
if(found GREATER 0)
  message(FATAL_ERROR "no-std-filesystem: ${found} use(s) in ${files} files")
endif()
message("no-std-filesystem: ${files} files, none uses std::filesystem")
