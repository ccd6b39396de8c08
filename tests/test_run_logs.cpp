// What a run leaves to be read: the HTML report (train/report.h, train/chart.h), the
// TensorBoard event files (train/io/tensorboard.h), the Chrome trace (dist/trace.h) and the
// flight record (dist/flight.h). The CRC-32C and the records are checked
// against known vectors: RFC 3720's, and bytes written by TensorBoard's own RecordWriter
// (tensorboard 2.21, tensorboard.summary.writer.record_writer) for the same Events.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <thread>

#include "dist/flight.h"
#include "dist/trace.h"
#include "support/testing.h"
#include "train/io/files.h"
#include "train/io/tensorboard.h"
#include "train/report.h"

using namespace ndt;
namespace fs = std::filesystem;

namespace {

std::string unhex(const std::string& h) {
  std::string o;
  for (size_t i = 0; i < h.size(); i += 2) o += static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16));
  return o;
}
std::string hex(const std::string& b) {
  static const char* d = "0123456789abcdef";
  std::string o;
  for (unsigned char c : b) o += d[c >> 4], o += d[c & 15];
  return o;
}

TEST(TensorBoard, Crc32cKnownVectors) {
  EXPECT_EQ(io::crc32c("123456789", 9), 0xE3069283u);  // the check value
  std::string zeros(32, '\0'), ones(32, '\xff'), up, down;
  for (int i = 0; i < 32; ++i) up += static_cast<char>(i), down += static_cast<char>(31 - i);
  EXPECT_EQ(io::crc32c(zeros.data(), 32), 0x8A9136AAu);  // RFC 3720, B.4
  EXPECT_EQ(io::crc32c(ones.data(), 32), 0x62A8AB43u);
  EXPECT_EQ(io::crc32c(up.data(), 32), 0x46DD794Eu);
  EXPECT_EQ(io::crc32c(down.data(), 32), 0x113FDB5Cu);
  EXPECT_EQ(io::crc32c("", 0), 0u);
  // TFRecord's mask, as the hand-written CRC-32C gave it before Boost.CRC replaced it
  EXPECT_EQ(io::masked_crc32c("123456789"), 0xC78AB0E5u);
}

TEST(TensorBoard, EventsAndRecordsMatchTensorBoardsOwnWriter) {
  // Event{wall_time: 1.5, step: 7, summary {value {tag: "loss/train", simple_value: 2.5}}}
  const std::string event = io::scalars_event(1.5, 7, {{"loss/train", 2.5}});
  EXPECT_EQ(hex(event), "09000000000000f83f10072a130a110a0a6c6f73732f747261696e1500002040");
  EXPECT_EQ(
      hex(io::tfrecord(event)),
      "200000000000000029eda95009000000000000f83f10072a130a110a0a6c6f73732f747261696e15000020402c056691");
  // the first record of a file: Event{wall_time: 1.5, file_version: "brain.Event:2"}
  EXPECT_EQ(hex(io::tfrecord(io::version_event(1.5))),
            "1800000000000000a37f4b2209000000000000f83f1a0d627261696e2e4576656e743a322a28646c");
  // a resume at step 4: Event{wall_time: 1.5, step: 4, session_log {status: START}}
  EXPECT_EQ(hex(io::session_start_event(1.5, 4)), "09000000000000f83f10043a020801");
  // a sample: Event{wall_time: 1.5, step: 4, summary {value {tag: "samples", tensor {dtype:
  // DT_STRING, tensor_shape {}, string_val: "hi"}, metadata {plugin_data {plugin_name: "text"}}}}}
  EXPECT_EQ(hex(io::text_event(1.5, 4, "samples", "hi")),
            "09000000000000f83f10042a1f0a1d0a0773616d706c6573420808071200420268694a080a060a0474657874");
}

