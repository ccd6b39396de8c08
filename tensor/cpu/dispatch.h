// ndtrain CPU kernels: dtype dispatch and load/store helpers shared by tensor/cpu/*.cpp.
//
//   dispatch_float(x.dtype(), "gelu", [&](auto tag) {
//     using T = decltype(tag);            // float, double or bf16
//     using A = acc_t<T>;                 // float for float/bf16, double for double
//     const T* in = x.data<T>();  out[i] = store<T>(f(load(in[i])));
//   });
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "tensor/tensor.h"

namespace ndt::cpu {

template <typename T>
struct Acc {
  using type = float;
};
template <>
struct Acc<double> {
  using type = double;
};
template <typename T>
using acc_t = typename Acc<T>::type;

inline float load(float x) { return x; }
inline double load(double x) { return x; }
inline float load(bf16 x) { return bf16_to_float(x); }
inline float load(int32_t x) { return static_cast<float>(x); }
inline float load(uint16_t x) { return static_cast<float>(x); }

template <typename T>
inline T store(double v);
template <>
inline float store<float>(double v) {
  return static_cast<float>(v);
}
template <>
inline double store<double>(double v) {
  return v;
}
// double -> bf16 in one rounding (to nearest even). Rounding to f32 first could land exactly
// on a bf16 tie and then round the wrong way, so the f32 step rounds to odd instead: f32
// keeps 16 bits more than bf16, and a sticky last bit cannot make a false tie.
inline bf16 double_to_bf16(double v) {
  float f = static_cast<float>(v);
  if (std::isnan(v) || static_cast<double>(f) == v) return float_to_bf16(f);
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if (std::fabs(static_cast<double>(f)) > std::fabs(v)) --u;  // toward zero (inf -> FLT_MAX)
  u |= 1u;                                                    // inexact: sticky bit
  std::memcpy(&f, &u, 4);
  return float_to_bf16(f);
}
template <>
inline bf16 store<bf16>(double v) {
  return double_to_bf16(v);
}
template <>
inline int32_t store<int32_t>(double v) {
  return static_cast<int32_t>(v);
}
template <>
inline uint16_t store<uint16_t>(double v) {
  return static_cast<uint16_t>(v);
}
// float -> T without a detour through double (keeps bf16 rounding single-step).
inline float store_f(float v, float*) { return v; }
inline bf16 store_f(float v, bf16*) { return float_to_bf16(v); }
inline double store_f(double v, double*) { return v; }
template <typename T, typename V>
inline T st(V v) {
  return store_f(v, static_cast<T*>(nullptr));
}

template <typename F>
void dispatch_float(DType dt, const char* op, F&& f) {
  switch (dt) {
    case DType::f32:
      f(float{});
      break;
    case DType::f64:
      f(double{});
      break;
    case DType::bf16:
      f(bf16{});
      break;
    default:
      NDT_FAIL(op, ": dtype ", dtype_name(dt), " is not supported (float32, bfloat16 or float64)");
  }
}

template <typename F>
void dispatch_all(DType dt, const char* op, F&& f) {
  switch (dt) {
    case DType::f32:
      f(float{});
      break;
    case DType::f64:
      f(double{});
      break;
    case DType::bf16:
      f(bf16{});
      break;
    case DType::i32:
      f(int32_t{});
      break;
    case DType::u16:
      f(uint16_t{});
      break;
  }
}

}  // namespace ndt::cpu
