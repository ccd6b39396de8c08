// ndtrain: the one error type and the check macros.
//
// Every user-reachable failure throws ndt::Error with a message that names what is
// wrong (op, shapes, dtypes, devices, keys, paths) and, where possible, how to fix it.
//
//   NDT_CHECK(a.dim() == 2, "matmul: expected a 2-D tensor, got ", a.shape_str());
//
// The message carries file:line so a report points at the check that fired.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace ndt {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
template <typename... Args>
std::string cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
[[noreturn]] void throw_error(const char* file, int line, const std::string& msg);
}  // namespace detail

}  // namespace ndt

// Throws ndt::Error("msg... (file:line)") when cond is false.
#define NDT_CHECK(cond, ...)                                                                      \
  do {                                                                                            \
    if (!(cond)) ::ndt::detail::throw_error(__FILE__, __LINE__, ::ndt::detail::cat(__VA_ARGS__)); \
  } while (0)

#define NDT_FAIL(...) ::ndt::detail::throw_error(__FILE__, __LINE__, ::ndt::detail::cat(__VA_ARGS__))
