// ndtrain: the op kernels, one entry point per kernel, dispatched by device.
//
// Kernels do arithmetic only: the caller (autograd/ops) has checked shapes and dtypes and
// allocated every output. Unless noted, tensors are contiguous (checked here, on every
// backend: a strided view is one clear error, never wrong numbers) and share one dtype
// (f32, bf16 or f64; bf16 is computed in f32; f64 is CPU only) and one device.
// Every kernel here has a CPU version in tensor/cpu/ and a CUDA twin in tensor/cuda/
// with the same file name; tests/test_cuda_ops.cpp compares them.
//
// Shape legend: N rows, C channels, V vocab, B batch, NH heads, T time, HS head size.
#pragma once

#include <cstdint>
#include <vector>

#include "tensor/tensor.h"

namespace ndt::kernels {

// ---- memory (tensor/{cpu,cuda}/copy) -------------------------------------------------
void fill(const Tensor& t, double value);         // t may be strided
void copy(const Tensor& dst, const Tensor& src);  // same shape, any strides and dtypes;
                                                  // same device (cross-device is Tensor::to);
                                                  // dst and src may overlap (as memmove)

// ---- matmul (tensor/{cpu,cuda}/matmul) ---------------------------------------------
// c = alpha * op(a) @ op(b) + beta * c, accumulated in f32 (f64 for f64).
//   2-D: a (M,K) or (K,M) if trans_a; b (K,N) or (N,K) if trans_b; c (M,N)
//   3-D: a (Bt,M,K), b (Bt,K,N) or 2-D b shared by every batch, c (Bt,M,N)
void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c, double alpha = 1.0,
          double beta = 0.0);

// A linear layer's forward, bias and GELU fused where the backend can (tensor/cpu/matmul,
// tensor/cuda/linear: cuBLASLt epilogues): x (M,K) @ w (K,N) + bias (N) -> out (M,N), no bias
// when bias is undefined; with gelu, out = GELU(x @ w + bias) and pre (M,N) = x @ w + bias
// (what the GELU's backward needs). CPU: the bias copied into the output rows, gemm with
// beta 1 onto it (f32, f64; bf16: gemm, then add), then gelu_forward.
void linear_forward(const Tensor& x, const Tensor& w, const Tensor& bias, bool gelu, const Tensor& out,
                    const Tensor& pre);

// ---- elementwise (tensor/{cpu,cuda}/elementwise) ------------------------------------
// b is either a's shape or a row vector broadcast over a's last dim (a bias).
void add(const Tensor& a, const Tensor& b, const Tensor& out, double alpha = 1.0,
         double beta = 1.0);                                          // out = alpha*a + beta*b
void mul(const Tensor& a, const Tensor& b, const Tensor& out);        // out = a*b
void scale(const Tensor& a, double s, const Tensor& out);             // out = s*a
void add_(const Tensor& dst, const Tensor& src, double alpha = 1.0);  // dst += alpha*src
void scale_by(const Tensor& t, const Tensor& s);  // t *= s, s one element (f32; CPU: any float)
// GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
void gelu_forward(const Tensor& x, const Tensor& out);
void gelu_backward(const Tensor& x, const Tensor& dout, const Tensor& dx);  // dx written

// ---- reductions (tensor/{cpu,cuda}/reduce) ------------------------------------------
// out is a one-element f32 or f64 tensor on x's device; accumulation in f64 on CPU and
// f32 (pairwise per block) on CUDA.
void sum(const Tensor& x, const Tensor& out);
void sum_squares(const Tensor& x, const Tensor& out);
// x (N,C) -> out (C): out[c] = sum_n x[n,c]  (bias gradients)
void sum_rows(const Tensor& x, const Tensor& out);

// ---- layernorm (tensor/{cpu,cuda}/layernorm) ----------------------------------------
// x (N,C), w (C), b (C) -> out (N,C), mean (N), rstd (N) (mean/rstd f32, f64 for f64 x)
void layernorm_forward(const Tensor& x, const Tensor& w, const Tensor& b, double eps, const Tensor& out,
                       const Tensor& mean, const Tensor& rstd);
