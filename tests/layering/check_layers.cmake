# Fails when a file of core/src includes a header of a higher layer, or a public
# header (core/include/smp) includes an internal one. A CMake script, not Python:
# the CI machine may have no python3.
#   cmake -DSRC_DIR=<core/src> -DINCLUDE_DIR=<core/include/smp> [-DROOT=<repo>] -P check_layers.cmake

cmake_minimum_required(VERSION 3.25)
include(${CMAKE_CURRENT_LIST_DIR}/lines_of.cmake)

# core/src's folders, lowest first: a folder includes "G/..." only for G at its
# own position or below, so lower layers build and test without higher ones.
set(SMP_LAYERS base mesh schedule comm plugin graph memory optim checkpoint pipeline runtime)

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

# Which layer owns each public header of core/include/smp: value types any part
# may use belong to base; an API belongs to the layer that implements it;
# "umbrella" headers (everything at once, for programs) to no layer of the core.
# A public header not listed fails, as a folder without a layer does.
# -DEXTRA_OWNERS=name.h=layer,... adds a fixture's headers.
set(SMP_PUBLIC_OWNERS
  error.h=base logging.h=base config.h=base config_keys.h=base job_config.h=base process_env.h=base
  tracing.h=base peak_flops.h=base batch.h=base state_types.h=base model_graph.h=base
  axis_role.h=base axis_placement.h=base mesh.h=mesh mesh_spec.h=mesh
  plugin_source.h=plugin plugin_registry.h=plugin
  stage_plan.h=graph
  runtime.h=runtime checkpointer.h=runtime generation.h=runtime options.h=runtime
  smp.h=umbrella training.h=umbrella
  )
if(EXTRA_OWNERS)
  string(REPLACE "," ";" extra_owners "${EXTRA_OWNERS}")
  list(APPEND SMP_PUBLIC_OWNERS ${extra_owners})
endif()
list(LENGTH SMP_LAYERS umbrella_layer)  # above every layer of the core

# The layer owning public header <smp/name>; -1 when none is declared.
function(public_owner name out)
  set(layer -1)
  foreach(entry ${SMP_PUBLIC_OWNERS})
    if(entry MATCHES "^([^=]+)=(.+)$" AND CMAKE_MATCH_1 STREQUAL name)
      if(CMAKE_MATCH_2 STREQUAL "umbrella")
        set(layer ${umbrella_layer})
      else()
        list(FIND SMP_LAYERS "${CMAKE_MATCH_2}" layer)
      endif()
    endif()
  endforeach()
  set(${out} ${layer} PARENT_SCOPE)
endfunction()

function(layer_name layer out)
  if(layer EQUAL umbrella_layer)
    set(${out} "the umbrella" PARENT_SCOPE)
  else()
    list(GET SMP_LAYERS ${layer} n)
    set(${out} "${n} (layer ${layer})" PARENT_SCOPE)
  endif()
endfunction()

# Checks every include line of one file, quoted ("G/...") and angled (<smp/...>);
# a line comment before the '#' hides it. folder: the file's layer folder, or
# "public" for a public header owned by `layer` (umbrella headers may include
# every public header, and no internal one).
#  - "G/..." only for G at the file's layer or below; never from a public header;
#  - <smp/abi.h>, the C plugin ABI, only in plugin/ (the one door to plugins);
#  - <smp/sdk/...> never: code the core shares with plugins is in <smp/common/...>;
#  - <smp/name.h> only for a public header owned at the file's layer or below.
function(check_file path folder layer)
  smp_lines_of("${path}" lines)
  file(RELATIVE_PATH rel "${ROOT}" "${path}")
  set(n 0)
  set(count ${violations})
  if(folder STREQUAL "public")
    layer_name(${layer} who)
    set(who "public header of ${who}")
  else()
    set(who "${folder} (layer ${layer})")
  endif()
  foreach(line IN LISTS lines)
    math(EXPR n "${n} + 1")
    if(line MATCHES "^[ \t]*#[ \t]*include[ \t]*\"(([^\"/]+)/[^\"]*)\"")
      set(header "${CMAKE_MATCH_1}")
      set(to "${CMAKE_MATCH_2}")
      list(FIND SMP_LAYERS "${to}" to_layer)
      if(folder STREQUAL "public")
        message("${rel}:${n}: public header includes internal \"${header}\"; public headers include only <smp/...>")
        math(EXPR count "${count} + 1")
      elseif(to_layer GREATER layer)
        message("${rel}:${n}: ${who} includes \"${header}\" of ${to} (layer ${to_layer}), a higher layer")
        math(EXPR count "${count} + 1")
      endif()
    elseif(line MATCHES "^[ \t]*#[ \t]*include[ \t]*<smp/([^>]*)>")
      set(header "${CMAKE_MATCH_1}")
      if(header STREQUAL "abi.h")
        if(NOT folder STREQUAL "plugin")
          message("${rel}:${n}: ${who} includes <smp/abi.h>; only plugin/ speaks the C ABI (use its C++ instances)")
          math(EXPR count "${count} + 1")
        endif()
      elseif(header MATCHES "^sdk/")
        message("${rel}:${n}: ${who} includes the plugin SDK's <smp/${header}>; code shared with plugins is in <smp/common/...>")
        math(EXPR count "${count} + 1")
      elseif(header MATCHES "^[^/]+\\.h$")
        public_owner("${header}" to_layer)
        if(to_layer LESS 0)
          message("${rel}:${n}: ${who} includes <smp/${header}>, a public header with no owner layer; add it to SMP_PUBLIC_OWNERS in tests/layering/check_layers.cmake")
          math(EXPR count "${count} + 1")
        elseif(to_layer GREATER layer)
          layer_name(${to_layer} owner)
          message("${rel}:${n}: ${who} includes <smp/${header}> of ${owner}, a higher layer")
          math(EXPR count "${count} + 1")
        endif()
      endif()
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
  get_filename_component(name "${path}" NAME)
  public_owner("${name}" layer)
  if(layer LESS 0)
    file(RELATIVE_PATH rel "${ROOT}" "${path}")
    message("${rel}: public header with no owner layer; add it to SMP_PUBLIC_OWNERS in tests/layering/check_layers.cmake")
    math(EXPR violations "${violations} + 1")
  else()
    check_file("${path}" public ${layer})
  endif()
endforeach()

list(LENGTH sources nsources)
list(LENGTH public npublic)
math(EXPR nfiles "${nsources} + ${npublic}")
if(violations GREATER 0)
  message(FATAL_ERROR "layering: ${violations} violation(s) in ${nfiles} files")
endif()
message("layering: ${nfiles} files, no back-include")
