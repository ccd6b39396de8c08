// Small helpers shared by the test files.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "tensor/error.h"

namespace ndt::testing {

// The message of the ndt::Error that f throws; a test failure (and "") when f throws
// nothing or another exception type.
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw a non-ndt exception: " << e.what();
    return "";
  }
  ADD_FAILURE() << "no ndt::Error thrown";
  return "";
}

// The folders fresh_dir made in this process. They are removed when the process ends, whether
// its tests passed or failed; with NDT_KEEP_TEST_DIRS=1 in the environment they are kept
// (and named on stderr) for a look at what a failing test left, until a test process runs
// without it: folders of earlier test processes that are gone (kept ones, or those of a
// crash or a ctest timeout) are swept away when its first folder is made.
class TempDirs {
 public:
  TempDirs() : owner_(::getpid()) {
    if (!keep()) sweep();
  }
  ~TempDirs() {
    // a forked child (a death test) must not remove the folders its parent still uses
    if (::getpid() != owner_ || dirs_.empty()) return;
    if (keep()) {
      for (const auto& d : dirs_) std::fprintf(stderr, "[ndt] kept %s (NDT_KEEP_TEST_DIRS=1)\n", d.c_str());
      return;
    }
    std::error_code ec;
    for (const auto& d : dirs_) std::filesystem::remove_all(d, ec);
    if (::testing::UnitTest::GetInstance()->Failed())
      std::fprintf(stderr, "[ndt] removed this test's folders under %s; NDT_KEEP_TEST_DIRS=1 keeps them\n",
                   std::filesystem::temp_directory_path(ec).c_str());
  }
  TempDirs(const TempDirs&) = delete;
  TempDirs& operator=(const TempDirs&) = delete;
  void add(const std::filesystem::path& d) { dirs_.push_back(d); }

 private:
  static bool keep() {
    const char* k = std::getenv("NDT_KEEP_TEST_DIRS");
    return k != nullptr && std::string(k) == "1";
  }
  // `ndt_test_*_<pid>` folders of this user whose process is gone
  static void sweep() {
    namespace fs = std::filesystem;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(fs::temp_directory_path(ec), ec)) {
      const std::string n = e.path().filename().string();
      const size_t u = n.rfind('_');
      if (!n.starts_with("ndt_test_") || u == std::string::npos || u + 1 == n.size()) continue;
      if (n.find_first_not_of("0123456789", u + 1) != std::string::npos) continue;
      if (fs::exists("/proc/" + n.substr(u + 1), ec)) continue;  // its process still runs
      if (::access(e.path().c_str(), W_OK) != 0) continue;       // another user's
      fs::remove_all(e.path(), ec);
    }
  }
  pid_t owner_;
  std::vector<std::filesystem::path> dirs_;
};
inline TempDirs& temp_dirs() {
  static TempDirs d;
  return d;
}

// An empty directory of its own under the system temp dir, for one test (or one suite),
// removed when the test process ends (see TempDirs).
inline std::filesystem::path fresh_dir(const std::string& name) {
  namespace fs = std::filesystem;
  fs::path p = fs::temp_directory_path() / ("ndt_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  temp_dirs().add(p);
  return p;
}

// Every entry under dir (recursively), by path: a file with its bytes, anything else (a
// directory, a dangling link) as "(not a file)"; no entries when dir does not exist. Two
// snapshots compare equal when nothing under dir was added, removed or changed:
//   const auto before = snapshot(ck);  ...a run that must fail cleanly...
//   EXPECT_EQ(snapshot(ck), before);
inline std::map<std::string, std::string> snapshot(const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  std::map<std::string, std::string> s;
  if (!fs::exists(dir)) return s;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file()) {
      s[e.path().string()] = "(not a file)";
      continue;
    }
    std::ifstream f(e.path(), std::ios::binary);
    std::stringstream bytes;
    bytes << f.rdbuf();
    s[e.path().string()] = bytes.str();
  }
  return s;
}

// The immutable attribute (chattr +i) on a file for the guard's lifetime: not even root can
// delete it, so the directory holding it cannot be removed either -- a real failing delete.
// error() says why the attribute could not be set (a filesystem without it, no
// CAP_LINUX_IMMUTABLE); tests skip then.
class Immutable {
 public:
  explicit Immutable(std::filesystem::path path) : path_(std::move(path)) { error_ = set(true); }
  ~Immutable() {
    if (error_.empty()) set(false);
  }
  Immutable(const Immutable&) = delete;
  Immutable& operator=(const Immutable&) = delete;
  const std::string& error() const { return error_; }

 private:
  std::string set(bool on) const {
    const int fd = ::open(path_.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return "open " + path_.string() + ": " + std::strerror(errno);
    int flags = 0;
    std::string err;
    if (::ioctl(fd, FS_IOC_GETFLAGS, &flags) != 0) {
      err = std::string("FS_IOC_GETFLAGS: ") + std::strerror(errno);
    } else {
      flags = on ? flags | FS_IMMUTABLE_FL : flags & ~FS_IMMUTABLE_FL;
      if (::ioctl(fd, FS_IOC_SETFLAGS, &flags) != 0)
        err = std::string("FS_IOC_SETFLAGS: ") + std::strerror(errno);
    }
    ::close(fd);
    return err;
  }
  std::filesystem::path path_;
  std::string error_;
};

}  // namespace ndt::testing
