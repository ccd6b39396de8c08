// ndtrain: element types and devices.
//
//   DType: f32, bf16 (stored as 16 bits, computed in f32), f64 (CPU; gradient checks),
//          i32 (token ids, targets), u16 (token shards on disk).
//   Device: cpu or cuda:N.   Device::parse("cuda:1") -> {kCUDA, 1}
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

namespace ndt {

enum class DType : uint8_t { f32, bf16, f64, i32, u16 };

size_t dtype_size(DType t);
const char* dtype_name(DType t);            // "float32", "bfloat16", ...
DType dtype_from_name(const std::string&);  // accepts "float32"/"f32", "bfloat16"/"bf16", ...
inline bool is_floating(DType t) { return t == DType::f32 || t == DType::bf16 || t == DType::f64; }

// bfloat16: the top 16 bits of an IEEE float32. Conversion rounds to nearest even;
// NaN stays NaN. Usable from host and device code.
struct bf16 {
  uint16_t bits;
};

#if defined(__CUDACC__)
#define NDT_HD __host__ __device__
#else
#define NDT_HD
#endif

NDT_HD inline float bf16_to_float(bf16 h) {
  uint32_t u = static_cast<uint32_t>(h.bits) << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

NDT_HD inline bf16 float_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{static_cast<uint16_t>((u >> 16) | 0x40)};  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
  return bf16{static_cast<uint16_t>(u >> 16)};
}

struct Device {
  enum Kind : uint8_t { kCPU, kCUDA };
  Kind kind = kCPU;
  int index = 0;

  static Device cpu() { return {kCPU, 0}; }
  static Device cuda(int i = 0) { return {kCUDA, i}; }
  static Device parse(const std::string& s);  // "cpu", "cuda", "cuda:3"
  bool is_cpu() const { return kind == kCPU; }
  bool is_cuda() const { return kind == kCUDA; }
  bool operator==(const Device& o) const { return kind == o.kind && (kind == kCPU || index == o.index); }
  bool operator!=(const Device& o) const { return !(*this == o); }
  std::string str() const;
};

}  // namespace ndt
