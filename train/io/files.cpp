#include "train/io/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "tensor/error.h"

namespace ndt::io {

namespace {

// What kind of non-regular file `st` is, for messages.
const char* file_kind(const struct stat& st) {
  return S_ISDIR(st.st_mode)    ? "a directory"
         : S_ISFIFO(st.st_mode) ? "a FIFO"
         : S_ISCHR(st.st_mode)  ? "a character device"
         : S_ISBLK(st.st_mode)  ? "a block device"
         : S_ISSOCK(st.st_mode) ? "a socket"
                                : "not a regular file";
}

void write_all(int fd, const std::string& name, const std::vector<std::string_view>& pieces) {
  for (std::string_view piece : pieces) {
    size_t done = 0;
    while (done < piece.size()) {
      const ssize_t w = ::write(fd, piece.data() + done, piece.size() - done);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) {
        const int err = errno;
        ::close(fd);
        NDT_FAIL("writing ", name, " failed (", std::strerror(err), ")");
      }
      done += static_cast<size_t>(w);
    }
  }
}

}  // namespace

void write_file_atomic(const std::string& path, const std::vector<std::string_view>& pieces) {
  // Only a regular file (or nothing) is replaced. A character device (/dev/null, a terminal)
  // is written through, as tools do; anything else is refused, never replaced by a rename
  // (as root, renaming over /dev/null would turn the system's into a regular file).
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    NDT_CHECK(S_ISCHR(st.st_mode), "cannot write ", path, ": it is ", file_kind(st),
              ", not a regular file; give the path of a file to write");
    const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
    NDT_CHECK(fd >= 0, "cannot write ", path, " (", std::strerror(errno), ")");
    write_all(fd, path, pieces);
    ::close(fd);
    return;
  }
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  NDT_CHECK(fd >= 0, "cannot write ", tmp, " (", std::strerror(errno), ")");
  try {
    write_all(fd, tmp, pieces);
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  const bool synced = ::fsync(fd) == 0;
  const int sync_err = errno;
  const bool closed = ::close(fd) == 0;
  if (!synced || !closed || std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = !synced ? sync_err : errno;
    ::unlink(tmp.c_str());
    NDT_FAIL("cannot move ", tmp, " to ", path, " (", std::strerror(err), ")");
  }
}

void fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return;  // best effort: durability, not correctness, depends on it
  ::fsync(fd);
  ::close(fd);
}

void require_regular_file(const std::string& path, const std::string& what) {
  struct stat st {};
  NDT_CHECK(::stat(path.c_str(), &st) == 0, what, " ", path, ": cannot open (", std::strerror(errno), ")");
  NDT_CHECK(S_ISREG(st.st_mode), what, " ", path, ": not a regular file (",
            file_kind(st), ")");
}

LineWriter::~LineWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void LineWriter::open(const std::string& path, bool append) {
  path_ = path;
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | (append ? O_APPEND : O_TRUNC), 0644);
  NDT_CHECK(fd_ >= 0, "cannot write ", path, " (", std::strerror(errno), ")");
}

void LineWriter::write_line(const std::string& line) {
  if (fd_ < 0 || !error_.empty()) return;
  const std::string s = line + "\n";
  size_t done = 0;
  while (done < s.size()) {
    const ssize_t w = ::write(fd_, s.data() + done, s.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) {
      error_ = "writing " + path_ + " failed (" + std::strerror(errno) + ")";
      // a partial record would corrupt the JSON-lines file: cut it off (best effort)
      if (done > 0) {
        const off_t end = ::lseek(fd_, 0, SEEK_CUR);
        if (end >= static_cast<off_t>(done) && ::ftruncate(fd_, end - static_cast<off_t>(done)) != 0) {
        }
      }
      return;
    }
    done += static_cast<size_t>(w);
  }
}

// ---- XXH64, from the xxHash specification -------------------------------------------
namespace {
constexpr uint64_t P1 = 0x9E3779B185EBCA87ull, P2 = 0xC2B2AE3D27D4EB4Full, P3 = 0x165667B19E3779F9ull,
                   P4 = 0x85EBCA77C2B2AE63ull, P5 = 0x27D4EB2F165667C5ull;
inline uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
inline uint64_t read64(const unsigned char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;  // little-endian hosts (x86-64, aarch64)
}
inline uint32_t read32(const unsigned char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline uint64_t xxround(uint64_t acc, uint64_t input) { return rotl(acc + input * P2, 31) * P1; }
inline uint64_t merge(uint64_t acc, uint64_t val) { return (acc ^ xxround(0, val)) * P1 + P4; }
}  // namespace

void XXH64::update(const void* data, size_t n) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  total_ += n;
  if (buffered_ + n < 32) {
    std::memcpy(buf_ + buffered_, p, n);
    buffered_ += n;
    return;
  }
  if (buffered_) {
    const size_t take = 32 - buffered_;
    std::memcpy(buf_ + buffered_, p, take);
    for (int i = 0; i < 4; ++i) acc_[i] = xxround(acc_[i], read64(buf_ + 8 * i));
    p += take;
    n -= take;
    buffered_ = 0;
  }
  for (; n >= 32; p += 32, n -= 32)
    for (int i = 0; i < 4; ++i) acc_[i] = xxround(acc_[i], read64(p + 8 * i));
  std::memcpy(buf_, p, n);
  buffered_ = n;
}

uint64_t XXH64::digest() const {
  uint64_t h;
  if (total_ >= 32) {
    h = rotl(acc_[0], 1) + rotl(acc_[1], 7) + rotl(acc_[2], 12) + rotl(acc_[3], 18);
    for (int i = 0; i < 4; ++i) h = merge(h, acc_[i]);
  } else {
    h = acc_[2] + P5;  // acc_[2] is the seed (0)
  }
  h += total_;
  const unsigned char* p = buf_;
  size_t n = buffered_;
  for (; n >= 8; p += 8, n -= 8) h = rotl(h ^ xxround(0, read64(p)), 27) * P1 + P4;
  if (n >= 4) {
    h = rotl(h ^ (static_cast<uint64_t>(read32(p)) * P1), 23) * P2 + P3;
    p += 4;
    n -= 4;
  }
  for (; n > 0; ++p, --n) h = rotl(h ^ (*p * P5), 11) * P1;
  h ^= h >> 33;
  h *= P2;
  h ^= h >> 29;
  h *= P3;
  h ^= h >> 32;
  return h;
}

uint64_t xxh64(const void* data, size_t n) {
  XXH64 h;
  h.update(data, n);
  return h.digest();
}

uint64_t file_xxh64(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  NDT_CHECK(fd >= 0, path, ": cannot open (", std::strerror(errno), ")");
  XXH64 h;
  std::vector<char> buf(1 << 20);
  for (;;) {
    const ssize_t r = ::read(fd, buf.data(), buf.size());
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      const int err = errno;
      ::close(fd);
      NDT_FAIL(path, ": read failed (", std::strerror(err), ")");
    }
    if (r == 0) break;
    h.update(buf.data(), static_cast<size_t>(r));
  }
  ::close(fd);
  return h.digest();
}

std::string hex64(uint64_t v) {
  char s[17];
  std::snprintf(s, sizeof(s), "%016llx", static_cast<unsigned long long>(v));
  return s;
}

}  // namespace ndt::io
