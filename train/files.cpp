#include "train/files.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "tensor/error.h"

namespace ndt::io {

void write_file_atomic(const std::string& path, const std::vector<std::string_view>& pieces) {
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  NDT_CHECK(fd >= 0, "cannot write ", tmp, " (", std::strerror(errno), ")");
  for (std::string_view piece : pieces) {
    size_t done = 0;
    while (done < piece.size()) {
      const ssize_t w = ::write(fd, piece.data() + done, piece.size() - done);
      if (w < 0) {
        const int err = errno;
        ::close(fd);
        ::unlink(tmp.c_str());
        NDT_FAIL("writing ", tmp, " failed (", std::strerror(err), ")");
      }
      done += static_cast<size_t>(w);
    }
  }
  const bool synced = ::fsync(fd) == 0;
  ::close(fd);
  if (!synced || std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    NDT_FAIL("cannot move ", tmp, " to ", path, " (", std::strerror(err), ")");
  }
}

}  // namespace ndt::io