TEST(TensorBoard, WriterAppendsOneRecordPerCallReadableAtOnce) {
  const fs::path d = ndt::testing::fresh_dir("tb_writer") / "tb";
  io::EventWriter w;
  w.open(d.string());  // makes the directory
  ASSERT_TRUE(fs::exists(w.path()));
  EXPECT_NE(fs::path(w.path()).filename().string().find("events.out.tfevents."), std::string::npos);
  w.write_scalars(1, {{"lr", 1e-3}});
  w.write_scalars(2, {{"lr", 2e-3}, {"loss/train", 3.0}});
  // no close yet: the records are in the file (what `tensorboard --logdir` reads live)
  std::ifstream f(w.path(), std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(f)), {});
  size_t pos = 0, records = 0;
  while (pos < bytes.size()) {  // walk the framing, checking both CRCs of every record
    ASSERT_LE(pos + 12, bytes.size());
    uint64_t len = 0;
    for (int i = 0; i < 8; ++i)
      len |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[pos + i])) << (8 * i);
    auto u32 = [&](size_t at) {
      uint32_t v = 0;
      for (int i = 0; i < 4; ++i)
        v |= static_cast<uint32_t>(static_cast<unsigned char>(bytes[at + i])) << (8 * i);
      return v;
    };
    EXPECT_EQ(u32(pos + 8), io::masked_crc32c(std::string_view(bytes).substr(pos, 8)));
    ASSERT_LE(pos + 12 + len + 4, bytes.size());
    EXPECT_EQ(u32(pos + 12 + len), io::masked_crc32c(std::string_view(bytes).substr(pos + 12, len)));
    pos += 12 + len + 4;
    ++records;
  }
  EXPECT_EQ(records, 3u);  // the version, then one per call
  EXPECT_TRUE(w.error().empty());
}

TEST(TensorBoard, UnwritableDirectorySaysWhich) {
  const fs::path d = ndt::testing::fresh_dir("tb_bad");
  std::ofstream(d / "file") << "x";
  io::EventWriter w;
  try {
    w.open((d / "file" / "tb").string());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("file/tb"), std::string::npos) << e.what();
  }
}

// ---- the report ---------------------------------------------------------------------------

train::StepLog step(int64_t i, int world = 1, double peak = 0, int64_t comm = 0, int64_t across = 0) {
  train::StepLog s;
  s.step = i, s.steps = 20, s.loss = 4.0 - 0.1 * i, s.lr = 1e-3 * (i + 1) / 20, s.norm = 1.0 + 0.01 * i;
  s.sec = 0.05, s.tokens = 1024, s.flops = 1e9, s.world_size = world, s.peak_flops = peak;
  s.comm_bytes = comm, s.across_hosts = across;
  s.mem.in_use = 1 << 20, s.mem.peak = 3 << 20;
  return s;
}

// data-metric of every chart, in order
std::vector<std::string> charts(const std::string& html) {
  std::vector<std::string> o;
  std::regex re("<figure class='chart' id='chart-[a-z_]+' data-metric='([a-z_]+)'>");
  for (auto it = std::sregex_iterator(html.begin(), html.end(), re); it != std::sregex_iterator(); ++it)
    o.push_back((*it)[1]);
  return o;
}
int points(const std::string& html, const std::string& series) {
  std::smatch m;
  if (!std::regex_search(html, m, std::regex("data-series='" + series + "' data-points='([0-9]+)'")))
    return -1;
  return std::stoi(m[1]);
}

