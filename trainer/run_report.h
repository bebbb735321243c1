// The run report: a self-contained HTML page (inline SVG charts, no scripts,
// nothing fetched) drawn from a run's summary.json: loss and validation loss
// per step, throughput and MFU per step, memory per rank by category, time per
// phase per rank, and bytes per communicator group; an elastic job's
// re-formations (summary.json's elastic) as rows and as lines on the loss
// curve at the step each resumed from. Written to
// <run.dir>/report.html at the end of a run and by `smp-report <run.dir>`.
#pragma once

#include <smp/peak_flops.h>

#include <nlohmann/json.hpp>

#include <string>

namespace smp {

std::string render_report(const nlohmann::json& summary);

// summary.json's peak and MFU fields, from rank 0's peaks and the job's model
// FLOP/s: device_name; peak_flops_per_rank (the measured GEMM peak, as
// before), peak_flops_datasheet_per_rank (null without a datasheet figure),
// peak_flops_dtype, peak_basis (PeakFlops::basis); mfu against the datasheet
// peak where known (else the measured one) and mfu_measured_peak against the
// measured one, both over world ranks.
void add_mfu_fields(nlohmann::json& summary, const PeakFlops& peaks, double flops_per_s, int world);
// The per-rank peak a summary's mfu is stated against: the datasheet's where
// it has one, else the measured peak_flops_per_rank (0 when neither).
double mfu_peak_per_rank(const nlohmann::json& summary);
// Writes <run_dir>/report.html from the summary, atomically (base/atomic_file.h:
// a full disk leaves no half page); returns the path.
std::string write_report(const std::string& run_dir, const nlohmann::json& summary);
// Writes <run_dir>/summary.json atomically, a previous one kept as
// summary.json.prev; on failure (a full disk) the old summary.json stays
// whole and the smp::Error names summary.json.
void write_summary_file(const std::string& run_dir, const nlohmann::json& summary);

}  // namespace smp
