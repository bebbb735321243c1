// A checkpoint's manifest checked against what it describes, before anything
// is loaded: a manifest is a file anyone can edit or damage, and every load
// trusts its offsets, shapes and file names.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <map>
#include <string>

namespace smp {

// `name` (a shard in the manifest, or what `latest` names) as a path inside
// `folder`: a plain file or folder name, not absolute, no "..", no separator,
// and not a link to somewhere else. Throws smp::Error starting with `where`.
std::string path_inside(const std::string& folder, const std::string& name, const std::string& where);

// Throws smp::Error naming the manifest, the tensor or file and the field at
// the first claim that cannot hold: the files' names (path_inside), sizes and
// CRCs well formed and each listed once; every tensor's dtype known, its
// shape non-negative, each slice in a listed file with offsets and block
// inside the global shape, flat range and element count consistent with the
// block; the slices of a tensor neither overlapping nor leaving a gap (their
// boxes the same or disjoint, flat ranges of one box disjoint, all of them
// together exactly the tensor's elements); "step" a count.
void check_manifest(const std::string& folder, const nlohmann::json& manifest);

// A counter's value as a checkpoint holds it (train/step, optim/step,
// loss_scaler/{scale,good_steps,skipped}; other names pass), refused when no
// run writes it: a count that is negative, fractional or past 2^53 (a double
// holds it exactly), a loss scale that is not a positive finite number.
// Throws smp::Error starting with `where`.
void check_counter(const std::string& where, const std::string& name, double value);

// The counters a checkpoint holds, together (any subset): each as
// check_counter, train/step equal to the manifest's "step", and no more
// optimizer updates, skipped or good loss-scaler steps (nor updates and
// skipped steps together) than steps taken.
void check_counters(const std::string& where, const std::map<std::string, double>& values,
                    const nlohmann::json& manifest);

}  // namespace smp
