// smp's public C++ API for programs that embed the core (link smp::core):
//
//   #include <smp/smp.h>
//   smp::PluginRegistry plugins;
//   plugins.load("nn");                      // by name or path
//   bool has = plugins.has_module_kind("linear");
//
// Everything here throws smp::Error with a message naming the file, key,
// plugin or rank at fault. The plugin ABI (smp/abi.h) is not part of it: a
// plugin, in a file or in the program, includes the SDK (smp/sdk/plugin.hpp).
#pragma once

#include <smp/checkpointer.h>
#include <smp/config.h>
#include <smp/error.h>
#include <smp/generation.h>
#include <smp/job_config.h>
#include <smp/logging.h>
#include <smp/mesh.h>
#include <smp/model_graph.h>
#include <smp/options.h>
#include <smp/plugin_registry.h>
#include <smp/process_env.h>
#include <smp/runtime.h>
#include <smp/stage_plan.h>
#include <smp/training.h>
