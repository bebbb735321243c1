// Moved to <smp/common/splitmix.hpp>, the code the core and plugins share; this
// path stays for plugins and programs that include it.
#pragma once

#include <smp/common/splitmix.hpp>
