// The run report: a self-contained HTML page (inline SVG charts, no scripts,
// nothing fetched) drawn from a run's summary.json: loss and validation loss
// per step, throughput and MFU per step, memory per rank by category, time per
// phase per rank, and bytes per communicator group. Written to
// <run.dir>/report.html at the end of a run and by `smp-report <run.dir>`.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

namespace smp {

std::string render_report(const nlohmann::json& summary);
// Writes <run_dir>/report.html from the summary, atomically (base/atomic_file.h:
// a full disk leaves no half page); returns the path.
std::string write_report(const std::string& run_dir, const nlohmann::json& summary);
// Writes <run_dir>/summary.json atomically, a previous one kept as
// summary.json.prev; on failure (a full disk) the old summary.json stays
// whole and the smp::Error names summary.json.
void write_summary_file(const std::string& run_dir, const nlohmann::json& summary);

}  // namespace smp
