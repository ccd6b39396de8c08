// ndtrain: checked integer arithmetic for element counts and byte sizes.
//
// Shapes come from configs and from files; a product that does not fit int64 must fail
// with a message before anything is allocated, never wrap.
//
//   int64_t n = checked_mul(B, T, "micro_batch_size x seq_len");   // throws ndt::Error on overflow
#pragma once

#include <cstdint>
#include <string>

#include "tensor/error.h"

namespace ndt {

// a * b for non-negative counts; throws ndt::Error naming `what` when it overflows int64.
inline int64_t checked_mul(int64_t a, int64_t b, const char* what) {
  int64_t r = 0;
  if (a < 0 || b < 0 || __builtin_mul_overflow(a, b, &r))
    NDT_FAIL(what, ": ", a, " x ", b, " is negative or overflows a 64-bit count");
  return r;
}

inline int64_t checked_add(int64_t a, int64_t b, const char* what) {
  int64_t r = 0;
  if (a < 0 || b < 0 || __builtin_add_overflow(a, b, &r))
    NDT_FAIL(what, ": ", a, " + ", b, " is negative or overflows a 64-bit count");
  return r;
}

}  // namespace ndt
