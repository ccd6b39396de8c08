// ndtrain: fused attention on CUDA through cuDNN's scaled-dot-product attention (flash
// attention, forward and backward), via the cuDNN frontend graph API (no CUDA or cuDNN
// headers here). Legend: B batch, NH heads, NKV key/value heads (NKV divides NH: grouped-query
// attention, query head h with kv head h / (NH/NKV), which cuDNN's SDPA takes natively), Tq
// queries, Tk keys, HS head size.
//
// autograd/ops/attention.cpp is the only caller: it asks sdpa_supported() and otherwise runs
// the composed path (GEMMs + masked softmax), which stays the reference.
//
//   std::string why;
//   if (cuda::sdpa_supported(q, k, v, q_offset, k_offset, &why)) {
//     cuda::sdpa_forward(q, k, v, causal, scale, out, lse);            // out, lse allocated
//     ...
//     cuda::sdpa_backward(q, k, v, out, lse, dout, causal, scale, dq, dk, dv);
//   }
//
// Built without the frontend headers (or without CUDA) sdpa_compiled() is false,
// sdpa_supported() says so, and the other two throw. NDT_SDPA=0 in the environment turns
// the fused path off at run time.
#pragma once

#include <cstdint>
#include <string>

#include "tensor/tensor.h"

namespace ndt::cuda {

bool sdpa_compiled();  // built with NDT_WITH_CUDNN_SDPA (CUDA, libcudnn and the frontend headers)

// Whether attention(q, k, v, q_offset, k_offset) can run fused; if not and why is given, *why
// names the first condition that failed. Fused needs: compiled, NDT_SDPA not "0", q/k/v on
// one CUDA device of compute capability >= 8.0, bf16, k's and v's heads dividing q's,
// HS % 8 == 0 and HS <= 128, the last dim contiguous and the other strides and the data
// 16-byte aligned, and a mask cuDNN can express:
//   causal from the top-left corner: q_offset == k_offset and Tq == Tk, or
//   no mask: every key visible to every query, k_offset + Tk - 1 <= q_offset.
// Anything else (partial diagonals, rows that see no key) goes to the composed path.
// Also refused: Tq == Tk == 1 (cuDNN's backward rejects it).
bool sdpa_supported(const Tensor& q, const Tensor& k, const Tensor& v, int64_t q_offset, int64_t k_offset,
                    std::string* why = nullptr);

// Builds (or finds in the cache) the forward graph and, with backward, the backward graph
// for these q, k, v (shapes and strides), mask and scale. False, with *why, when cuDNN
// cannot build one of them (an unsupported configuration on this cuDNN, an engine that
// fails to compile, a missing library): the failure is cached and attention() takes the
// composed path instead. Call it after sdpa_supported() said yes.
bool sdpa_prepare(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale, bool backward,
                  std::string* why = nullptr);

// q (B,NH,Tq,HS), k and v (B,NKV,Tk,HS) bf16, any strides with the last dim contiguous
//   -> out (B,NH,Tq,HS) bf16 contiguous, lse (B,NH,Tq) f32 contiguous
// lse = log sum_j exp(scale * q_i . k_j) over the visible keys (cuDNN's "Stats", natural log).
// causal: key j visible to query i iff j <= i; else every key is visible. On the device's
// compute stream.
void sdpa_forward(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale,
                  const Tensor& out, const Tensor& lse);

// The gradients of out for a given dout (dlse not included: cuDNN's backward has no input
// for it; see attention.cpp): q, k, v, out, lse as above and as sdpa_forward gave them,
// dout (B,NH,Tq,HS) bf16 contiguous -> dq (B,NH,Tq,HS), dk, dv (B,NKV,Tk,HS) bf16 contiguous
// (dk, dv of a kv head summed over its NH/NKV query heads by cuDNN).
void sdpa_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                   const Tensor& dout, bool causal, double scale, const Tensor& dq, const Tensor& dk,
                   const Tensor& dv);

}  // namespace ndt::cuda
