#include "train/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "train/io/files.h"

namespace ndt::train {
namespace {
std::string esc(const std::string& s) {
  std::string o;
  for (char c : s) o += c == '<' ? "&lt;" : c == '>' ? "&gt;" : c == '&' ? "&amp;" : std::string(1, c);
  return o;
}
std::string fmt(double v, int prec = 3) {
  char b[32];
  std::snprintf(b, sizeof(b), "%.*g", prec, v);
  return b;
}
}  // namespace

std::string loss_svg(const LossCurves& c, int W, int H) {
  const double L = 60, R = 20, T = 20, B = 40;  // margins
  double x0 = 0, x1 = 1, y0 = 1e300, y1 = -1e300;
  for (auto* s : {&c.train, &c.val})
    for (auto& [x, y] : *s) {
      if (!std::isfinite(y)) continue;
      x1 = std::max(x1, static_cast<double>(x));
      y0 = std::min(y0, y);
      y1 = std::max(y1, y);
    }
  if (y0 > y1) y0 = 0, y1 = 1;
  if (y1 - y0 < 1e-9) y1 = y0 + 1;
  auto px = [&](double x) { return L + (x - x0) / (x1 - x0) * (W - L - R); };
  auto py = [&](double y) { return T + (1 - (y - y0) / (y1 - y0)) * (H - T - B); };
  std::ostringstream o;
  o << "<svg xmlns='http://www.w3.org/2000/svg' width='" << W << "' height='" << H
    << "' font-family='sans-serif' font-size='12'>\n<rect width='100%' height='100%' fill='white'/>\n";
  for (int i = 0; i <= 4; ++i) {  // grid and y labels
    const double y = y0 + (y1 - y0) * i / 4;
    o << "<line x1='" << L << "' x2='" << W - R << "' y1='" << py(y) << "' y2='" << py(y)
      << "' stroke='#ddd'/>"
      << "<text x='" << L - 6 << "' y='" << py(y) + 4 << "' text-anchor='end'>" << fmt(y) << "</text>\n";
    const double x = x0 + (x1 - x0) * i / 4;
    o << "<text x='" << px(x) << "' y='" << H - B + 16 << "' text-anchor='middle'>" << fmt(x, 6)
      << "</text>\n";
  }
  o << "<text x='" << (L + W - R) / 2 << "' y='" << H - 6 << "' text-anchor='middle'>step</text>\n"
    << "<text x='14' y='" << (T + H - B) / 2 << "' transform='rotate(-90 14 " << (T + H - B) / 2
    << ")' text-anchor='middle'>loss</text>\n";
  auto line = [&](const std::vector<std::pair<int64_t, double>>& s, const char* color) {
    if (s.empty()) return;
    o << "<polyline fill='none' stroke='" << color << "' stroke-width='1.5' points='";
    for (auto& [x, y] : s)
      if (std::isfinite(y)) o << px(static_cast<double>(x)) << "," << py(y) << " ";
    o << "'/>\n";
    if (s.size() < 40)
      for (auto& [x, y] : s)
        if (std::isfinite(y))
          o << "<circle cx='" << px(static_cast<double>(x)) << "' cy='" << py(y) << "' r='2.5' fill='"
            << color << "'/>\n";
  };
  line(c.train, "#1f77b4");
  line(c.val, "#d62728");
  o << "<rect x='" << W - R - 130 << "' y='" << T + 4
    << "' width='124' height='40' fill='white' stroke='#ccc'/>"
    << "<line x1='" << W - R - 122 << "' x2='" << W - R - 102 << "' y1='" << T + 16 << "' y2='" << T + 16
    << "' stroke='#1f77b4' stroke-width='2'/><text x='" << W - R - 96 << "' y='" << T + 20
    << "'>train loss</text>"
    << "<line x1='" << W - R - 122 << "' x2='" << W - R - 102 << "' y1='" << T + 34 << "' y2='" << T + 34
    << "' stroke='#d62728' stroke-width='2'/><text x='" << W - R - 96 << "' y='" << T + 38
    << "'>val loss</text>\n";
  o << "</svg>\n";
  return o.str();
}

void write_report(const std::string& path, const std::string& title, const LossCurves& c,
                  const std::vector<std::string>& summary) {
  std::ostringstream o;
  o << "<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>" << esc(title) << "</title></head>\n"
    << "<body style='font-family:sans-serif;max-width:760px;margin:2em auto'>\n<h1>" << esc(title)
    << "</h1>\n"
    << loss_svg(c) << "<ul>\n";
  for (const std::string& s : summary)
    o << "<li><pre style='margin:0;white-space:pre-wrap'>" << esc(s) << "</pre></li>\n";
  o << "</ul>\n</body></html>\n";
  io::write_file_atomic(path, o.str());
}

}  // namespace ndt::train
