#include "train/chart.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <sstream>

#include "train/io/format.h"

namespace ndt::train {

namespace {
// The length of the valid UTF-8 sequence at s[i], or 0 (a stray or cut byte, an overlong form,
// a surrogate, beyond U+10FFFF).
size_t utf8_length(const std::string& s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned c = b(i);
  const size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
  if (n == 0 || i + n > s.size()) return 0;
  unsigned cp = n == 1 ? c : c & (0x7F >> n);
  for (size_t k = 1; k < n; ++k) {
    if ((b(i + k) & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (b(i + k) & 0x3F);
  }
  static const unsigned kMin[] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < kMin[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return n;
}
}  // namespace

std::string html_escape(const std::string& s) {
  std::string o;
  o.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const size_t n = utf8_length(s, i);
    if (n == 0) {  // not UTF-8 (a byte-level sample): the replacement character
      o += "\xEF\xBF\xBD";
      ++i;
      continue;
    }
    if (n > 1) {
      o.append(s, i, n);
      i += n;
      continue;
    }
    switch (const char c = s[i++]) {
      case '&':
        o += "&amp;";
        break;
      case '<':
        o += "&lt;";
        break;
      case '>':
        o += "&gt;";
        break;
      case '"':
        o += "&quot;";
        break;
      case '\'':
        o += "&#39;";
        break;
      default:
        o += c;
    }
  }
  return o;
}

std::string format_value(double v, Unit unit) {
  char b[48];
  switch (unit) {
    case Unit::kBytes:
      return v == 0 ? "0" : io::format_bytes(v);
    case Unit::kPercent:
      std::snprintf(b, sizeof(b), "%.3g%%", v);
      break;
    case Unit::kMilliseconds:
      std::snprintf(b, sizeof(b), "%.4g ms", v);
      break;
    case Unit::kPlain: {
      const double a = std::abs(v);  // large counts as 125k, 3.2M (tokens/s)
      if (a >= 1e10)
        std::snprintf(b, sizeof(b), "%.4gG", v / 1e9);
      else if (a >= 1e7)
        std::snprintf(b, sizeof(b), "%.4gM", v / 1e6);
      else if (a >= 1e4)
        std::snprintf(b, sizeof(b), "%.4gk", v / 1e3);
      else
        std::snprintf(b, sizeof(b), "%.4g", v);
      break;
    }
  }
  return b;
}

namespace {
// A round step (1, 2 or 5 times a power of ten) that cuts `range` into about `n` pieces; for
// bytes, round in the KiB, MiB or GiB that format_bytes shows.
double nice_step(double range, int n, Unit unit = Unit::kPlain) {
  double scale = 1;
  if (unit == Unit::kBytes)
    while (range / scale >= 1024 * n) scale *= 1024;
  const double raw = range / scale / n, p = std::pow(10.0, std::floor(std::log10(raw))), f = raw / p;
  return (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * p * scale;
}

std::vector<std::pair<double, double>> drawn_points(const std::vector<std::pair<double, double>>& pts) {
  std::vector<std::pair<double, double>> o;
  for (const auto& p : pts)
    if (std::isfinite(p.second)) o.push_back(p);
  if (o.size() <= kMaxDrawnPoints) return o;
  std::vector<std::pair<double, double>> thin;
  const double stride = static_cast<double>(o.size() - 1) / static_cast<double>(kMaxDrawnPoints - 1);
  for (size_t i = 0; i < kMaxDrawnPoints; ++i)
    thin.push_back(o[static_cast<size_t>(std::llround(i * stride))]);
  thin.back() = o.back();
  return thin;
}
}  // namespace

double spike_cap(const Chart& c) {
  std::vector<double> v;
  for (const Series& s : c.series)
    for (auto [x, y] : s.points)
      if (std::isfinite(y)) v.push_back(y);
  if (!c.clip_spikes || v.size() < 10) return HUGE_VAL;
  std::sort(v.begin(), v.end());
  const double cap = 1.5 * v[static_cast<size_t>(0.98 * static_cast<double>(v.size() - 1))];
  return cap > 0 && v.back() > cap ? cap : HUGE_VAL;
}

std::string clipped_note(const Chart& c) {
  const double cap = spike_cap(c);
  if (!std::isfinite(cap)) return "";
  int64_t n = 0;
  std::pair<double, double> top{0, -HUGE_VAL};
  for (const Series& s : c.series)
    for (auto [x, y] : s.points)
      if (std::isfinite(y) && y > cap) {
        ++n;
        if (y > top.second) top = {x, y};
      }
  return std::to_string(n) + (n == 1 ? " value" : " values") + " above " + format_value(cap, c.unit) +
         " drawn at the top edge (the largest, " + format_value(top.second, c.unit) + ", at step " +
         std::to_string(static_cast<long long>(top.first)) + ")";
}

namespace {
// The legend's rows: the series' names side by side, as many to a row as `width` holds.
std::vector<std::vector<size_t>> legend_rows(const Chart& c, double width) {
  std::vector<std::vector<size_t>> rows(1);
  double used = 0;
  for (size_t i = 0; i < c.series.size(); ++i) {
    const double w = 28 + 6.5 * static_cast<double>(c.series[i].name.size());
    if (used > 0 && used + w > width) rows.emplace_back(), used = 0;
    rows.back().push_back(i);
    used += w;
  }
  return rows;
}
}  // namespace

std::string line_chart_svg(const Chart& c, int W, int H) {
  const double L = 64, R = 12, B = 34;  // margins: y ticks left, x ticks below
  const std::vector<std::vector<size_t>> rows = legend_rows(c, W - L - R);
  const double T = 8 + 15 * static_cast<double>(rows.size());  // the legend above the plot
  const double cap = spike_cap(c);
  std::vector<std::vector<std::pair<double, double>>> drawn;
  double x0 = 1e300, x1 = -1e300, y0 = 1e300, y1 = -1e300;
  for (const Series& s : c.series) {
    drawn.push_back(drawn_points(s.points));
    for (auto& [x, y] : drawn.back()) {
      y = std::min(y, cap);
      x0 = std::min(x0, x), x1 = std::max(x1, x);
      y0 = std::min(y0, y), y1 = std::max(y1, y);
    }
  }
  if (x0 > x1) x0 = 0, x1 = 1;
  if (x1 - x0 < 1) x1 = x0 + 1;
  if (y0 > y1) y0 = 0, y1 = 1;
  if (y0 > 0 && y0 < 0.3 * y1) y0 = 0;   // a positive quantity far from 0: the axis starts at 0
  if (y1 - y0 <= 1e-9 * std::abs(y1)) {  // a constant: from 0 to a quarter above it
    if (y1 > 0)
      y0 = 0, y1 *= 1.25;
    else if (y1 < 0)
      y0 *= 1.25, y1 = 0;
    else
      y0 = 0, y1 = 1;
  }
  const double ystep = nice_step(y1 - y0, 4, c.unit);
  y0 = std::floor(y0 / ystep) * ystep, y1 = std::ceil(y1 / ystep) * ystep;
  auto px = [&](double x) { return L + (x - x0) / (x1 - x0) * (W - L - R); };
  auto py = [&](double y) { return T + (1 - (y - y0) / (y1 - y0)) * (H - T - B); };

  std::ostringstream o;
  o.precision(5);
  o << "<svg xmlns='http://www.w3.org/2000/svg' width='" << W << "' height='" << H << "' viewBox='0 0 " << W
    << " " << H << "' font-family='sans-serif' font-size='11' role='img' aria-label='" << html_escape(c.title)
    << "'>\n"
    << "<rect width='100%' height='100%' fill='white'/>\n";
  for (double y = y0; y <= y1 + ystep * 1e-6; y += ystep)  // grid and y ticks
    o << "<line x1='" << L << "' x2='" << W - R << "' y1='" << py(y) << "' y2='" << py(y)
      << "' stroke='#e4e4e4'/>"
      << "<text x='" << L - 5 << "' y='" << py(y) + 4 << "' text-anchor='end'>"
      << html_escape(format_value(std::abs(y) < ystep * 1e-9 ? 0 : y, c.unit)) << "</text>\n";
  const double xstep = std::max(1.0, nice_step(x1 - x0, 5));
  for (double x = std::ceil(x0 / xstep) * xstep; x <= x1 + 1e-9; x += xstep)  // x ticks (steps)
    o << "<text x='" << px(x) << "' y='" << H - B + 15 << "' text-anchor='middle'>"
      << static_cast<long long>(x) << "</text>\n";
  o << "<text x='" << (L + W - R) / 2 << "' y='" << H - 4
    << "' text-anchor='middle' fill='#555'>step</text>\n"
    << "<rect x='" << L << "' y='" << T << "' width='" << W - L - R << "' height='" << H - T - B
    << "' fill='none' stroke='#999'/>\n";
  for (size_t i = 0; i < c.series.size(); ++i) {
    const Series& s = c.series[i];
    o << "<polyline data-series='" << html_escape(s.name) << "' data-points='" << drawn[i].size()
      << "' fill='none' stroke='" << s.color << "' stroke-width='" << s.width << "'"
      << (s.dashed ? " stroke-dasharray='5,3'" : "") << " points='";
    for (auto [x, y] : drawn[i]) o << px(x) << "," << py(y) << " ";
    o << "'/>\n";
    if (drawn[i].size() < 40)
      for (auto [x, y] : drawn[i])
        o << "<circle cx='" << px(x) << "' cy='" << py(y) << "' r='2.5' fill='" << s.color << "'/>\n";
  }
  // the legend: rows of series above the plot, clear of its lines
  for (size_t r = 0; r < rows.size(); ++r) {
    double lx = L;
    const double ly = 16 + 15 * static_cast<double>(r);
    for (size_t i : rows[r]) {
      const Series& s = c.series[i];
      o << "<line class='legend' x1='" << lx << "' x2='" << lx + 18 << "' y1='" << ly - 4 << "' y2='"
        << ly - 4 << "' stroke='" << s.color << "' stroke-width='2'"
        << (s.dashed ? " stroke-dasharray='5,3'" : "") << "/>"
        << "<text x='" << lx + 23 << "' y='" << ly << "'>" << html_escape(s.name) << "</text>\n";
      lx += 28 + 6.5 * static_cast<double>(s.name.size());
    }
  }
  o << "</svg>\n";
  return o.str();
}

}  // namespace ndt::train
