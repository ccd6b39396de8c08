// ndtrain: the training report: an HTML page with the train and validation loss curves
// drawn as inline SVG (no plotting dependency).
//
//   train::LossCurves c;  c.train.push_back({step, loss});  c.val.push_back({step, val});
//   train::write_report("out/report.html", "char GPT on fortunes", c, summary_lines);
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace ndt::train {

struct LossCurves {
  std::vector<std::pair<int64_t, double>> train, val;
};

// The SVG alone (a line chart of both curves with axes and a legend).
std::string loss_svg(const LossCurves& c, int width = 720, int height = 360);
// An HTML page: title, the chart, and `summary` lines (config, final losses, speed). Atomic.
void write_report(const std::string& path, const std::string& title, const LossCurves& c,
                  const std::vector<std::string>& summary);

}  // namespace ndt::train