// The trace and the flight record are JSON whatever the names hold: quotes, backslashes,
// control characters, and bytes that are not UTF-8 (written as U+FFFD, never a throw).
TEST(RunLogs, TraceAndFlightRecordAreJsonWhateverTheNamesHold) {
  const fs::path dir = ndt::testing::fresh_dir("run_logs_json");
  const std::string odd = "a \"q\" \\ tab\t nl\n bad\xff\xfe end";
  const std::string replaced = "a \"q\" \\ tab\t nl\n bad\xEF\xBF\xBD\xEF\xBF\xBD end";
  auto read = [](const fs::path& p) {
    std::stringstream ss;
    ss << std::ifstream(p).rdbuf();
    return ss.str();
  };

  dist::Trace trace(3);
  trace.add(odd, dist::Trace::kComm, 10, 25, 4096);
  trace.add("forward h.0", dist::Trace::kCompute, 30, 40);
  io::write_file_atomic((dir / "trace.rank3.json").string(), trace.to_json());
  const std::string t = read(dir / "trace.rank3.json");
  const nlohmann::json tj = nlohmann::json::parse(t);
  EXPECT_EQ(tj["displayTimeUnit"], "ms");
  EXPECT_TRUE(tj["otherData"]["clock_origin_us"].is_number_integer());
  ASSERT_EQ(tj["traceEvents"].size(), 6u) << t;  // process and 3 thread names, 2 events
  EXPECT_EQ(tj["traceEvents"][0]["args"]["name"], "rank 3");
  EXPECT_EQ(tj["traceEvents"][2]["args"]["name"], "comm");
  const nlohmann::json& e = tj["traceEvents"][4];
  EXPECT_EQ(e["name"], replaced);
  EXPECT_EQ(e["ph"], "X");
  EXPECT_EQ(e["pid"], 3);
  EXPECT_EQ(e["tid"], 1);
  EXPECT_EQ(e["ts"], 10);
  EXPECT_EQ(e["dur"], 15);
  EXPECT_EQ(e["args"]["bytes"], 4096);
  EXPECT_FALSE(tj["traceEvents"][5].contains("args"));
  EXPECT_EQ(std::count(t.begin(), t.end(), '\n'), 8) << "one event a line: " << t;

  dist::FlightRecorder flight;
  flight.set_job("job " + odd);
  flight.set_hosts({"node0", odd});
  flight.set_step(5);
  flight.started(flight.queued("dp@0", 1, odd, 64));
  flight.queued("dp@0", 2, "dp.barrier", 0);
  flight.dump((dir / "flight" / "rank_1.json").string(), 1, 2, "reason " + odd);
  const std::string f = read(dir / "flight" / "rank_1.json");
  const nlohmann::json fj = nlohmann::json::parse(f);
  EXPECT_EQ(fj["job"], "job " + replaced);
  EXPECT_EQ(fj["rank"], 1);
  EXPECT_EQ(fj["world"], 2);
  EXPECT_EQ(fj["reason"], "reason " + replaced);
  EXPECT_EQ(fj["step"], 5);
  EXPECT_TRUE(fj["written_us"].is_number_integer());
  EXPECT_EQ(fj["hosts"], nlohmann::json({"node0", replaced}));
  ASSERT_EQ(fj["entries"].size(), 2u) << f;
  EXPECT_EQ(fj["entries"][0]["what"], replaced);
  EXPECT_EQ(fj["entries"][0]["group"], "dp@0");
  EXPECT_EQ(fj["entries"][0]["bytes"], 64);
  EXPECT_EQ(fj["entries"][0]["state"], "started");
  EXPECT_EQ(fj["entries"][1]["state"], "queued");
  EXPECT_EQ(fj["entries"][1]["seq"], 2);
  EXPECT_EQ(fj["entries"][1]["step"], 5);
  EXPECT_EQ(std::count(f.begin(), f.end(), '\n'), 4) << "one entry a line: " << f;
  fs::remove_all(dir);
}

