#include "train/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tokenizer/json_checked.h"
#include "train/io/files.h"

namespace ndt::train {

double smoothing_weight(size_t steps) {
  return std::clamp(1.0 - 20.0 / static_cast<double>(std::max<size_t>(steps, 1)), 0.6, 0.95);
}

std::vector<double> smoothed(const std::vector<double>& v, double beta) {
  std::vector<double> o;
  double m = 0, w = 0;
  for (double x : v) {
    if (std::isfinite(x)) m = beta * m + (1 - beta) * x, w = beta * w + (1 - beta);
    o.push_back(w > 0 ? m / w : NAN);
  }
  return o;
}

namespace {
// (step + 1, f(step)) for every step: the x of metrics.jsonl's "step"
std::vector<std::pair<double, double>> per_step(const RunHistory& h,
                                                const std::function<double(const StepLog&)>& f) {
  std::vector<std::pair<double, double>> o;
  for (const StepLog& s : h.steps) o.push_back({static_cast<double>(s.step + 1), f(s)});
  return o;
}
bool any_nonzero(const RunHistory& h, const std::function<double(const StepLog&)>& f) {
  return std::any_of(h.steps.begin(), h.steps.end(), [&](const StepLog& s) { return f(s) != 0; });
}
// The loss: every step's, its smoothed curve, and each evaluation's (or why there is none).
Chart loss_chart(const RunHistory& h, std::vector<std::pair<std::string, std::string>>& absent) {
  Chart loss{"loss", "Loss", Unit::kPlain};
  auto raw = per_step(h, [](const StepLog& s) { return s.loss; });
  std::vector<double> ys;
  for (auto& p : raw) ys.push_back(p.second);
  const double beta = smoothing_weight(ys.size());
  const std::vector<double> sm = smoothed(ys, beta);
  std::vector<std::pair<double, double>> smooth;
  for (size_t i = 0; i < raw.size(); ++i) smooth.push_back({raw[i].first, sm[i]});
  loss.series.push_back({"train", "#9ecae1", raw, false, 1.0});
  loss.series.push_back({"train, smoothed", "#1f77b4", smooth, false, 2.0});
  if (!h.val.empty()) {
    std::vector<std::pair<double, double>> val;
    for (auto [step, v] : h.val) val.push_back({static_cast<double>(step), v});
    loss.series.push_back({"validation", "#d62728", val, false, 2.0});
  } else {
    absent.push_back(
        {"val_loss", "no validation loss: the run had no validation data (data.val) or no evaluation"});
  }
  char note[96];
  std::snprintf(note, sizeof(note), "smoothed: a debiased moving average, weight %.2f", beta);
  loss.note = note;
  return loss;
}
}  // namespace

ReportCharts report_charts(const RunHistory& h) {
  ReportCharts r;
  if (h.steps.empty()) {
    r.absent.push_back({"loss", "no step was run (the run resumed at its last step, or train.steps is 0)"});
    return r;
  }
  r.charts.push_back(loss_chart(h, r.absent));

  r.charts.push_back({"lr",
                      "Learning rate",
                      Unit::kPlain,
                      {{"lr", "#2ca02c", per_step(h, [](const StepLog& s) { return s.lr; })}}});
  Chart norm{"grad_norm",
             "Gradient norm (before clipping)",
             Unit::kPlain,
             {{"grad norm", "#9467bd", per_step(h, [](const StepLog& s) { return s.norm; })}}};
  norm.clip_spikes = true;  // an early spike would flatten the rest
  norm.note = clipped_note(norm);
  r.charts.push_back(norm);
  r.charts.push_back(
      {"tokens_per_sec",
       "Tokens per second (all ranks)",
       Unit::kPlain,
       {{"tokens/s", "#ff7f0e", per_step(h, [](const StepLog& s) { return s.tokens / s.sec; })}}});
  // MFU against one device's peak; without a known peak, the GFLOP/s it is made of
  if (h.steps.back().peak_flops > 0) {
    r.charts.push_back({"mfu",
                        "MFU (model FLOPs per rank / the device's peak)",
                        Unit::kPercent,
                        {{"MFU", "#8c564b", per_step(h, [](const StepLog& s) {
                            return 100 * s.flops / s.sec / s.world_size / s.peak_flops;
                          })}}});
  } else {
    r.absent.push_back({"mfu",
                        "no MFU: the device's peak FLOP/s is not known (a CPU run, or a GPU without "
                        "log.peak_tflops); the chart shows GFLOP/s per rank instead"});
    r.charts.push_back({"gflops_per_sec",
                        "Model GFLOP/s per rank",
                        Unit::kPlain,
                        {{"GFLOP/s per rank", "#8c564b", per_step(h, [](const StepLog& s) {
                            return s.flops / s.sec / 1e9 / s.world_size;
                          })}}});
  }
  if (any_nonzero(h, [](const StepLog& s) { return static_cast<double>(s.mem.peak + s.mem.in_use); }))
    r.charts.push_back(
        {"mem_in_use",
         "Device memory (rank 0)",
         Unit::kBytes,
         {{"in use", "#17becf", per_step(h, [](const StepLog& s) { return double(s.mem.in_use); })},
          {"peak", "#e377c2", per_step(h, [](const StepLog& s) { return double(s.mem.peak); }), true}}});
  else
    r.absent.push_back({"mem_in_use", "no memory figures: the device reported none"});
  if (any_nonzero(h, [](const StepLog& s) { return static_cast<double>(s.comm_bytes); })) {
    Chart comm{"comm_bytes",
               "Bytes sent per step (rank 0, ring model)",
               Unit::kBytes,
               {{"sent", "#bcbd22", per_step(h, [](const StepLog& s) { return double(s.comm_bytes); })}}};
    if (any_nonzero(h, [](const StepLog& s) { return static_cast<double>(s.across_hosts); }))
      comm.series.push_back({"across hosts", "#7f7f7f",
                             per_step(h, [](const StepLog& s) { return double(s.across_hosts); }), true});
    else
      comm.note = "nothing crossed hosts: every rank ran on one host";
    r.charts.push_back(comm);
  } else {
    r.absent.push_back({"comm_bytes", h.steps.back().world_size > 1
                                          ? "no bytes communicated: this layout sends nothing from rank 0"
                                          : "no communication: the run had one rank"});
  }
  r.charts.push_back({"ms",
                      "Step time",
                      Unit::kMilliseconds,
                      {{"step time", "#1f77b4", per_step(h, [](const StepLog& s) { return s.sec * 1e3; })}}});
  return r;
}

// ---- the page ---------------------------------------------------------------------------------

namespace {
const char* kStyle = R"(<style>
body { font-family: sans-serif; max-width: 980px; margin: 2em auto; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.6em; border-bottom: 1px solid #ddd; }
.charts { display: grid; grid-template-columns: repeat(auto-fill, minmax(470px, 1fr)); gap: 8px; }
figure.chart { margin: 0; } figcaption { font-weight: bold; font-size: 0.9em; margin: 0.3em 0; }
.note, .absent { color: #666; font-size: 0.85em; margin: 0.2em 0; }
table { border-collapse: collapse; font-size: 0.9em; } td { padding: 2px 10px 2px 0; vertical-align: top; }
td.key { font-family: monospace; color: #555; }
pre { background: #f6f6f6; padding: 0.6em; white-space: pre-wrap; word-break: break-word; }
</style>
)";
}  // namespace

std::string report_html(const ReportInfo& info, const RunHistory& h) {
  const ReportCharts rc = report_charts(h);
  std::ostringstream o;
  o << "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'><title>" << html_escape(info.title)
    << "</title>\n"
    << kStyle << "</head>\n<body>\n<h1>" << html_escape(info.title) << "</h1>\n";
  if (!info.summary.empty()) {
    o << "<ul id='summary'>\n";
    for (const std::string& s : info.summary) o << "<li>" << html_escape(s) << "</li>\n";
    o << "</ul>\n";
  }

  o << "<h2>Metrics</h2>\n<div class='charts'>\n";
  for (const Chart& c : rc.charts) {
    o << "<figure class='chart' id='chart-" << c.id << "' data-metric='" << c.id << "'>\n<figcaption>"
      << html_escape(c.title) << "</figcaption>\n"
      << line_chart_svg(c);
    if (!c.note.empty()) o << "<p class='note'>" << html_escape(c.note) << "</p>\n";
    o << "</figure>\n";
  }
  o << "</div>\n";
  for (const auto& [metric, why] : rc.absent)
    o << "<p class='absent' data-metric='" << html_escape(metric) << "'>" << html_escape(why) << "</p>\n";

  o << "<h2>Layout and config</h2>\n";
  if (!info.layout.empty()) o << "<p id='layout'>mesh: <code>" << html_escape(info.layout) << "</code></p>\n";
  o << "<table id='config'>\n";
  for (const auto& [k, v] : info.config)
    o << "<tr><td class='key'>" << html_escape(k) << "</td><td>" << html_escape(v) << "</td></tr>\n";
  o << "</table>\n";

  o << "<h2>Samples</h2>\n";
  if (h.samples.empty())
    o << "<p class='absent' data-metric='sample'>no samples: sample.every is -1, sample.length is 0 or the "
         "data has no vocabulary</p>\n";
  for (const auto& [step, text] : h.samples)
    o << "<h3>after step " << step << "</h3>\n<pre class='sample' data-step='" << step << "'>"
      << html_escape(text) << "</pre>\n";
  o << "</body></html>\n";
  return o.str();
}

void write_report(const std::string& path, const ReportInfo& info, const RunHistory& h) {
  io::write_file_atomic(path, report_html(info, h));
}

EarlierMetrics read_earlier_metrics(const std::string& path, int64_t upto, int world_size, int64_t steps,
                                    bool spans_hosts) {
  EarlierMetrics e;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    try {
      const nlohmann::json j = parse_json_checked(line, path);
      const int64_t step = j.at("step").get<int64_t>();  // steps done
      if (step > upto) {
        ++e.dropped;
        continue;
      }
      if (j.contains("loss")) {
        e.history.steps.push_back(step_from_json(j, world_size, steps, spans_hosts));
      } else if (j.contains("val_loss")) {
        e.history.val.push_back({step, j.at("val_loss").get<double>()});
      } else if (j.contains("sample")) {
        e.history.samples.push_back({step, j.at("sample").get<std::string>()});
      }
      e.lines.push_back(line);
    } catch (const nlohmann::json::exception&) {
      ++e.dropped;
    }
  }
  return e;
}

std::vector<std::pair<std::string, std::string>> report_config(const Config& c, const std::string& model,
                                                               const std::string& device,
                                                               int64_t tokens_per_step, double lr,
                                                               const std::string& step_schedule) {
  auto num = [](double v) {
    std::ostringstream o;
    o << v;
    return o.str();
  };
  return {
      {"model", model},
      {"device", device},
      {"train.steps", std::to_string(c.train.steps)},
      {"train.micro_batch_size", std::to_string(c.train.micro_batch_size)},
      {"train.grad_accum_steps", std::to_string(c.train.grad_accum_steps)},
      {"train.seq_len", std::to_string(c.train.seq_len)},
      {"tokens per step", std::to_string(tokens_per_step)},
      {"step schedule", step_schedule},
      {"train.dtype", c.train.dtype},
      {"optim.lr", num(lr) + (c.optim.lr_scaling != "none" ? " (scaled " + c.optim.lr_scaling + ")" : "")},
      {"optim.schedule", c.optim.schedule + ", warmup " + std::to_string(c.optim.warmup_steps) +
                             " steps, min_lr_frac " + num(c.optim.min_lr_frac)},
      {"optim.grad_clip", num(c.optim.grad_clip)},
      {"data.train", c.data.train},
      {"data.val", c.data.val.empty() ? "(none)" : c.data.val},
      {"train.eval_every", std::to_string(c.train.eval_every)},
      {"train.seed", std::to_string(c.train.seed)}};
}

}  // namespace ndt::train
