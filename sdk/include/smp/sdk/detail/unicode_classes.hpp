// Moved to <smp/data/detail/unicode_classes.hpp> (the SDK's data tooling); this
// path stays for code that includes it.
#pragma once

#include <smp/data/detail/unicode_classes.hpp>
