// Small helpers shared by the test files.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <string>

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

// An empty directory of its own under the system temp dir, for one test.
inline std::filesystem::path fresh_dir(const std::string& name) {
  namespace fs = std::filesystem;
  fs::path p = fs::temp_directory_path() / ("ndt_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

}  // namespace ndt::testing
