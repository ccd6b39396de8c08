#include "train/io/tensorboard.h"

#include <fcntl.h>
#include <unistd.h>

#include <boost/crc.hpp>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "tensor/error.h"

namespace ndt::io {

// ---- CRC-32C: Boost.CRC ---------------------------------------------------------------
uint32_t crc32c(const void* data, size_t n) {
  // Castagnoli's polynomial, all ones in and out, reflected (as iSCSI and TFRecord use it)
  boost::crc_optimal<32, 0x1EDC6F41, 0xFFFFFFFF, 0xFFFFFFFF, true, true> crc;
  crc.process_bytes(data, n);
  return crc.checksum();
}

uint32_t masked_crc32c(std::string_view bytes) {
  const uint32_t c = crc32c(bytes.data(), bytes.size());
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

// ---- TFRecord framing -----------------------------------------------------------------
namespace {
void put_le(std::string& o, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) o += static_cast<char>((v >> (8 * i)) & 0xFF);
}
}  // namespace

std::string tfrecord(std::string_view payload) {
  std::string len;
  put_le(len, payload.size(), 8);
  std::string o = len;
  put_le(o, masked_crc32c(len), 4);
  o.append(payload);
  put_le(o, masked_crc32c(payload), 4);
  return o;
}

// ---- protobuf wire format: the few fields an Event of scalars has ---------------------------
namespace {
enum Wire { kVarint = 0, kFixed64 = 1, kBytes = 2, kFixed32 = 5 };
void varint(std::string& o, uint64_t v) {
  for (; v >= 0x80; v >>= 7) o += static_cast<char>((v & 0x7F) | 0x80);
  o += static_cast<char>(v);
}
void key(std::string& o, int field, Wire w) { varint(o, (static_cast<uint64_t>(field) << 3) | w); }
void bytes_field(std::string& o, int field, std::string_view b) {
  key(o, field, kBytes);
  varint(o, b.size());
  o.append(b);
}
void double_field(std::string& o, int field, double v) {
  uint64_t u;
  std::memcpy(&u, &v, 8);
  key(o, field, kFixed64);
  put_le(o, u, 8);
}
void float_field(std::string& o, int field, float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  key(o, field, kFixed32);
  put_le(o, u, 4);
}
void int64_field(std::string& o, int field, int64_t v) {
  key(o, field, kVarint);
  varint(o, static_cast<uint64_t>(v));  // int64: negatives as 10-byte two's complement
}
}  // namespace

std::string version_event(double wall_time) {
  std::string e;
  double_field(e, 1, wall_time);       // Event.wall_time
  bytes_field(e, 3, "brain.Event:2");  // Event.file_version
  return e;
}

std::string scalars_event(double wall_time, int64_t step, const Scalars& values) {
  std::string summary;
  for (const auto& [tag, v] : values) {
    std::string value;
    bytes_field(value, 1, tag);                    // Summary.Value.tag
    float_field(value, 2, static_cast<float>(v));  // Summary.Value.simple_value
    bytes_field(summary, 1, value);                // Summary.value (repeated)
  }
  std::string e;
  double_field(e, 1, wall_time);  // Event.wall_time
  int64_field(e, 2, step);        // Event.step
  bytes_field(e, 5, summary);     // Event.summary
  return e;
}

std::string text_event(double wall_time, int64_t step, const std::string& tag, const std::string& text) {
  std::string tensor;
  int64_field(tensor, 1, 7);     // TensorProto.dtype = DT_STRING
  bytes_field(tensor, 2, "");    // TensorProto.tensor_shape: a scalar
  bytes_field(tensor, 8, text);  // TensorProto.string_val
  std::string plugin;
  bytes_field(plugin, 1, "text");  // PluginData.plugin_name
  std::string metadata;
  bytes_field(metadata, 1, plugin);  // SummaryMetadata.plugin_data
  std::string value;
  bytes_field(value, 1, tag);       // Summary.Value.tag
  bytes_field(value, 8, tensor);    // Summary.Value.tensor
  bytes_field(value, 9, metadata);  // Summary.Value.metadata
  std::string summary;
  bytes_field(summary, 1, value);  // Summary.value
  std::string e;
  double_field(e, 1, wall_time);  // Event.wall_time
  int64_field(e, 2, step);        // Event.step
  bytes_field(e, 5, summary);     // Event.summary
  return e;
}

std::string session_start_event(double wall_time, int64_t step) {
  std::string session_log;
  int64_field(session_log, 1, 1);  // SessionLog.status = START
  std::string e;
  double_field(e, 1, wall_time);   // Event.wall_time
  int64_field(e, 2, step);         // Event.step
  bytes_field(e, 7, session_log);  // Event.session_log
  return e;
}

// ---- the file -------------------------------------------------------------------------------
namespace {
double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}
}  // namespace

EventWriter::~EventWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void EventWriter::open(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  NDT_CHECK(!ec, "cannot make the directory ", dir, " (", ec.message(), ")");
  char host[256] = "localhost";
  ::gethostname(host, sizeof(host) - 1);
  const double now = now_seconds();
  // TensorBoard reads every file whose name holds "tfevents", in the order of their names
  path_ = (std::filesystem::path(dir) / ("events.out.tfevents." + std::to_string(static_cast<int64_t>(now)) +
                                         "." + host + "." + std::to_string(::getpid())))
              .string();
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  NDT_CHECK(fd_ >= 0, "cannot write ", path_, " (", std::strerror(errno), ")");
  write_record(version_event(now));
}

void EventWriter::write_scalars(int64_t step, const Scalars& values) {
  write_record(scalars_event(now_seconds(), step, values));
}

void EventWriter::write_text(int64_t step, const std::string& tag, const std::string& text) {
  write_record(text_event(now_seconds(), step, tag, text));
}

void EventWriter::write_session_start(int64_t step) {
  write_record(session_start_event(now_seconds(), step));
}

void EventWriter::write_record(const std::string& payload) {
  if (fd_ < 0 || !error_.empty()) return;
  const std::string r = tfrecord(payload);
  size_t done = 0;
  while (done < r.size()) {
    const ssize_t w = ::write(fd_, r.data() + done, r.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) {
      // a cut record ends TensorBoard's reading of the file at that point; nothing after it
      error_ = "writing " + path_ + " failed (" + std::strerror(errno) + ")";
      return;
    }
    done += static_cast<size_t>(w);
  }
}

}  // namespace ndt::io
