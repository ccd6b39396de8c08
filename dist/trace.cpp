#include "dist/trace.h"

#include <filesystem>

#include "dist/json_text.h"
#include "tensor/error.h"

namespace ndt::dist {

Trace::Trace(int rank) : rank_(rank), start_(std::chrono::steady_clock::now()) {}

int64_t Trace::now_us() const {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - start_)
      .count();
}

void Trace::add(const std::string& name, Track track, int64_t begin_us, int64_t end_us, int64_t bytes) {
  std::lock_guard<std::mutex> g(mu_);
  events_.push_back({name, track, begin_us, end_us, bytes});
}

size_t Trace::size() const {
  std::lock_guard<std::mutex> g(mu_);
  return events_.size();
}

std::string Trace::to_json() const {
  std::lock_guard<std::mutex> g(mu_);
  const char* tracks[] = {"compute", "comm", "wait"};
  // ts counts from this trace's start; clock_origin_us is that start on the host's steady
  // clock, so the ranks of one host line up (scripts/trace_summary.py shifts by it)
  const auto origin =
      std::chrono::duration_cast<std::chrono::microseconds>(start_.time_since_epoch()).count();
  using json = nlohmann::ordered_json;
  json events = json::array();
  events.push_back({{"ph", "M"},
                    {"name", "process_name"},
                    {"pid", rank_},
                    {"args", {{"name", "rank " + std::to_string(rank_)}}}});
  for (int t = 0; t < 3; ++t)
    events.push_back(
        {{"ph", "M"}, {"name", "thread_name"}, {"pid", rank_}, {"tid", t}, {"args", {{"name", tracks[t]}}}});
  for (const Event& e : events_) {
    json j = {{"ph", "X"},     {"name", e.name},        {"pid", rank_}, {"tid", static_cast<int>(e.track)},
              {"ts", e.begin}, {"dur", e.end - e.begin}};
    if (e.bytes >= 0) j["args"] = {{"bytes", e.bytes}};
    events.push_back(std::move(j));
  }
  return json_one_per_line({{"displayTimeUnit", "ms"},
                            {"otherData", {{"clock_origin_us", origin}}},
                            {"traceEvents", std::move(events)}},
                           "traceEvents");
}

Trace::Scope::Scope(Trace* t, std::string name, Track track, int64_t bytes)
    : t_(t), name_(std::move(name)), track_(track), bytes_(bytes) {
  if (t_) begin_ = t_->now_us();
}

Trace::Scope::~Scope() {
  if (t_) t_->add(name_, track_, begin_, t_->now_us(), bytes_);
}

std::string trace_path_for_rank(const std::string& path, int rank) {
  std::filesystem::path p(path);
  const std::string ext = p.has_extension() ? p.extension().string() : ".json";
  return (p.parent_path() / (p.stem().string() + ".rank" + std::to_string(rank) + ext)).string();
}

}  // namespace ndt::dist