// dout (N,C) -> dx (N,C), dw (C), db (C); all written, not accumulated. With dresidual
// (N,C) defined, dx = the LayerNorm's gradient + dresidual (the residual stream's gradient
// joins in the same pass; see add_layernorm_forward).
void layernorm_backward(const Tensor& dout, const Tensor& x, const Tensor& w, const Tensor& mean,
                        const Tensor& rstd, const Tensor& dx, const Tensor& dw, const Tensor& db,
                        const Tensor& dresidual = Tensor());
// The residual add and the LayerNorm after it in one pass over the rows:
// a, b (N,C) -> sum (N,C) = a + b (rounded to the dtype, as add), then layernorm_forward of
// sum: out (N,C), mean, rstd (N). Bit-equal to add followed by layernorm_forward.
void add_layernorm_forward(const Tensor& a, const Tensor& b, const Tensor& w, const Tensor& bias, double eps,
                           const Tensor& sum, const Tensor& out, const Tensor& mean, const Tensor& rstd);

// ---- RMSNorm (tensor/{cpu,cuda}/rmsnorm) ---------------------------------------------
// x (N,C), w (C) -> out (N,C) = x * rstd * w, rstd (N) = 1 / sqrt(mean_c(x^2) + eps)
// (rstd f32, f64 for f64 x)
void rmsnorm_forward(const Tensor& x, const Tensor& w, double eps, const Tensor& out, const Tensor& rstd);
// dout (N,C) -> dx (N,C), dw (C); written, not accumulated
void rmsnorm_backward(const Tensor& dout, const Tensor& x, const Tensor& w, const Tensor& rstd,
                      const Tensor& dx, const Tensor& dw);

// ---- SwiGLU's gate (tensor/{cpu,cuda}/swiglu) ------------------------------------------
// gate, up (N) -> out (N) = silu(gate) * up, silu(g) = g * sigmoid(g)
void silu_mul_forward(const Tensor& gate, const Tensor& up, const Tensor& out);
// dout (N) -> dgate, dup (N); written
void silu_mul_backward(const Tensor& gate, const Tensor& up, const Tensor& dout, const Tensor& dgate,
                       const Tensor& dup);

// ---- rotary position embedding (tensor/{cpu,cuda}/rotary) --------------------------
// x (B,T,NH,HS), cos, sin (B,T,HS/2) of x's dtype -> out (B,T,NH,HS): the pairs (i, i+HS/2)
// of each head turned by their angle (Hugging Face's rotate_half convention); inverse turns
// them back (the backward). out may not alias x.
void rotary_forward(const Tensor& x, const Tensor& cos, const Tensor& sin, bool inverse, const Tensor& out);

// ---- softmax and cross-entropy (tensor/{cpu,cuda}/softmax) --------------------------
void softmax_forward(const Tensor& x, const Tensor& out);                    // (N,C), rows
void softmax_backward(const Tensor& y, const Tensor& dy, const Tensor& dx);  // dx written
// The loss is the mean over the kept rows (target != ignore_index); every count and scale
// stays on the device, so a training step never waits for the host here.
// targets (N) i32 -> kept (1) i32: the number of entries != ignore_index
void count_not_equal(const Tensor& targets, int64_t ignore_index, const Tensor& kept);
// logits (N,V), targets (N) i32, kept (1) i32 -> losses (N) f32 (f64 for f64 logits), lse
// (N) same. Only the first v_limit columns take part (vocab padding); a row whose target
// equals ignore_index gets loss 0. A target outside [0, v_limit) that is not ignore_index
// throws (on CUDA at the next synchronization: tensor/cuda/common.cuh).
// The fused classifier: when dlogits (N,V) is defined, it also receives the gradient of the
// mean loss for dloss = 1, (softmax(logits) - onehot(target)) / kept, 0 on ignored rows and
// padded columns. dlogits may be logits itself: each row is read before it is overwritten.
void cross_entropy_forward(const Tensor& logits, const Tensor& targets, const Tensor& kept, int64_t v_limit,
                           int64_t ignore_index, const Tensor& losses, const Tensor& lse,
                           const Tensor& dlogits);
