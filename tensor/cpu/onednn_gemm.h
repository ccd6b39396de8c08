// bf16 GEMMs through oneDNN on CPUs with bf16 instructions (tensor/cpu/onednn_gemm.cpp).
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

// c = alpha op(a) @ op(b) [+ bias] + beta c; a, b, bias bf16, c bf16 or f32, contiguous; the
// same shapes as ndt::kernels::gemm (a 2-D or 3-D, b 2-D shared by every batch or 3-D).
void onednn_gemm_bf16(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c,
                      float alpha, float beta, const Tensor& bias = Tensor());

}  // namespace ndt::cpu
