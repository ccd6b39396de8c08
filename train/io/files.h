// ndtrain: writing files so that a crash never leaves a half-written one in place, and
// checksums to tell when a file changed after it was written.
//
//   io::write_file_atomic("out/latest", "step_00000100\n");
//   io::write_file_atomic("model.safetensors", {header, tensor_bytes_a, tensor_bytes_b});
//   uint64_t h = io::file_xxh64("model.safetensors");   // XXH64, seed 0 (libxxhash)
//
// The pieces are written in order to PATH.tmp, flushed to disk (fsync), and renamed over
// PATH; on any failure the temporary file is removed and PATH is left as it was. A symlink
// given as PATH is followed (chains too, and a dangling one): its target is written that
// way, in the target's folder, and the link stays a link. Only a regular file is ever
// replaced: a character device (/dev/null) or a FIFO with a reader (/dev/stdout piped) is
// written through, and a directory, socket, block device or FIFO with no reader is refused.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

namespace ndt::io {

void write_file_atomic(const std::string& path, const std::vector<std::string_view>& pieces);
inline void write_file_atomic(const std::string& path, std::string_view bytes) {
  write_file_atomic(path, std::vector<std::string_view>{bytes});
}
// Where writing PATH puts its bytes: PATH, or the end of its chain of symlinks (a target
// that does not exist yet included). A link in /proc (/dev/stdout -> /proc/self/fd/1) is not
// followed: it names a process's open file, written through. Anything that renames a file
// onto a path the user gave renames onto this.
std::string output_target(const std::string& path);
// fsync a directory, so that renames into it survive a power loss.
void fsync_dir(const std::string& dir);

// Throws ndt::Error unless `path` is a regular file (not a directory, FIFO or device);
// `what` names it in the message ("config file", "data shard").
void require_regular_file(const std::string& path, const std::string& what);

// A file written line by line (metrics), each line one write(2), so a full disk or an I/O
// error is seen at the line that failed: error() then says what failed, and nothing more
// is written (a record is never left half-written after a good one).
class LineWriter {
 public:
  LineWriter() = default;
  ~LineWriter();
  LineWriter(const LineWriter&) = delete;
  LineWriter& operator=(const LineWriter&) = delete;
  void open(const std::string& path, bool append);  // throws ndt::Error naming the file
  bool is_open() const { return fd_ >= 0; }
  void write_line(const std::string& line);  // adds the newline; records the first failure
  const std::string& error() const { return error_; }

 private:
  int fd_ = -1;
  std::string path_, error_;
};

// XXH64 (Collet's xxHash, 64-bit, seed 0), computed by libxxhash: of bytes, or of a
// file's contents (read a piece at a time).
uint64_t xxh64(const void* data, size_t n);
uint64_t file_xxh64(const std::string& path);  // throws ndt::Error naming the file
std::string hex64(uint64_t v);                 // 16 lowercase hex digits

}  // namespace ndt::io
