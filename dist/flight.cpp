#include "dist/flight.h"

#include <chrono>
#include <filesystem>
#include <fstream>

#include "dist/json_text.h"

namespace ndt::dist {

int64_t FlightRecorder::now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

int64_t FlightRecorder::queued(const std::string& group, int64_t seq, const std::string& what, int64_t bytes,
                               int peer) {
  std::lock_guard<std::mutex> g(mu_);
  Entry e;
  e.id = next_id_++;
  e.seq = seq;
  e.bytes = bytes;
  e.peer = peer;
  e.step = step_;
  e.group = group;
  e.what = what;
  e.queued_us = now_us();
  entries_.push_back(std::move(e));
  if (entries_.size() > capacity_) entries_.pop_front();
  return entries_.back().id;
}

void FlightRecorder::tick() {
  const int64_t now = now_us();
  std::lock_guard<std::mutex> g(mu_);
  if (last_tick_us_ > 0 && now - last_tick_us_ > kPauseUs) {
    pauses_.emplace_back(last_tick_us_, now);
    if (pauses_.size() > 16) pauses_.pop_front();
  }
  last_tick_us_ = now;
}

FlightRecorder::Entry* FlightRecorder::find(int64_t id) {
  if (entries_.empty() || id < entries_.front().id || id > entries_.back().id) return nullptr;
  return &entries_[static_cast<size_t>(id - entries_.front().id)];  // ids are consecutive
}

void FlightRecorder::started(int64_t id) {
  std::lock_guard<std::mutex> g(mu_);
  if (Entry* e = find(id)) e->started_us = now_us();
}

void FlightRecorder::finished(int64_t id, bool ok) {
  std::lock_guard<std::mutex> g(mu_);
  if (Entry* e = find(id)) {
    e->finished_us = now_us();
    e->ok = ok;
  }
}

void FlightRecorder::set_step(int64_t step) {
  std::lock_guard<std::mutex> g(mu_);
  step_ = step;
  micro_ = -2;
  unit_.clear();
}

void FlightRecorder::set_micro(int64_t micro, int64_t of) {
  std::lock_guard<std::mutex> g(mu_);
  micro_ = micro;
  micro_of_ = of;
  unit_.clear();
}

void FlightRecorder::set_unit(const std::string& unit) {
  std::lock_guard<std::mutex> g(mu_);
  unit_ = unit;
}

std::string FlightRecorder::where() const {
  std::lock_guard<std::mutex> g(mu_);
  if (step_ < 0) return "";
  std::string w = "step " + std::to_string(step_);
  if (micro_ >= 0)
    w += ", micro-step " + std::to_string(micro_ + 1) + " of " + std::to_string(micro_of_);
  else if (micro_ == -1)
    w += ", after its micro-steps";
  if (!unit_.empty()) w += ", unit " + unit_;
  return w;
}

void FlightRecorder::set_hosts(std::vector<std::string> hosts) {
  std::lock_guard<std::mutex> g(mu_);
  hosts_ = std::move(hosts);
}

void FlightRecorder::set_job(const std::string& id) {
  std::lock_guard<std::mutex> g(mu_);
  job_ = id;
}

FlightRecorder::Pending FlightRecorder::oldest_pending() const {
  std::lock_guard<std::mutex> g(mu_);
  for (const Entry& e : entries_)
    if (!e.finished_us) return {e.what, e.queued_us};
  return {};
}

void FlightRecorder::dump(const std::string& path, int rank, int world, const std::string& reason) const {
  std::string text;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (dumped_ || job_.empty()) return;
    dumped_ = true;
    dumped_to_ = path;
    nlohmann::ordered_json entries = nlohmann::ordered_json::array();
    for (const Entry& e : entries_) {
      const char* state = e.finished_us ? (e.ok ? "done" : "failed") : e.started_us ? "started" : "queued";
      nlohmann::ordered_json j = {{"group", e.group}, {"seq", e.seq}, {"what", e.what}, {"bytes", e.bytes}};
      if (e.peer >= 0) j["peer"] = e.peer;
      j["step"] = e.step;
      j["state"] = state;
      j["queued_us"] = e.queued_us;
      j["started_us"] = e.started_us;
      j["finished_us"] = e.finished_us;
      entries.push_back(std::move(j));
    }
    const int64_t now = now_us();
    nlohmann::ordered_json paused = nlohmann::ordered_json::array();
    for (const auto& [from, to] : pauses_) paused.push_back({{"from_us", from}, {"to_us", to}});
    if (last_tick_us_ > 0 && now - last_tick_us_ > kPauseUs)  // not running until just now
      paused.push_back({{"from_us", last_tick_us_}, {"to_us", now}});
    text = json_one_per_line({{"job", job_},
                              {"rank", rank},
                              {"world", world},
                              {"reason", reason},
                              {"step", step_},
                              {"written_us", now},
                              {"hosts", hosts_},
                              {"paused", std::move(paused)},
                              {"entries", std::move(entries)}},
                             "entries");
  }
  try {
    namespace fs = std::filesystem;
    fs::create_directories(fs::path(path).parent_path());
    const std::string tmp = path + ".tmp";
    {
      std::ofstream f(tmp, std::ios::trunc);
      f << text;
      if (!f) return;
    }
    fs::rename(tmp, path);
  } catch (...) {  // a failing job must not fail again here
  }
}

void FlightRecorder::retract() {
  std::lock_guard<std::mutex> g(mu_);
  if (!dumped_) return;
  std::error_code ec;
  std::filesystem::remove(dumped_to_, ec);
  dumped_ = false;
  dumped_to_.clear();
}

}  // namespace ndt::dist