// dlogits = (softmax(logits) - onehot(target)) * dloss / kept for kept rows, 0 for ignored
// rows and padded columns; dloss (1) in the statistics' dtype (f32; f64 for f64 logits on the
// CPU), kept (1) i32, both on the device.
void cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                            const Tensor& kept, const Tensor& dloss, int64_t v_limit, int64_t ignore_index,
                            const Tensor& dlogits);
// losses (N), kept (1) i32 -> out (1) = sum(losses) / kept, 0 when kept = 0 (stat dtype)
void mean_of_kept(const Tensor& losses, const Tensor& kept, const Tensor& out);

// ---- embedding (tensor/{cpu,cuda}/embedding) ----------------------------------------
// ids (N) i32, table (V,C) -> out (N,C): out[n] = table[ids[n] - v_start]. The table may be
// rows [v_start, v_start + V) of a vocabulary of v_total ids (a tensor-parallel shard; -1:
// v_start + V): an id of another shard gives a zero row, an id outside [0, v_total) throws
// (on CUDA at the next synchronization).
void embedding_forward(const Tensor& ids, const Tensor& table, const Tensor& out, int64_t v_start = 0,
                       int64_t v_total = -1);
// dtable (V,C) written: dtable[v] = sum over n with ids[n]==v_start+v of dout[n], summed in
// order of n, so the result is deterministic; ids outside the shard add nothing.
void embedding_backward(const Tensor& ids, const Tensor& dout, const Tensor& dtable, int64_t v_start = 0);

// ---- attention pieces (tensor/{cpu,cuda}/attention) ---------------------------------
// Causal attention is composed by autograd/ops from gemm and these two kernels.
// Scores s (Bh,Tq,Tk) are turned in place into probabilities p, with the causal mask:
// query i (global position q_offset+i) sees key j (global position k_offset+j) iff
// k_offset+j <= q_offset+i. lse (Bh,Tq) f32 (f64 for f64) receives the log-sum-exp of
// the scaled, masked scores; a row that sees no key gets p = 0 and lse = -inf.
// key_lo (B, Tq) i32 on s's device (packed documents, ndt::document_key_starts; undefined: none)
// also hides the keys j < key_lo[b, i] from query i: the rows (Bh, Tq) are (B, Bh/B, Tq).
void attention_softmax_forward(const Tensor& s, double scale, int64_t q_offset, int64_t k_offset,
                               const Tensor& lse, const Tensor& key_lo = {});
// In the forward, p = exp(scale*s - lse) (masked). Given dp = dout @ v^T, the row terms
// d (Bh,Tq) = rowsum(dout*out) and the gradient dlse (Bh,Tq) of the lse output (may be
// undefined), writes ds = p * (dp - d + dlse) * scale into dp (in place).
void attention_softmax_backward(const Tensor& p, const Tensor& dp, const Tensor& d, const Tensor& dlse,
                                double scale);
// out (Bh,T,HS), dout (Bh,T,HS) -> d (Bh,T): d = sum over HS of out*dout
void rowwise_dot(const Tensor& a, const Tensor& b, const Tensor& out);
// Causal self-attention on the packed c_attn output, CPU only (CUDA composes the pieces
// above, or runs cuDNN's fused kernel): qkv (B,T,3C) holds q, k, v side by side in each row,
// head h in columns [h HS, (h+1) HS) of each third, HS = C / n_head. Query t sees keys <= t.
//   y (B,T,C) = softmax(scale q k^T, masked) v per head, heads side by side as in qkv;
//   lse (B,n_head,T) the log-sum-exp of each query's scaled, masked scores.
// f32 or f64 (lse in the same dtype). No (T,T) buffer: a block of queries at a time.
// key_lo (B, T) i32 (packed documents; undefined: none): query t sees keys [key_lo[b,t], t].
void self_attention_forward(const Tensor& qkv, int64_t n_head, double scale, const Tensor& y,
                            const Tensor& lse, const Tensor& key_lo = {});
