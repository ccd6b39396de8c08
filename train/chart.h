// ndtrain: a line chart as inline SVG, for the training report (train/report.h); no plotting
// library and no script, so the page opens anywhere, offline.
//
//   Chart c{"loss", "Loss", Unit::kPlain};
//   c.series.push_back({"train", "#1f77b4", {{1, 4.2}, {2, 3.9}}});
//   std::string svg = line_chart_svg(c);
//
// Each series is one <polyline data-series="NAME" data-points="N">, and a series of fewer
// than 40 points also gets a dot per point (a single evaluation still shows). A series longer
// than kMaxDrawnPoints is drawn from evenly spaced points of it, the last one always kept.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace ndt::train {

enum class Unit { kPlain, kBytes, kPercent, kMilliseconds };

struct Series {
  std::string name, color;
  std::vector<std::pair<double, double>> points;  // (step, value); non-finite values are skipped
  bool dashed = false;
  double width = 1.5;
};

struct Chart {
  Chart(std::string id_, std::string title_, Unit unit_, std::vector<Series> series_ = {},
        std::string note_ = {})
      : id(std::move(id_)),
        title(std::move(title_)),
        unit(unit_),
        series(std::move(series_)),
        note(std::move(note_)) {}
  std::string id, title;
  Unit unit = Unit::kPlain;
  std::vector<Series> series;
  std::string note;  // a line under the chart ("" for none)
  // a few values far above the rest (an early gradient-norm spike) drawn at the top edge,
  // so that they do not flatten the others (spike_cap)
  bool clip_spikes = false;
};

constexpr size_t kMaxDrawnPoints = 2000;

// The legend is a band above the plot, never over its lines.
std::string line_chart_svg(const Chart& c, int width = 460, int height = 260);
// With clip_spikes, the top of the value axis when a few values are far above the rest:
// 1.5 x the 98th percentile of the values, if the largest is above that; +inf otherwise.
double spike_cap(const Chart& c);
// What spike_cap leaves out, for the note under the chart: "3 values above 4.2 drawn at the
// top edge (the largest, 120, at step 1)"; "" when nothing is clipped.
std::string clipped_note(const Chart& c);
// A tick or value in the chart's unit: "1.5 MB", "42%", "12.3 ms", "0.0031".
std::string format_value(double v, Unit unit);
// For HTML text and attributes: & < > " ' escaped, and bytes that are not UTF-8 (a byte-level
// vocabulary's sample) as U+FFFD.
std::string html_escape(const std::string& s);

}  // namespace ndt::train