// A send or receive names its peer; the times the process was not running (over a second
// between the ticks of the thread that ticks the recorder) are listed, one still open when
// the record is written included.
TEST(RunLogs, TheFlightRecordNamesPeersAndTheTimesTheProcessWasNotRunning) {
  const fs::path dir = ndt::testing::fresh_dir("run_logs_paused");
  dist::FlightRecorder flight;
  flight.set_job("job");
  flight.queued("pp@0", 1, "pp.send", 2048, 3);
  flight.queued("world", 1, "world.all_reduce", 8);
  flight.tick();
  flight.tick();  // ticks 0.1 s apart: running
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));
  flight.tick();  // a gap: a pause of 1.2 s
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  flight.dump((dir / "rank_0.json").string(), 0, 4, "a test");  // a pause not ticked away yet
  std::stringstream text;
  text << std::ifstream(dir / "rank_0.json").rdbuf();
  const nlohmann::json r = nlohmann::json::parse(text.str());
  EXPECT_EQ(r["entries"][0]["peer"], 3);
  EXPECT_FALSE(r["entries"][1].contains("peer")) << "a collective has no peer";
  ASSERT_EQ(r["paused"].size(), 2u) << r.dump(1);
  for (const nlohmann::json& p : r["paused"])
    EXPECT_GE(p["to_us"].get<int64_t>() - p["from_us"].get<int64_t>(), 1'000'000);
  EXPECT_LE(r["paused"][0]["to_us"].get<int64_t>(), r["paused"][1]["from_us"].get<int64_t>());
  EXPECT_EQ(r["paused"][1]["to_us"], r["written_us"]);
  fs::remove_all(dir);
}

TEST(Report, OneRankCpuRunHasEveryChartItsMetricsMakeAndSaysWhatIsLeftOut) {
  train::RunHistory h;
  for (int i = 0; i < 20; ++i) h.steps.push_back(step(i));
  h.samples.push_back({20, "<b>a & b</b>"});
  const std::string html =
      train::report_html({"run <1>", "dp_shard=1", {{"train.steps", "20"}}, {"done"}}, h);
  EXPECT_EQ(charts(html), (std::vector<std::string>{"loss", "lr", "grad_norm", "tokens_per_sec",
                                                    "gflops_per_sec", "mem_in_use", "ms"}));
  EXPECT_EQ(points(html, "train"), 20);
  EXPECT_EQ(points(html, "train, smoothed"), 20);
  EXPECT_EQ(points(html, "validation"), -1);
  // left out, each with its reason
  for (const char* m : {"val_loss", "mfu", "comm_bytes"})
    EXPECT_NE(html.find("<p class='absent' data-metric='" + std::string(m) + "'>"), std::string::npos) << m;
  // escaped: title and sample
  EXPECT_NE(html.find("<title>run &lt;1&gt;</title>"), std::string::npos);
  EXPECT_NE(html.find("&lt;b&gt;a &amp; b&lt;/b&gt;"), std::string::npos);
  EXPECT_EQ(html.find("<b>a"), std::string::npos);
  // not UTF-8 (a byte-level sample): U+FFFD, the rest kept
  EXPECT_EQ(train::html_escape("a\xff\xc3\xa9\xe2\x82"), "a\xEF\xBF\xBD\xc3\xa9\xEF\xBF\xBD\xEF\xBF\xBD");
  // self-contained: nothing fetched
  EXPECT_EQ(html.find("http://"), html.find("http://www.w3.org/2000/svg"));
  EXPECT_EQ(html.find("https://"), std::string::npos);
  EXPECT_EQ(html.find("<script"), std::string::npos);
}

TEST(Report, SeveralHostsGpuRunChartsMfuCommunicationAndValidation) {
  train::RunHistory h;
  for (int i = 0; i < 20; ++i) h.steps.push_back(step(i, 4, 1e12, 4096, i % 2 ? 1024 : 0));
  h.val = {{0, 4.1}, {10, 3.2}, {20, 2.5}};
  const std::string html = train::report_html({"t", "dp_shard=4", {}, {}}, h);
  EXPECT_EQ(charts(html), (std::vector<std::string>{"loss", "lr", "grad_norm", "tokens_per_sec", "mfu",
                                                    "mem_in_use", "comm_bytes", "ms"}));
  EXPECT_EQ(points(html, "validation"), 3);
  EXPECT_EQ(points(html, "MFU"), 20);
  EXPECT_EQ(points(html, "sent"), 20);
  EXPECT_EQ(points(html, "across hosts"), 20);
  EXPECT_EQ(html.find("data-metric='val_loss'"), std::string::npos);
  EXPECT_NE(html.find("0.4%</text>"),
            std::string::npos);  // MFU = 1e9 / 0.05 s / 4 / 1e12 = 0.5%: ticks 0 to 0.8%
}