// Its backward from the forward's qkv, y, lse and the gradient dy (B,T,C): writes every
// element of dqkv (B,T,3C) (dq, dk, dv in the layout of qkv); the probabilities are computed
// again from q, k and lse.
void self_attention_backward(const Tensor& qkv, const Tensor& y, const Tensor& lse, const Tensor& dy,
                             int64_t n_head, double scale, const Tensor& dqkv, const Tensor& key_lo = {});
// The same kernel for attention() on the CPU: q (B,NH,Tq,HS), k, v (B,NKV,Tk,HS) with NKV
// dividing NH (grouped-query attention: query head h reads kv head h / (NH/NKV)), with any
// strides but contiguous rows (the last stride 1), the mask of attention_softmax_forward
// (query i sees key j iff k_offset+j <= q_offset+i) ->
//   y (B,NH,Tq,HS) (same row rule), lse (B,NH,Tq) contiguous, in q's dtype (f32 or f64);
// a query that sees no key gets y = 0 and lse = -inf.
// key_lo (B, Tq) i32 as for attention_softmax_forward (undefined: none).
void attention_fused_forward(const Tensor& q, const Tensor& k, const Tensor& v, int64_t q_offset,
                             int64_t k_offset, double scale, const Tensor& y, const Tensor& lse,
                             const Tensor& key_lo = {});
// Its backward from q, k, v, y, lse and the gradients dy (B,NH,Tq,HS) and dlse (B,NH,Tq,
// contiguous; undefined for none): writes every element of dq, dk, dv (shaped as q, k, v);
// dk, dv of a kv head are the sums over its NH/NKV query heads, accumulated in place.
void attention_fused_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& y,
                              const Tensor& lse, const Tensor& dy, const Tensor& dlse, int64_t q_offset,
                              int64_t k_offset, double scale, const Tensor& dq, const Tensor& dk,
                              const Tensor& dv, const Tensor& key_lo = {});
// Merging two partial attention results over disjoint key blocks through their lse (ring
// attention): out_a, out_b, out (Bh,T,HS); lse_a, lse_b, lse (Bh,T) f32 (f64 for f64).
//   lse = logaddexp(lse_a, lse_b),  out = exp(lse_a - lse) out_a + exp(lse_b - lse) out_b
// A row whose lse_a (lse_b) is -inf saw no key in that block and contributes nothing; if
// both are -inf, out = 0 and lse = -inf. Never NaN.
void attention_merge_forward(const Tensor& out_a, const Tensor& lse_a, const Tensor& out_b,
                             const Tensor& lse_b, const Tensor& out, const Tensor& lse);
// The backward, with out and lse the forward's results and w_a = exp(lse_a - lse) (0 where
// lse_a = -inf): from dout (Bh,T,HS) and dlse (Bh,T) (either may be undefined: zero), writes
//   dout_a = w_a dout,  dlse_a = w_a (dlse + sum over HS of dout * (out_a - out)),
// and the same for b (dout_b, dlse_b).
void attention_merge_backward(const Tensor& out_a, const Tensor& lse_a, const Tensor& out_b,
                              const Tensor& lse_b, const Tensor& out, const Tensor& lse, const Tensor& dout,
                              const Tensor& dlse, const Tensor& dout_a, const Tensor& dlse_a,
                              const Tensor& dout_b, const Tensor& dlse_b);

// ---- vocabulary-parallel cross-entropy (tensor/{cpu,cuda}/vocab_parallel) ---------------
// Each tensor-parallel rank holds the logits of a contiguous slice of the vocabulary,
// global columns [v_start, v_start + Vl); its local columns j >= v_live are padded
// vocabulary and never count. With the statistics all-reduced between the calls (by the
// caller, dist/), the loss of row n is
//   gmax = max over ranks of rowmax,  sumexp = sum over ranks of sum_j exp(logit_j - gmax)
//   loss = log(sumexp) + gmax - logit[target]   (target_logit summed over ranks)
// logits (N,Vl) f32, bf16 or f64; targets (N) i32; statistics (N) f32 (f64 for f64).
// Targets are not range-checked here (the caller knows the global vocabulary); v_live
// outside [0, Vl] throws.
// out = max over the live columns j < v_live of logits (-inf if v_live = 0)
void rowmax(const Tensor& logits, int64_t v_live, const Tensor& out);
// sumexp = sum over live columns of exp(logit - gmax); target_logit = logit[target - v_start]
// when that is a live local column, else 0 (0 too for rows whose target is ignore_index).
void cross_entropy_partials(const Tensor& logits, const Tensor& targets, const Tensor& gmax, int64_t v_start,
                            int64_t v_live, int64_t ignore_index, const Tensor& sumexp,
                            const Tensor& target_logit);
