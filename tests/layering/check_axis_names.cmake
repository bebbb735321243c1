# Fails when the core decides something by an axis' name instead of its role
# (issue 55, "one mesh description"): outside the mesh description (mesh/,
# the public mesh*.h headers, base/axis_names.h) no file compares, switches on
# or looks up one of the core's axis names, nor names one of the Axis::PP-style
# constants (they are names too: ask DeviceMesh::axis_with(Role::Pipeline)).
# Log messages, config key names ("parallel.tp") and JSON keys are not
# decisions and do not count; comments do not count. A CMake script, no python.
#   cmake -DROOTS=<core/src,core/include/smp> [-DKNOWN=<file:count,...>] -P check_axis_names.cmake
# (comma-separated: a ';' does not survive ctest's command lines)
# KNOWN: files (relative to their root) allowed at most `count` hits for now,
# each the business of another part's owner; a hit beyond the count fails.
cmake_minimum_required(VERSION 3.25)
include(${CMAKE_CURRENT_LIST_DIR}/lines_of.cmake)

set(names "pp|dp|tp|ep|edp|cp|mp|world")
set(q "\"(${names})\"")
# Each pattern is one way a name decides: a comparison, a ternary choosing
# by or yielding a name, a lookup, a list of names walked, a named constant.
set(patterns
  "(==|!=)[ \t]*${q}"
  "${q}[ \t]*(==|!=)"
  "\\?[ \t]*${q}"
  "\\?[^:]*:[ \t]*${q}"
  "(compare|contains|count|find|insert)\\([^)]*${q}"
  "{[ \t]*${q}[ \t]*,[ \t]*${q}"
  "Axis::(PP|DP|TP|EP|EDP|MP|World)([^A-Za-z0-9_]|$)")

string(REPLACE "," ";" ROOTS "${ROOTS}")
string(REPLACE "," ";" KNOWN "${KNOWN}")
set(found 0)
set(files 0)
set(known_used "")
foreach(root ${ROOTS})
  get_filename_component(root "${root}" ABSOLUTE)
  file(GLOB_RECURSE sources "${root}/*.cpp" "${root}/*.h")
  foreach(src ${sources})
    file(RELATIVE_PATH rel "${root}" "${src}")
    # The mesh description itself: where names become roles.
    if(rel MATCHES "^mesh/|^mesh[^/]*\\.h$|^base/axis_names\\.h$")
      continue()
    endif()
    math(EXPR files "${files} + 1")
    smp_lines_of("${src}" lines)
    set(n 0)
    set(hits 0)
    set(where "")
    foreach(line IN LISTS lines)
      math(EXPR n "${n} + 1")
      string(REGEX REPLACE "//.*$" "" code "${line}")
      if(code MATCHES "^[ \t]*\\*")  # inside a block comment
        continue()
      endif()
      foreach(p IN LISTS patterns)
        if(code MATCHES "${p}")
          math(EXPR hits "${hits} + 1")
          string(STRIP "${code}" shown)
          list(APPEND where "${rel}:${n}: ${shown}")
          break()
        endif()
      endforeach()
    endforeach()
    if(hits EQUAL 0)
      continue()
    endif()
    set(allowed 0)
    foreach(k ${KNOWN})
      if(k MATCHES "^(.*):([0-9]+)$" AND CMAKE_MATCH_1 STREQUAL rel)
        set(allowed ${CMAKE_MATCH_2})
      endif()
    endforeach()
    if(hits GREATER allowed)
      foreach(w IN LISTS where)
        message("${w}: decides by an axis name: ask the mesh for a role (DeviceMesh::axis_with, axes_with, role_of)")
      endforeach()
      math(EXPR found "${found} + ${hits}")
    else()
      list(APPEND known_used "${rel} (${hits})")
    endif()
  endforeach()
endforeach()
if(found GREATER 0)
  message(FATAL_ERROR "axis-names: ${found} decision(s) by axis name in ${files} files")
endif()
list(LENGTH known_used k)
string(REPLACE ";" ", " known_text "${known_used}")
message("axis-names: ${files} files, no decision by axis name (${k} known files)")
if(k GREATER 0)
  message("axis-names: known, for their owners to move to roles: ${known_text}")
endif()
