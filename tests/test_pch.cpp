// The donor of the precompiled header the test programs share (smp_test_pch in
// tests/CMakeLists.txt): no code of its own.