// losses (N) = log(sumexp_global) + gmax - target_logit_global, 0 for rows whose target is
// ignore_index (the mean over kept rows is then mean_of_kept with count_not_equal's kept)
void cross_entropy_parallel_losses(const Tensor& gmax, const Tensor& sumexp_global,
                                   const Tensor& target_logit_global, const Tensor& targets,
                                   int64_t ignore_index, const Tensor& losses);
// dlogits (N,Vl) = dloss / kept * (exp(logit - gmax) / sumexp_global - [v_start + j == target])
// on live columns of rows whose target != ignore_index; 0 on padded columns and ignored rows.
// kept (1) i32 and dloss (1) f32 (f64 for f64 logits) on the device: no host round trip.
void cross_entropy_parallel_backward(const Tensor& logits, const Tensor& targets, const Tensor& gmax,
                                     const Tensor& sumexp_global, int64_t v_start, int64_t v_live,
                                     int64_t ignore_index, const Tensor& kept, const Tensor& dloss,
                                     const Tensor& dlogits);

// ---- mixture of experts (tensor/{cpu,cuda}/moe) -------------------------------------
// Legend: N tokens, E experts, k choices per token, M = N*k rows sorted by expert, C channels,
// G groups (experts). order (M) i32: sorted row r holds choice order[r] = n*k + j; slots (M)
// i32 its inverse: choice c sits in sorted row slots[c] (ndt::moe_sort makes order).
// probs (N,E) -> values (N,k) (probs' dtype), experts (N,k) i32: each row's k largest, largest
// first, ties to the lower expert (torch.topk); with normalize, values divided by their sum.
void moe_topk_forward(const Tensor& probs, int64_t k, bool normalize, const Tensor& values,
                      const Tensor& experts);
// dvalues (N,k) -> dprobs (N,E) written (zero off the chosen experts). Forward v_j = p_{e_j}
// (/ S, S = sum_j p_{e_j}, when normalize).
void moe_topk_backward(const Tensor& probs, const Tensor& experts, const Tensor& dvalues, bool normalize,
                       const Tensor& dprobs);
// order (M) i32 -> slots (M) i32, slots[order[r]] = r
void moe_slots(const Tensor& order, const Tensor& slots);
// x (N,C), order (M) -> out (M,C): out[r] = x[order[r] / k]
void moe_dispatch_forward(const Tensor& x, const Tensor& order, int64_t k, const Tensor& out);
// dout (M,C), slots (M) -> dx (N,C) written: dx[n] = sum_j dout[slots[n*k+j]], j in order
void moe_dispatch_backward(const Tensor& dout, const Tensor& slots, int64_t k, const Tensor& dx);
// One GEMM per group of rows: a (M,K) in row blocks of counts (G) rows, b (G,K,N) (or (G,N,K)
// with trans_b) -> c (M,N) written: c_g = a_g @ op(b[g]). Empty groups are skipped. Both are
// gemm on views of each group's block, so one definition serves every backend.
void grouped_gemm(const Tensor& a, const Tensor& b, bool trans_b, const Tensor& c,
                  const std::vector<int64_t>& counts);
// a (M,K), dc (M,N) in row blocks of counts (G) rows -> dw (G,K,N): dw[g] = a_g^T dc_g + beta dw[g]
// (beta 0: written, zero for an empty group; beta 1: added, an empty group's left as it was).
void grouped_gemm_dw(const Tensor& a, const Tensor& dc, const std::vector<int64_t>& counts, const Tensor& dw,
                     double beta = 0.0);
