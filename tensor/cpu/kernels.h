// ndtrain: the CPU kernels; see tensor/kernels.h for what each one computes.
// Same signatures as ndt::kernels, which dispatches here by device.
#pragma once

#include <cstdint>
#include <vector>

#include "tensor/kernels.h"
#include "tensor/tensor.h"

namespace ndt::cpu {

void fill(const Tensor& t, double value);
void copy(const Tensor& dst, const Tensor& src);
void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c, double alpha,
          double beta);
// gemm for 2-D operands whose row count changes from call to call (see matmul.cpp)
void gemm_any_rows(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c,
                   double alpha, double beta);
// kernels::grouped_gemm and grouped_gemm_dw's GEMMs (their groups with rows; see matmul.cpp)
void grouped_gemm(const Tensor& a, const Tensor& b, bool trans_b, const Tensor& c,
                  const std::vector<int64_t>& counts);
void grouped_gemm_dw(const Tensor& a, const Tensor& dc, const std::vector<int64_t>& counts, const Tensor& dw,
                     double beta);
void linear_forward(const Tensor& x, const Tensor& w, const Tensor& bias, bool gelu, const Tensor& out,
                    const Tensor& pre);
void add(const Tensor& a, const Tensor& b, const Tensor& out, double alpha, double beta);
void mul(const Tensor& a, const Tensor& b, const Tensor& out);
void scale(const Tensor& a, double s, const Tensor& out);
void add_(const Tensor& dst, const Tensor& src, double alpha);
void scale_by(const Tensor& t, const Tensor& s);
void gelu_forward(const Tensor& x, const Tensor& out);
void gelu_backward(const Tensor& x, const Tensor& dout, const Tensor& dx);
void rmsnorm_forward(const Tensor& x, const Tensor& w, double eps, const Tensor& out, const Tensor& rstd);
void rmsnorm_backward(const Tensor& dout, const Tensor& x, const Tensor& w, const Tensor& rstd,
                      const Tensor& dx, const Tensor& dw);
void silu_mul_forward(const Tensor& gate, const Tensor& up, const Tensor& out);
void silu_mul_backward(const Tensor& gate, const Tensor& up, const Tensor& dout, const Tensor& dgate,
                       const Tensor& dup);
void rotary_forward(const Tensor& x, const Tensor& cos, const Tensor& sin, bool inverse, const Tensor& out);
void sum(const Tensor& x, const Tensor& out);
void sum_squares(const Tensor& x, const Tensor& out);
void sum_rows(const Tensor& x, const Tensor& out);
void layernorm_forward(const Tensor& x, const Tensor& w, const Tensor& b, double eps, const Tensor& out,
                       const Tensor& mean, const Tensor& rstd);
void layernorm_backward(const Tensor& dout, const Tensor& x, const Tensor& w, const Tensor& mean,
                        const Tensor& rstd, const Tensor& dx, const Tensor& dw, const Tensor& db,
                        const Tensor& dresidual);
void add_layernorm_forward(const Tensor& a, const Tensor& b, const Tensor& w, const Tensor& bias, double eps,
                           const Tensor& sum, const Tensor& out, const Tensor& mean, const Tensor& rstd);
void softmax_forward(const Tensor& x, const Tensor& out);
void softmax_backward(const Tensor& y, const Tensor& dy, const Tensor& dx);
void cross_entropy_forward(const Tensor& logits, const Tensor& targets, const Tensor& kept, int64_t v_limit,
                           int64_t ignore_index, const Tensor& losses, const Tensor& lse,
                           const Tensor& dlogits);
void cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                            const Tensor& kept, const Tensor& dloss, int64_t v_limit, int64_t ignore_index,
                            const Tensor& dlogits);
void mean_of_kept(const Tensor& losses, const Tensor& kept, const Tensor& out);
void count_not_equal(const Tensor& targets, int64_t ignore_index, const Tensor& kept);
void embedding_forward(const Tensor& ids, const Tensor& table, const Tensor& out, int64_t v_start,
                       int64_t v_total);
void embedding_backward(const Tensor& ids, const Tensor& dout, const Tensor& dtable, int64_t v_start);
void attention_softmax_forward(const Tensor& s, double scale, int64_t q_offset, int64_t k_offset,
                               const Tensor& lse, const Tensor& key_lo);
