// Moved to <smp/common/input_file.hpp>, the code the core and plugins share; this
// path stays for plugins and programs that include it.
#pragma once

#include <smp/common/input_file.hpp>
