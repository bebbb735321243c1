// The keys only smp::run_training acts on. A program driving a Runtime itself
// gets a refusal naming the key when one of them asks for something, rather
// than a key accepted and then ignored.
#pragma once

#include <smp/config.h>
#include <smp/job_config.h>

namespace smp {

// Throws smp::Error naming the first such key, where it was given, and what
// a program does instead.
void refuse_loop_only_keys(const Config& config, const JobConfig& job);

}  // namespace smp
