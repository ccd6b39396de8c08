// bf16 GEMMs through oneDNN on CPUs with bf16 instructions, and f32 GEMMs where oneDNN was
// measured faster than OpenBLAS (tensor/cpu/onednn_gemm.cpp).
#pragma once

#include <string>

#include "tensor/tensor.h"

namespace ndt::cpu {

// True when this build has oneDNN and its bf16 matmul runs on the CPU's own bf16 units
// (AVX512-BF16 or AMX), not an emulation.
bool bf16_gemm_native();

// Whether the CPU's bf16 GEMMs go to oneDNN: NDT_BF16_GEMM=onednn or f32 (convert both
// operands, sgemm, round), unset or auto: bf16_gemm_native(). Read at each call (the tests
// switch it); another value throws naming it. tensor/cpu/matmul.cpp and the planner's
// memory model (the f32 path's converted copies) both ask this.
bool bf16_gemm_on_onednn();

// What runs a bf16 matmul here, in words ("oneDNN brg:avx512_core_bf16", "none (...)").
std::string bf16_gemm_library();

// True where oneDNN's f32 matmul was measured faster than OpenBLAS on this kind of CPU (an AMD
// CPU on which oneDNN runs f32 on its AVX-512 brgemm kernels); false without oneDNN.
bool f32_gemm_prefers_onednn();

// Whether the CPU's f32 GEMMs go to oneDNN: NDT_F32_GEMM=onednn or openblas, unset or auto:
// f32_gemm_prefers_onednn(). Read at each call (the tests switch it); another value throws
// naming it. Every program on one machine, with one environment, takes the same path, so
// their results agree bit for bit (resume, the tests against train_gpt).
bool f32_gemm_on_onednn();

// The CPU's GEMM kernels in words, what decides the last bits of a CPU run's numbers:
// "OpenBLAS kernel Haswell", and ", f32 GEMMs on oneDNN ..." where they go there.
std::string gemm_libraries();

// What runs an f32 matmul here, in words ("OpenBLAS kernel SkylakeX", "oneDNN brg:avx512_core").
std::string f32_gemm_library();

// c = alpha op(a) @ op(b) [+ bias] + beta c; a, b, bias all bf16 or all f32, c in their dtype
// or f32, contiguous; the same shapes as ndt::kernels::gemm (a 2-D or 3-D, b 2-D shared by
// every batch or 3-D).
void onednn_gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c, float alpha,
                 float beta, const Tensor& bias = Tensor());

// The same for 2-D f32 operands whose row count (a's rows: m, or k with trans_a) changes from
// call to call (a grouped GEMM's groups): one primitive for every row count, built once.
void onednn_gemm_any_rows(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c,
                          float alpha, float beta);

}  // namespace ndt::cpu
