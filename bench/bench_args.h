// The benchmarks' command-line numbers: a whole number for an option, all of its text
// (std::stoll alone would take "2x" as 2 and say only "stoll" for "x").
//
//   const int64_t steps = bench::integer("--steps", argv[i + 1]);
#pragma once

#include <charconv>
#include <cstdint>
#include <string>

#include "tensor/error.h"

namespace ndt::bench {

inline int64_t integer(const std::string& what, const std::string& s) {
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  NDT_CHECK(ec == std::errc() && end == s.data() + s.size() && !s.empty(), what,
            " must be a whole number, got '", s, "'");
  return v;
}

}  // namespace ndt::bench
