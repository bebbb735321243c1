// Moved to <smp/common/toml_nesting.hpp>, the code the core and plugins share; this
// path stays for plugins and programs that include it.
#pragma once

#include <smp/common/toml_nesting.hpp>