// y (M,C), weights (N,k), slots (M) -> out (N,C): out[n] = sum_j weights[n,j] y[slots[n*k+j]]
void moe_combine_forward(const Tensor& y, const Tensor& weights, const Tensor& slots, const Tensor& out);
// dout (N,C) -> dy (M,C): dy[r] = weights[c] dout[c / k] with c = order[r]; dweights (N,k):
// dweights[n,j] = <dout[n], y[slots[n*k+j]]>. Both written.
void moe_combine_backward(const Tensor& y, const Tensor& weights, const Tensor& dout, const Tensor& order,
                          const Tensor& slots, const Tensor& dy, const Tensor& dweights);

// ---- random fills (tensor/{cpu,cuda}/rng) -------------------------------------------
// Element i of t (contiguous) gets a value that depends only on (seed, stream, start+i):
// counter-based Philox4x32-10, identical on CPU and CUDA. See tensor/rng.h.
void fill_uniform(const Tensor& t, uint64_t seed, uint64_t stream, uint64_t start, float lo, float hi);
void fill_normal(const Tensor& t, uint64_t seed, uint64_t stream, uint64_t start, float mean, float std);

// Dropout with a counter-based mask (LoRA's lora_dropout, nn/lora.h): element (n, c) of x is
// kept when Philox::uniform01 of element dropout_row(key, n) * row_stride + col_start + c of
// (seed, stream) is >= p, and then scaled by 1 / (1 - p); otherwise it is 0. The mask is a
// function of those global indices only, so it is never stored (the backward recomputes it:
// dx = dropout(dy) with the same key) and a rank holding rows or columns of a larger x gets
// exactly the mask of those rows and columns of the whole. 0 <= p < 1.
// A rank whose tokens of a sequence are not one run of it (context parallelism's two chunks,
// Ulysses' part, both under USP) gives their positions in the sequence: x's rows are then
// sequences of `run` tokens, row n the token at position positions[n % run] of the rank's
// sequence n / run, whose whole holds seq_len tokens.
struct DropoutKey {
  double p = 0;
  uint64_t seed = 0, stream = 0;
  int64_t row_start = 0;   // global row of x's row 0 (positions: of the first token of its sequence)
  int64_t row_stride = 0;  // columns of the whole x (>= col_start + x's columns)
  int64_t col_start = 0;   // global column of x's column 0
  const int32_t* positions = nullptr;  // (run) i32 on x's device (ndt::dropout sets it), or nullptr
  int64_t run = 0;                     // with positions: x's rows per sequence
  int64_t seq_len = 0;                 // with positions: the tokens of a whole sequence
};
// The global row of x's row n: row_start + n, or with positions row_start + (n / run) seq_len
// + positions[n % run] (the CPU and CUDA kernels' one formula)
NDT_HD inline int64_t dropout_row(const DropoutKey& k, int64_t n) {
  return k.positions ? k.row_start + (n / k.run) * k.seq_len + k.positions[n % k.run] : k.row_start + n;
}
// x (N, C) contiguous -> out (N, C): out = mask * x / (1 - p)
void dropout(const Tensor& x, const DropoutKey& key, const Tensor& out);

// ---- optimizer (tensor/{cpu,cuda}/adamw) -----------------------------------------
struct AdamWArgs {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
  double grad_scale = 1.0;   // gradients are multiplied by this first (clipping)
  int64_t step = 1;          // 1-based, for bias correction
  int64_t decay_end = 0;     // elements with global index < decay_end take weight decay
  int64_t index_offset = 0;  // global index of element 0 (a shard of a larger buffer)
};
// One AdamW step over a flat buffer, PyTorch's torch.optim.AdamW:
//   g = grad * grad_scale
//   p -= lr * weight_decay * p                     (decoupled; decayed elements only)
//   m = beta1 m + (1 - beta1) g;   v = beta2 v + (1 - beta2) g^2
//   p -= (lr / (1 - beta1^step)) * m / (sqrt(v) / sqrt(1 - beta2^step) + eps)
// param (n) f32 or f64, grad (n) same dtype, m and v (n) same dtype as param.
void adamw_step(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                const AdamWArgs& a);

}  // namespace ndt::kernels
