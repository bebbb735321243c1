# smp_add_plugin(<target> SOURCES ... [OUTPUT_DIRECTORY <dir>] [NO_INSTALL]):
# a plugin shared object built the way the core expects: hidden visibility (only
# smp_plugin_entry is exported), C++17, linked to LibTorch and the SDK, never to
# libsmp_core. The file is named <target>.so (no "lib" prefix), so the core
# finds it by name ("<target>" or "<target>.so").
#
# Inside smp's own build (SMP_IN_TREE) a plugin also gets an install rule into
# ${SMP_PLUGIN_SUBDIR}, unless NO_INSTALL is given or OUTPUT_DIRECTORY sends it
# somewhere else (test-only plugins). A third-party project using
# find_package(smp) gets no install rule unless it asks for one:
#
# smp_install_plugin(<target> [DESTINATION <dir>]): installs the plugin into
# <dir>, by default ${CMAKE_INSTALL_LIBDIR}/smp/plugins of the project's own
# prefix (the folder a core installed there searches). Once per target.

# We are in smp's own build when the SDK target itself exists; a third-party
# project only sees the imported smp::sdk from smpTargets.cmake.
if(NOT DEFINED SMP_IN_TREE)
  if(TARGET smp_sdk)
    set(SMP_IN_TREE ON)
  else()
    set(SMP_IN_TREE OFF)
  endif()
endif()

function(smp_add_plugin target)
  cmake_parse_arguments(ARG "NO_INSTALL" "OUTPUT_DIRECTORY" "SOURCES" ${ARGN})
  if(NOT ARG_SOURCES)
    message(FATAL_ERROR "smp_add_plugin(${target}): no SOURCES given")
  endif()
  add_library(${target} MODULE ${ARG_SOURCES})
  target_link_libraries(${target} PRIVATE smp::sdk ${TORCH_LIBRARIES})
  target_compile_features(${target} PRIVATE cxx_std_17)
  set_target_properties(${target} PROPERTIES
    PREFIX ""
    C_VISIBILITY_PRESET hidden
    CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON)
  if(ARG_OUTPUT_DIRECTORY)
    set_target_properties(${target} PROPERTIES LIBRARY_OUTPUT_DIRECTORY ${ARG_OUTPUT_DIRECTORY})
  elseif(DEFINED SMP_PLUGIN_OUTPUT_DIR)
    set_target_properties(${target} PROPERTIES LIBRARY_OUTPUT_DIRECTORY ${SMP_PLUGIN_OUTPUT_DIR})
  endif()
  if(SMP_IN_TREE AND NOT ARG_NO_INSTALL AND NOT ARG_OUTPUT_DIRECTORY)
    smp_install_plugin(${target})
  endif()
  # Inside smp's build every plugin reuses one precompiled ATen (see
  # smp_plugin_pch in the top-level CMakeLists.txt); a source with options of
  # its own opts out (SKIP_PRECOMPILE_HEADERS), as GCC would refuse the PCH.
  if(SMP_IN_TREE AND TARGET smp_plugin_pch)
    target_precompile_headers(${target} REUSE_FROM smp_plugin_pch)
  endif()
endfunction()

function(smp_install_plugin target)
  cmake_parse_arguments(ARG "" "DESTINATION" "" ${ARGN})
  get_target_property(done ${target} SMP_PLUGIN_INSTALLED)
  if(done)
    return()
  endif()
  set(dest ${ARG_DESTINATION})
  if(NOT dest)
    include(GNUInstallDirs)
    set(dest ${CMAKE_INSTALL_LIBDIR}/smp/plugins)
  endif()
  install(TARGETS ${target} LIBRARY DESTINATION ${dest})
  set_target_properties(${target} PROPERTIES SMP_PLUGIN_INSTALLED ON)
endfunction()
