// ndtrain: TensorBoard scalars, written as TensorFlow event files that `tensorboard --logdir`
// reads while the run goes on.
//
//   io::EventWriter tb;
//   tb.open("out/fortunes/tb");                     // events.out.tfevents.<time>.<host>.<pid>
//   tb.write_scalars(step, {{"loss/train", 2.31}, {"lr", 1e-3}});  // one record, on disk now
//   tb.write_text(step, "samples", "    Q: what is it?");            // the Text tab
//
// The file is a TFRecord stream: each record is
//   uint64 length | uint32 masked_crc32c(length) | payload | uint32 masked_crc32c(payload)
// (little endian), and each payload is an Event protobuf:
//   Event      { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5;
//                SessionLog session_log = 7; }
//   Summary    { repeated Value value = 1; }
//   Value      { string tag = 1; float simple_value = 2; TensorProto tensor = 8;
//                SummaryMetadata metadata = 9; }
//   SessionLog { SessionStatus status = 1; }   (START = 1)
// A text (the samples) is a Value whose tensor is one string (dtype DT_STRING = 7, a scalar
// shape, string_val = 8) and whose metadata names TensorBoard's text plugin
// (plugin_data = 1 { plugin_name = 1: "text" }); TensorBoard renders it as Markdown.
// The first record says file_version "brain.Event:2". A resumed run starts its file with a
// SessionLog START at its first step: TensorBoard then drops what earlier files hold from that
// step on (steps the stopped run logged after its last checkpoint, trained again now).
//
// Written by hand rather than with libprotobuf and a .proto: three messages and six fields
// are ~40 lines of wire-format encoding here, against a protoc step in the build and a
// library every program would link; CRC-32C is Boost.CRC's (headers only). Both are tested
// against known vectors (tests/test_run_logs.cpp), and the files are read back by
// TensorBoard's own reader (tests/scripts/test_tensorboard.sh).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ndt::io {

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), computed by Boost.CRC.
uint32_t crc32c(const void* data, size_t n);
// TFRecord's mask over it: ((crc >> 15) | (crc << 17)) + 0xa282ead8.
uint32_t masked_crc32c(std::string_view bytes);

// One TFRecord: the framing above around `payload`.
std::string tfrecord(std::string_view payload);

using Scalars = std::vector<std::pair<std::string, double>>;  // tag, value (stored as float32)
// Event payloads (protobuf wire format).
std::string version_event(double wall_time);
std::string scalars_event(double wall_time, int64_t step, const Scalars& values);
std::string text_event(double wall_time, int64_t step, const std::string& tag, const std::string& text);
std::string session_start_event(double wall_time, int64_t step);

// An event file in a directory (made when missing). Each write_scalars is one write(2) of
// one record, so TensorBoard sees it at once; the first failure (a full disk) is kept in
// error() and nothing more is written, like io::LineWriter.
class EventWriter {
 public:
  EventWriter() = default;
  ~EventWriter();
  EventWriter(const EventWriter&) = delete;
  EventWriter& operator=(const EventWriter&) = delete;
  void open(const std::string& dir);  // throws ndt::Error naming the directory
  bool is_open() const { return fd_ >= 0; }
  const std::string& path() const { return path_; }
  void write_scalars(int64_t step, const Scalars& values);
  void write_text(int64_t step, const std::string& tag, const std::string& text);  // UTF-8 Markdown
  // A restart at `step`: TensorBoard forgets the run's events from that step on.
  void write_session_start(int64_t step);
  const std::string& error() const { return error_; }

 private:
  void write_record(const std::string& payload);
  int fd_ = -1;
  std::string path_, error_;
};

}  // namespace ndt::io