TEST(Report, SmoothingIsTheDebiasedMovingAverage) {
  const std::vector<double> s = train::smoothed({2, 2, 2});
  for (double v : s) EXPECT_DOUBLE_EQ(v, 2);  // debiased: a constant stays itself from the start
  const std::vector<double> t = train::smoothed({0, 10}, 0.5);
  EXPECT_DOUBLE_EQ(t[1], (0.5 * 0.5 * 0 + 0.5 * 10) / (0.5 * 0.5 + 0.5));
}

TEST(Report, LongRunsAreDrawnFromAtMostKMaxDrawnPoints) {
  train::Chart c{"x", "x", train::Unit::kPlain};
  train::Series s{"s", "#000", {}};
  for (int i = 0; i < 10000; ++i) s.points.push_back({static_cast<double>(i), std::sin(i * 0.01)});
  c.series.push_back(s);
  const std::string svg = train::line_chart_svg(c);
  EXPECT_EQ(points(svg, "s"), static_cast<int>(train::kMaxDrawnPoints));
  EXPECT_EQ(svg.find("<circle"), std::string::npos);
}

// The numbers of one attribute across the svg's elements matching `tag` ("<polyline" etc.).
std::vector<double> attribute_values(const std::string& svg, const std::string& tag,
                                     const std::string& attr) {
  std::vector<double> v;
  for (size_t at = svg.find(tag); at != std::string::npos; at = svg.find(tag, at + 1)) {
    const size_t a = svg.find(" " + attr + "='", at), end = svg.find('>', at);
    if (a < end) v.push_back(std::stod(svg.substr(a + attr.size() + 3)));
  }
  return v;
}

// The legend is a band above the plot: no legend element reaches into the plot's frame,
// however many series; an early spike is drawn at the top edge and said, so that the
// rest of the gradient norms keep the chart's height.
TEST(Report, LegendsStayAboveThePlotAndASpikeIsClippedAndSaid) {
  train::Chart c{"m", "memory", train::Unit::kBytes};
  for (const char* name : {"in use", "peak", "a third series with a long name", "fourth"})
    c.series.push_back({name, "#000", {{1, 1e6}, {2, 3e6}, {3, 2e6}}});
  std::string svg = train::line_chart_svg(c);
  const std::vector<double> frame = attribute_values(svg, "<rect x=", "y");  // the plot's frame
  ASSERT_EQ(frame.size(), 1u);
  const std::vector<double> legend_lines = attribute_values(svg, "<line class='legend'", "y1");
  ASSERT_EQ(legend_lines.size(), 4u);
  for (double y : legend_lines) EXPECT_LT(y, frame[0]);
  EXPECT_GT(frame[0], 30.0) << "two rows of legend: " << svg;

  train::Chart n{"grad_norm", "norm", train::Unit::kPlain};
  train::Series s{"grad norm", "#000", {{1, 250.0}}};
  for (int i = 2; i <= 100; ++i) s.points.push_back({static_cast<double>(i), 1.0 + 0.01 * (i % 7)});
  n.series.push_back(s);
  EXPECT_EQ(train::clipped_note(n), "") << "off unless asked";
  EXPECT_FALSE(std::isfinite(train::spike_cap(n)));
  n.clip_spikes = true;
  const double cap = train::spike_cap(n);
  EXPECT_NEAR(cap, 1.5 * 1.06, 1e-9);  // 1.5 x the 98th percentile of the values
  EXPECT_EQ(train::clipped_note(n), "1 value above 1.59 drawn at the top edge (the largest, 250, at step 1)");
  svg = train::line_chart_svg(n);
  EXPECT_EQ(svg.find(">250<"), std::string::npos) << "the axis does not reach the spike";
  EXPECT_NE(svg.find(">1.5<"), std::string::npos) << svg;
  // without a spike nothing is clipped
  n.series[0].points[0].second = 1.0;
  EXPECT_FALSE(std::isfinite(train::spike_cap(n)));
  EXPECT_EQ(train::clipped_note(n), "");
}

}  // namespace
