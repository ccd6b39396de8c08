// ndtrain: the training report, one self-contained HTML page (inline SVG, no script, nothing
// fetched) with the run's whole story: charts of the loss (train, smoothed, validation), the
// learning rate, the gradient norm, tokens/s, MFU (or GFLOP/s per rank), memory, bytes
// communicated and step time; the layout and key config values; the samples.
//
//   train::RunHistory h;
//   h.steps.push_back(step_log);          // every step's StepLog (train/step_log.h)
//   h.val.push_back({step, val_loss});    // every evaluation
//   h.samples.push_back({step, text});    // every sample
//   train::write_report("out/fortunes/report.html", {title, layout, config, summary}, h);
//
// A chart whose metric the run does not have (no validation data, one rank and so no bytes
// communicated, no known peak for MFU) is left out, and a line says why.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "train/chart.h"
#include "train/config.h"
#include "train/step_log.h"

namespace ndt::train {

struct RunHistory {
  std::vector<StepLog> steps;                            // step is 0-based, charted as step + 1
  std::vector<std::pair<int64_t, double>> val;           // (steps done, validation loss)
  std::vector<std::pair<int64_t, std::string>> samples;  // (steps done, text)
};

struct ReportInfo {
  std::string title;
  std::string layout;                                       // the mesh, e.g. "dp_shard=2 x tp=2 (fsdp+tp)"
  std::vector<std::pair<std::string, std::string>> config;  // key, value
  std::vector<std::string> summary;                         // lines: final losses, speed
};

// The charts the run's metrics make, in page order, and a line for each one left out.
struct ReportCharts {
  std::vector<Chart> charts;
  std::vector<std::pair<std::string, std::string>> absent;  // metric, why
};
ReportCharts report_charts(const RunHistory& h);

// Debiased exponential moving average (TensorBoard's smoothing) of the values, weight `beta`.
std::vector<double> smoothed(const std::vector<double>& v, double beta = 0.9);
// The weight the loss chart smooths with: 0.6 for short runs up to 0.95 (a window of about
// a twentieth of the run).
double smoothing_weight(size_t steps);

// A resumed run's metrics file (log.metrics) up to the checkpoint it resumed from: its lines
// of steps 1..upto (steps done), in order, and what they hold for the report. Lines of later
// steps (the stopped run went on past its last checkpoint; they are trained again) and lines
// that do not parse (one cut short by a crash) are left out and counted in `dropped`. A file
// that is not there gives nothing.
struct EarlierMetrics {
  std::vector<std::string> lines;
  RunHistory history;
  int64_t dropped = 0;
};
EarlierMetrics read_earlier_metrics(const std::string& path, int64_t upto, int world_size, int64_t steps,
                                    bool spans_hosts);

// The table of a run's key values: the model, the device, the batch and the step's schedule,
// the optimizer (lr: after optim.lr_scaling), the data.
std::vector<std::pair<std::string, std::string>> report_config(const Config& c, const std::string& model,
                                                               const std::string& device,
                                                               int64_t tokens_per_step, double lr,
                                                               const std::string& step_schedule);

std::string report_html(const ReportInfo& info, const RunHistory& h);
void write_report(const std::string& path, const ReportInfo& info, const RunHistory& h);  // atomic

}  // namespace ndt::train
