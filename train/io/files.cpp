#include "train/io/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <vector>

#include "tensor/error.h"

namespace ndt::io {

namespace fs = std::filesystem;

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

std::string output_target(const std::string& path) {
  fs::path p = path;
  for (int hops = 0;; ++hops) {
    struct stat lst {};
    if (::lstat(p.c_str(), &lst) != 0 || !S_ISLNK(lst.st_mode)) return p.string();
    NDT_CHECK(hops < 40, "cannot write ", path, ": more than 40 symlinks in a row (a loop?)");
    std::error_code ec;
    const fs::path dir = fs::weakly_canonical(fs::absolute(p).parent_path(), ec);
    NDT_CHECK(!ec, "cannot write ", path, ": cannot resolve ", p.string(), " (", ec.message(), ")");
    // a link in /proc (/dev/stdout -> /proc/self/fd/1) stands for a process's open file: its
    // target ("pipe:[123]", a file the shell opened) is written through, never renamed over
    if (dir.string().rfind("/proc/", 0) == 0) return p.string();
    const fs::path to = fs::read_symlink(p, ec);
    NDT_CHECK(!ec, "cannot write ", path, ": cannot read the symlink ", p.string(), " (", ec.message(), ")");
    p = (to.is_absolute() ? to : dir / to).lexically_normal();
  }
}

void write_file_atomic(const std::string& path, const std::vector<std::string_view>& pieces) {
  // A symlink is followed: the file written is its target, the link stays a link. Only a
  // regular file (or nothing) is replaced. A character device (/dev/null, a terminal) or a
  // FIFO with a reader (a pipe) is written through, as tools do; anything else is refused,
  // never replaced by a rename (as root, renaming over /dev/null would turn the system's
  // into a regular file).
  const std::string target = output_target(path);
  const bool in_proc = fs::absolute(target).lexically_normal().string().rfind("/proc/", 0) == 0;
  struct stat st {};
  if (::stat(target.c_str(), &st) == 0 && (!S_ISREG(st.st_mode) || in_proc)) {
    const bool fifo = S_ISFIFO(st.st_mode);
    NDT_CHECK(S_ISCHR(st.st_mode) || fifo || S_ISREG(st.st_mode), "cannot write ", path, ": it is ",
              file_kind(st), ", not a regular file; give the path of a file to write");
    // O_NONBLOCK: a FIFO with no reader fails (ENXIO) rather than waits forever
    // a file a process opened (/dev/stdout > out.html) is appended to, its earlier lines kept
    const int mode = in_proc && S_ISREG(st.st_mode) ? O_APPEND : O_TRUNC;
    const int fd = ::open(target.c_str(), O_WRONLY | mode | O_CLOEXEC | (fifo ? O_NONBLOCK : 0));
    NDT_CHECK(fd >= 0 || !(fifo && errno == ENXIO), "cannot write ", path, ": it is a FIFO with no reader");
    NDT_CHECK(fd >= 0, "cannot write ", path, " (", std::strerror(errno), ")");
    if (fifo) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    write_all(fd, path, pieces);
    ::close(fd);
    return;
  }
  const std::string tmp = target + ".tmp";  // in the target's folder: the rename stays there
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
  if (!synced || !closed || std::rename(tmp.c_str(), target.c_str()) != 0) {
    const int err = !synced ? sync_err : errno;
    ::unlink(tmp.c_str());
    NDT_FAIL("cannot move ", tmp, " to ", target, " (", std::strerror(err), ")");
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
  NDT_CHECK(S_ISREG(st.st_mode), what, " ", path, ": not a regular file (", file_kind(st), ")");
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

// ---- XXH64: libxxhash (Debian's libxxhash-dev) ----------------------------------------
uint64_t xxh64(const void* data, size_t n) { return XXH64(data, n, 0); }

uint64_t file_xxh64(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  NDT_CHECK(fd >= 0, path, ": cannot open (", std::strerror(errno), ")");
  const std::unique_ptr<XXH64_state_t, XXH_errorcode (*)(XXH64_state_t*)> h(XXH64_createState(),
                                                                            XXH64_freeState);
  if (!h || XXH64_reset(h.get(), 0) != XXH_OK) {
    ::close(fd);
    NDT_FAIL(path, ": cannot start its checksum (out of memory)");
  }
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
    XXH64_update(h.get(), buf.data(), static_cast<size_t>(r));
  }
  ::close(fd);
  return XXH64_digest(h.get());
}

std::string hex64(uint64_t v) {
  char s[17];
  std::snprintf(s, sizeof(s), "%016llx", static_cast<unsigned long long>(v));
  return s;
}

}  // namespace ndt::io
