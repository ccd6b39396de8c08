// ndtrain: the checked count the planner's memory formulas are written in
// (train/planner/plan.cpp and the block kinds' descriptions, train/planner/block_kinds.h).
//
//   const Count N = s.N, C = s.C, a = s.act_bytes;
//   Count bytes = 2 * N * C * a;   // every + - * checked: one that does not fit int64 throws
//   bytes.v                        // the value
#pragma once

#include <cstdint>

#include "tensor/checked.h"
#include "tensor/error.h"

namespace ndt::train {

inline constexpr int64_t kF = 4;  // bytes of a float32: statistics, the master, its gradient, AdamW

// A count of elements or bytes whose every +, - and * is checked (tensor/checked.h): sizes
// that do not fit int64 stop the plan with one config error instead of wrapping to
// nonsense ("= 0 ranks", "0 tokens per step"). It converts from int64_t, so the formulas
// read as plain arithmetic; .v is the value.
struct Count {
  int64_t v = 0;
  Count(int64_t x = 0) : v(x) {}  // implicit on purpose
};
inline Count operator+(Count a, Count b) { return checked_add(a.v, b.v, "count"); }
inline Count operator*(Count a, Count b) { return checked_mul(a.v, b.v, "count"); }
inline Count operator-(Count a, Count b) {
  NDT_CHECK(a.v >= b.v, "internal: planned count ", a.v, " - ", b.v, " is negative");
  return a.v - b.v;
}
inline Count operator/(Count a, Count b) { return a.v / b.v; }
inline Count& operator+=(Count& a, Count b) { return a = a + b; }
inline bool operator<(Count a, Count b) { return a.v < b.v; }
inline bool operator>(Count a, Count b) { return a.v > b.v; }
inline bool operator==(Count a, Count b) { return a.v == b.v; }

}  // namespace ndt::train
