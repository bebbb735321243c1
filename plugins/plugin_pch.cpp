// The donor of the precompiled header in-tree plugins share (smp_plugin_pch in
// the top-level CMakeLists.txt): no code of its own.
