# Fails when a file of core/src includes a header of a higher layer, or a public
# header (core/include/smp) includes an internal one. A CMake script, not Python:
# the CI machine may have no python3.
#   cmake -DSRC_DIR=<core/src> -DINCLUDE_DIR=<core/include/smp> [-DROOT=<repo>] -P check_layers.cmake

cmake_minimum_required(VERSION 3.25)
include(${CMAKE_CURRENT_LIST_DIR}/lines_of.cmake)

# core/src's folders, lowest first: a folder includes "G/..." only for G at its
# own position or below, so lower layers build and test without higher ones.
set(SMP_LAYERS base mesh schedule comm plugin graph memory optim checkpoint pipeline runtime train)

foreach(dir SRC_DIR INCLUDE_DIR)
  if(NOT IS_DIRECTORY "${${dir}}")
    message(FATAL_ERROR "layering: ${dir}='${${dir}}' is not a directory")
  endif()
  get_filename_component(${dir} "${${dir}}" ABSOLUTE)
endforeach()
# Paths are printed relative to ROOT (default: two above SRC_DIR, the repository for core/src).
if(NOT ROOT)
  set(ROOT "${SRC_DIR}/../..")
endif()
get_filename_component(ROOT "${ROOT}" ABSOLUTE)
file(RELATIVE_PATH src_rel "${ROOT}" "${SRC_DIR}")
set(violations 0)

# A folder with no layer fails even while empty: adding one forces a decision.
file(GLOB entries LIST_DIRECTORIES true "${SRC_DIR}/*")
foreach(entry ${entries})
  get_filename_component(name "${entry}" NAME)
  file(RELATIVE_PATH rel "${ROOT}" "${entry}")
  if(IS_DIRECTORY "${entry}" AND NOT name IN_LIST SMP_LAYERS)
    message("${rel}/: folder '${name}' has no layer; add it to SMP_LAYERS in tests/layering/check_layers.cmake")
    math(EXPR violations "${violations} + 1")
  elseif(NOT IS_DIRECTORY "${entry}" AND name MATCHES "\\.(h|cpp)$")
    message("${rel}: a file directly in ${src_rel} has no layer; move it into a layered folder")
    math(EXPR violations "${violations} + 1")
  endif()
endforeach()

# Checks every `#include "G/..."` line of one file (a line comment before the
# '#' hides it). layer < 0: a public header, which may include no internal header.
function(check_file path folder layer)
  smp_lines_of("${path}" lines)
  file(RELATIVE_PATH rel "${ROOT}" "${path}")
  set(n 0)
  set(count ${violations})
  list(FIND SMP_LAYERS runtime runtime_layer)
  foreach(line IN LISTS lines)
    math(EXPR n "${n} + 1")
    # The composition root's public header (<smp/runtime.h>, or <smp/smp.h>
    # that includes it) is for runtime/ and above: below, the value types
    # (<smp/state_types.h>) are what a part needs.
    if(layer GREATER_EQUAL 0 AND layer LESS runtime_layer AND
       line MATCHES "^[ \t]*#[ \t]*include[ \t]*<smp/(runtime|smp)\\.h>")
      message("${rel}:${n}: ${folder} (layer ${layer}) includes the composition root <smp/${CMAKE_MATCH_1}.h>; include <smp/state_types.h> for its value types")
      math(EXPR count "${count} + 1")
      continue()
    endif()
    if(NOT line MATCHES "^[ \t]*#[ \t]*include[ \t]*\"(([^\"/]+)/[^\"]*)\"")
      continue()
    endif()
    set(header "${CMAKE_MATCH_1}")
    set(to "${CMAKE_MATCH_2}")
    list(FIND SMP_LAYERS "${to}" to_layer)
    if(layer LESS 0)
      message("${rel}:${n}: public header includes internal \"${header}\"; public headers include only <smp/...>")
      math(EXPR count "${count} + 1")
    elseif(to_layer GREATER layer)
      message("${rel}:${n}: ${folder} (layer ${layer}) includes \"${header}\" of ${to} (layer ${to_layer}), a higher layer")
      math(EXPR count "${count} + 1")
    endif()
  endforeach()
  set(violations ${count} PARENT_SCOPE)
endfunction()

# Unlayered folders were reported above; their files are not checked further.
file(GLOB_RECURSE sources "${SRC_DIR}/*.h" "${SRC_DIR}/*.cpp")
foreach(path ${sources})
  file(RELATIVE_PATH sub "${SRC_DIR}" "${path}")
  string(REGEX MATCH "^[^/]+/" folder "${sub}")
  string(REPLACE "/" "" folder "${folder}")
  list(FIND SMP_LAYERS "${folder}" layer)
  if(layer GREATER_EQUAL 0)
    check_file("${path}" ${folder} ${layer})
  endif()
endforeach()
file(GLOB_RECURSE public "${INCLUDE_DIR}/*.h")
foreach(path ${public})
  check_file("${path}" smp -1)
endforeach()

list(LENGTH sources nsources)
list(LENGTH public npublic)
math(EXPR nfiles "${nsources} + ${npublic}")
if(violations GREATER 0)
  message(FATAL_ERROR "layering: ${violations} violation(s) in ${nfiles} files")
endif()
message("layering: ${nfiles} files, no back-include")