void attention_softmax_backward(const Tensor& p, const Tensor& dp, const Tensor& d, const Tensor& dlse,
                                double scale);
void rowwise_dot(const Tensor& a, const Tensor& b, const Tensor& out);
void self_attention_forward(const Tensor& qkv, int64_t n_head, double scale, const Tensor& y,
                            const Tensor& lse, const Tensor& key_lo);
void self_attention_backward(const Tensor& qkv, const Tensor& y, const Tensor& lse, const Tensor& dy,
                             int64_t n_head, double scale, const Tensor& dqkv, const Tensor& key_lo);
void attention_fused_forward(const Tensor& q, const Tensor& k, const Tensor& v, int64_t q_offset,
                             int64_t k_offset, double scale, const Tensor& y, const Tensor& lse,
                             const Tensor& key_lo);
void attention_fused_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& y,
                              const Tensor& lse, const Tensor& dy, const Tensor& dlse, int64_t q_offset,
                              int64_t k_offset, double scale, const Tensor& dq, const Tensor& dk,
                              const Tensor& dv, const Tensor& key_lo);
void attention_merge_forward(const Tensor& out_a, const Tensor& lse_a, const Tensor& out_b,
                             const Tensor& lse_b, const Tensor& out, const Tensor& lse);
void attention_merge_backward(const Tensor& out_a, const Tensor& lse_a, const Tensor& out_b,
                              const Tensor& lse_b, const Tensor& out, const Tensor& lse, const Tensor& dout,
                              const Tensor& dlse, const Tensor& dout_a, const Tensor& dlse_a,
                              const Tensor& dout_b, const Tensor& dlse_b);
void rowmax(const Tensor& logits, int64_t v_live, const Tensor& out);
void cross_entropy_partials(const Tensor& logits, const Tensor& targets, const Tensor& gmax, int64_t v_start,
                            int64_t v_live, int64_t ignore_index, const Tensor& sumexp,
                            const Tensor& target_logit);
void cross_entropy_parallel_backward(const Tensor& logits, const Tensor& targets, const Tensor& gmax,
                                     const Tensor& sumexp_global, int64_t v_start, int64_t v_live,
                                     int64_t ignore_index, const Tensor& kept, const Tensor& dloss,
                                     const Tensor& dlogits);
void cross_entropy_parallel_losses(const Tensor& gmax, const Tensor& sumexp_global,
                                   const Tensor& target_logit_global, const Tensor& targets,
                                   int64_t ignore_index, const Tensor& losses);
void fill_uniform(const Tensor& t, uint64_t seed, uint64_t stream, uint64_t start, float lo, float hi);
void dropout(const Tensor& x, const kernels::DropoutKey& key, const Tensor& out);
void fill_normal(const Tensor& t, uint64_t seed, uint64_t stream, uint64_t start, float mean, float std);
void adamw_step(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                const kernels::AdamWArgs& a);

// Helpers of the kernels above (not dispatched): contiguous bf16 <-> f32 runs on one thread,
// vectorized (AVX-512 / AVX2 clones), the same bits as bf16_to_float / float_to_bf16.
void bf16_to_f32(const bf16* src, float* dst, int64_t n);
void f32_to_bf16(const float* src, bf16* dst, int64_t n);
// sum_c a[c] b[c] in fixed vector lanes: the same bits at every vector width (rmsnorm.cpp)
float dot_f32(const float* a, const float* b, int64_t n);

void moe_topk_forward(const Tensor& probs, int64_t k, bool normalize, const Tensor& values,
                      const Tensor& experts);
void moe_topk_backward(const Tensor& probs, const Tensor& experts, const Tensor& dvalues, bool normalize,
                       const Tensor& dprobs);
void moe_slots(const Tensor& order, const Tensor& slots);
void moe_dispatch_forward(const Tensor& x, const Tensor& order, int64_t k, const Tensor& out);
void moe_dispatch_backward(const Tensor& dout, const Tensor& slots, int64_t k, const Tensor& dx);
void moe_combine_forward(const Tensor& y, const Tensor& weights, const Tensor& slots, const Tensor& out);
void moe_combine_backward(const Tensor& y, const Tensor& weights, const Tensor& dout, const Tensor& order,
                          const Tensor& slots, const Tensor& dy, const Tensor& dweights);

}  // namespace ndt::cpu
