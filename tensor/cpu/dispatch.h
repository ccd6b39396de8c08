// ndtrain CPU kernels: dtype dispatch and load/store helpers shared by tensor/cpu/*.cpp.
//
//   dispatch_float(x.dtype(), "gelu", [&](auto tag) {
//     using T = decltype(tag);            // float, double or bf16
//     using A = acc_t<T>;                 // float for float/bf16, double for double
//     const T* in = x.data<T>();  out[i] = store<T>(f(load(in[i])));
//   });
#pragma once

#include <cstdint>

#include "tensor/tensor.h"

namespace ndt::cpu {

template <typename T> struct Acc { using type = float; };
template <> struct Acc<double> { using type = double; };
template <typename T> using acc_t = typename Acc<T>::type;

inline float load(float x) { return x; }
inline double load(double x) { return x; }
inline float load(bf16 x) { return bf16_to_float(x); }
inline float load(int32_t x) { return static_cast<float>(x); }
inline float load(uint16_t x) { return static_cast<float>(x); }

template <typename T> inline T store(double v);
template <> inline float store<float>(double v) { return static_cast<float>(v); }
template <> inline double store<double>(double v) { return v; }
template <> inline bf16 store<bf16>(double v) { return float_to_bf16(static_cast<float>(v)); }
template <> inline int32_t store<int32_t>(double v) { return static_cast<int32_t>(v); }
template <> inline uint16_t store<uint16_t>(double v) { return static_cast<uint16_t>(v); }
// float -> T without a detour through double (keeps bf16 rounding single-step).
inline float store_f(float v, float*) { return v; }
inline bf16 store_f(float v, bf16*) { return float_to_bf16(v); }
inline double store_f(double v, double*) { return v; }
template <typename T, typename V> inline T st(V v) { return store_f(v, static_cast<T*>(nullptr)); }

template <typename F>
void dispatch_float(DType dt, const char* op, F&& f) {
  switch (dt) {
    case DType::f32: f(float{}); break;
    case DType::f64: f(double{}); break;
    case DType::bf16: f(bf16{}); break;
    default: NDT_FAIL(op, ": dtype ", dtype_name(dt), " is not supported (float32, bfloat16 or float64)");
  }
}

template <typename F>
void dispatch_all(DType dt, const char* op, F&& f) {
  switch (dt) {
    case DType::f32: f(float{}); break;
    case DType::f64: f(double{}); break;
    case DType::bf16: f(bf16{}); break;
    case DType::i32: f(int32_t{}); break;
    case DType::u16: f(uint16_t{}); break;
  }
}

}  // namespace ndt::cpu
