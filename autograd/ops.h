// ndtrain: the differentiable ops. Each computes its result with tensor/kernels.h and
// records its backward beside it (autograd/node.h). Sources: autograd/ops/*.cpp, one file
// per family, forward and backward side by side.
//
//   Tensor h = ndt::gelu(ndt::linear(x, w, b));     // x (N,C), w (C,OC), b (OC)
//   Tensor loss = ndt::cross_entropy(logits, targets);
//   ndt::backward(loss);
//
// Shape legend: N rows, C channels, OC output channels, V vocab, B batch, T time,
// NH heads, HS head size. Inputs of one op share dtype (f32, bf16 or f64) and device;
// ops check this and throw ndt::Error naming the op, shapes and dtypes otherwise.
// Outputs are contiguous. Gradients flow to every floating input that requires grad.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "tensor/kernels.h"
#include "tensor/tensor.h"

namespace ndt {

// ---- matmul (ops/matmul.cpp) -----------------------------------------------------
// a (M,K) @ b (K,N) -> (M,N); a (Bt,M,K) @ b (Bt,K,N) -> (Bt,M,N); a (Bt,M,K) @ b (K,N)
// -> (Bt,M,N). trans_a / trans_b use the transposed last two dims of a / b.
Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false);
// x (..., C) @ w (C, OC) + b (OC) -> (..., OC). w is stored in x out (GPT-2 Conv1D) layout.
// b may be undefined (no bias).
// One node: on CUDA the bias is a cuBLASLt epilogue of the GEMM (kernels::linear_forward).
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b);
// gelu(linear(x, w, b)) as one node, the bias and GELU fused into the GEMM where the backend
// can; keeps the pre-activation for the backward (as gelu() keeps its input).
Tensor linear_gelu(const Tensor& x, const Tensor& w, const Tensor& b);

// A collective started on a tensor: the Pending it returns waits for it and gives the result.
using Pending = std::function<Tensor()>;
using StartFn = std::function<Pending(const Tensor&)>;

// The collectives on the input of a layer whose input every rank of a group holds (a
// column-parallel linear of tensor parallelism, dist/tensor_parallel):
//   reduce_grad(dx)  the input gradient summed over the ranks (sequence parallelism: this
//                    rank's part of the sum)
//   gather(part)     sequence parallelism only (else empty): the input arrives in parts of
//                    the sequence, and gather makes the whole one
struct SharedInput {
  StartFn gather, reduce_grad;
};
// linear (gelu: linear_gelu) of a shared input, the collectives inside the op so that they
// run behind its GEMMs: backward starts reduce_grad as soon as dx is made and waits for it
// after the weight gradient's GEMM (Megatron-LM's overlap of the input gradient's
// all-reduce). With gather, only the part is kept for backward: it is gathered again there,
// started before dx's GEMM and waited for before the weight gradient's.
Tensor linear_shared_input(const Tensor& x, const Tensor& w, const Tensor& b, bool gelu,
                           const SharedInput& comm);

// ---- elementwise (ops/elementwise.cpp) -------------------------------------------
// b has a's shape, or is a row vector (last dim of a) broadcast over the other dims.
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor scale(const Tensor& a, double s);
// Dropout with a counter-based mask keyed by global indices (kernels::dropout): x (N, C) ->
// (N, C), kept elements scaled by 1 / (1 - p). Nothing is saved: backward recomputes the mask.
// positions: (run) i32 on x's device, the key's positions of a rank's tokens in their sequence
// (context parallelism, Ulysses; undefined: none), held by the backward.
Tensor dropout(const Tensor& x, const kernels::DropoutKey& key, const Tensor& positions = {});
Tensor gelu(const Tensor& x);  // tanh approximation
// SwiGLU's gate (the Llama MLP, down(silu(gate) * up)): gate, up of one shape -> silu(gate) *
// up, silu(g) = g * sigmoid(g), one node (nothing but gate and up is kept)
Tensor silu_mul(const Tensor& gate, const Tensor& up);
Tensor cast(const Tensor& x, DType dtype);  // gradient cast back to x's dtype

// ---- reductions (ops/reduce.cpp) -------------------------------------------------
// To a one-element tensor of x's dtype; summed in f64 on CPU (f32 on CUDA).
Tensor sum(const Tensor& x);
Tensor mean(const Tensor& x);
Tensor sum_squares(const Tensor& x);

// ---- normalization and softmax (ops/norm.cpp) ------------------------------------
// x (..., C), w (C), b (C) -> (..., C); saves mean and rstd for the backward.
Tensor layernorm(const Tensor& x, const Tensor& w, const Tensor& b, double eps = 1e-5);
// The residual stream's add and the LayerNorm after it, in one pass each way:
// a, b (..., C) -> sum = a + b and out = layernorm(sum, w, bias), as add then layernorm
// (bit-equal), with the gradients of both outputs joined in the LayerNorm's backward.
struct AddNormOut {
  Tensor sum, out;
};
AddNormOut add_layernorm(const Tensor& a, const Tensor& b, const Tensor& w, const Tensor& bias,
                         double eps = 1e-5);
// RMSNorm (Llama, Qwen2): x (..., C), w (C) -> x / sqrt(mean_c(x^2) + eps) * w; saves rstd.
Tensor rms_norm(const Tensor& x, const Tensor& w, double eps = 1e-6);
Tensor softmax(const Tensor& x);  // over the last dim
// logits (N, V), targets (N) i32 -> scalar mean of -log softmax(logits)[target] over rows
// whose target != ignore_index (0 if none). v_limit < V ignores padded vocab columns
// (-1: all V). Fused: the (N,V) probabilities are never stored. The loss is in the
// statistics dtype: f32 for bf16 (and f32) logits, f64 for f64; its gradient may come in
// that dtype too (a bf16 run's loss, its 1/accum scaling and backward's seed stay f32).
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index = -1,
                     int64_t v_limit = -1);
// The same loss as the fused classifier of a training step: the forward also computes the
// gradient for dloss = 1 and writes it over the logits' memory (no (N,V) dlogits buffer, no
// second pass over the logits in backward but one scaling by dloss). The logits must be an
// intermediate result that nothing reads afterwards (GPT's lm_head output), and the node may
// be backpropagated once. Without gradients it is cross_entropy.
Tensor cross_entropy_fused(const Tensor& logits, const Tensor& targets, int64_t ignore_index = -1,
                           int64_t v_limit = -1);

// ---- rotary position embedding (ops/rotary.cpp) ------------------------------------
// x (B, T, NH, HS), cos, sin (B, T, HS/2) of x's dtype (the angle of each position and
// frequency: models/ makes them from the positions, so context parallelism's chunks carry
// their global positions) -> x with the pairs (i, i + HS/2) of each head turned by their
// angle, Hugging Face's rotate_half convention; differentiable in x only.
Tensor rotary(const Tensor& x, const Tensor& cos, const Tensor& sin);

// ---- embedding (ops/embedding.cpp) -----------------------------------------------
// ids (...) i32, table (V, C) -> (..., C). Backward scatter-adds, deterministically.
// A table that holds rows [v_start, v_start + V) of a vocabulary of v_total ids (tensor
// parallelism; -1: v_start + V) gives zero rows for the ids it does not hold.
Tensor embedding(const Tensor& ids, const Tensor& table, int64_t v_start = 0, int64_t v_total = -1);

// ---- attention (ops/attention.cpp) -----------------------------------------------
struct AttentionOut {
  Tensor out;  // (B, NH, Tq, HS)
  Tensor lse;  // (B, NH, Tq) f32 (f64 for f64): log-sum-exp of each query's scaled scores
};
// Causal scaled-dot-product attention: q (B,NH,Tq,HS), k and v (B,NKV,Tk,HS) with NKV
// dividing NH (grouped-query attention, Llama 3 / Qwen2; NKV = NH is multi-head, NKV = 1
// multi-query): with G = NH/NKV, query head h attends with kv head h/G (Hugging Face's
// repeat_kv order), and no path copies K/V once per query head; dk, dv are the sums over
// each kv head's G query heads. Query i is at global position q_offset+i, key j at
// k_offset+j; i sees j iff k_offset+j <= q_offset+i.
// scale defaults to 1/sqrt(HS). A query that sees no key gets out = 0 and lse = -inf.
// Both outputs are differentiable, so partial results over key blocks can be merged
// through the lse (ring attention).
// Packed rows (several documents in one row): docs (B, Td) i32, Td >= max(q_offset+Tq,
// k_offset+Tk), each row non-decreasing, the document of every global position; then i sees j
// iff also docs[k_offset+j] == docs[q_offset+i]. Undefined docs: one document per row. On
// CUDA, packed rows run attention_composed.
// On the CPU it runs fused (the kernel of self_attention: blocks of queries against the
// keys they see, no (Tq, Tk) tensor kept; q, k, v read as they lie if their rows are
// contiguous); on CUDA, bf16 inputs run fused (cuDNN flash attention, tensor/cuda/sdpa.h)
// where the mask allows it; everything else runs attention_composed. NDT_SDPA=0 turns
// fusion off.
AttentionOut attention(const Tensor& q, const Tensor& k, const Tensor& v, int64_t q_offset = 0,
                       int64_t k_offset = 0, double scale = 0.0, const Tensor& docs = {});
// Whether attention() and self_attention() on tensors of this device take the CPU's fused
// kernel (which keeps no probabilities for backward): the CPU, unless NDT_SDPA=0.
bool attention_fused_on_cpu(Device device);
// The same, always composed from GEMMs and the masked-softmax kernels (materializes the
// (Tq, Tk) scores): every device and dtype, and the reference the fused path is tested against.
// GQA there: the G query heads of a kv head are one (G*Tq, HS) matrix against its K and V.
AttentionOut attention_composed(const Tensor& q, const Tensor& k, const Tensor& v, int64_t q_offset = 0,
                                int64_t k_offset = 0, double scale = 0.0, const Tensor& docs = {});
// Causal self-attention of a sequence on itself, from c_attn's packed output: qkv (B,T,3C)
// holds q, k and v side by side in each row (head h in columns [h HS, (h+1) HS) of each
// third, HS = C / n_head) -> y (B,T,C) with the heads side by side again; query t sees keys
// <= t, scale 1/sqrt(HS). On CPU one fused kernel reads the heads in place and never stores
// the (T,T) probabilities (tensor/cpu/self_attention.cpp); elsewhere split_last,
// heads_to_front, attention() and heads_to_back. self_attention_composed, the reference, is
// the same with attention_composed. NDT_SDPA=0 turns the CPU's fusion off too. docs (B, T):
// packed rows, as for attention() (query t sees keys s <= t of its own document).
Tensor self_attention(const Tensor& qkv, int64_t n_head, const Tensor& docs = {});
Tensor self_attention_composed(const Tensor& qkv, int64_t n_head, const Tensor& docs = {});
// Packed rows: docs (B, T) i32 as attention() takes it -> the positions (B, T) i32 of the
// tokens, restarting at every document: pos_offset + t - (the first index of t's document),
// the position_ids of Hugging Face's packed rows. Throws for docs that are not (B, T) i32
// non-decreasing along each row.
Tensor document_positions(const Tensor& docs, int64_t pos_offset = 0);
// The mask of packed rows as the kernels take it: docs (B, Td) -> key_lo (B, Tq) i32, the
// first key (0..Tk) that query i, at global position q_offset + i, may see: the start of its
// document's run, less k_offset, clamped to [0, Tk]. Checks docs as above (Td >= q_offset+Tq,
// k_offset+Tk, and B).
Tensor document_key_starts(const Tensor& docs, int64_t B, int64_t Tq, int64_t Tk, int64_t q_offset,
                           int64_t k_offset);
// Merges two attention results of the same queries over disjoint key blocks, a and b,
// through their log-sum-exps: out_a, out_b (B,NH,T,HS), lse_a, lse_b (B,NH,T) as attention()
// returns them -> out (B,NH,T,HS), lse (B,NH,T), equal to attention over both blocks:
//   lse = logaddexp(lse_a, lse_b),  out = exp(lse_a - lse) out_a + exp(lse_b - lse) out_b
// A query that saw no key in one block (lse -inf) takes the other's result; in neither,
// out = 0 and lse = -inf. The order of a and b does not matter. Both outputs differentiable.
AttentionOut merge_attention(const Tensor& out_a, const Tensor& lse_a, const Tensor& out_b,
                             const Tensor& lse_b);

// ---- mixture of experts (autograd/ops/moe.cpp) ----------------------------------------
// A mixture-of-experts block (Qwen3-MoE, Mixtral) routes each of N tokens to k of E experts
// and runs every expert's MLP on its rows as one GEMM:
//
//   TopK t = moe_topk(softmax(router_logits), k, /*normalize=*/true);   // (N,k), (N,k) i32
//   MoeRouting r = moe_sort(t.experts, E);                             // rows grouped by expert
//   Tensor xs = moe_dispatch(x, r);                                    // (N*k, C)
//   Tensor h = silu_mul(grouped_matmul(xs, w_gate, r.counts), grouped_matmul(xs, w_up, r.counts));
//   Tensor out = moe_combine(grouped_matmul(h, w_down, r.counts), t.values, r);  // (N, C)
//
// Legend: N tokens, E experts, k choices per token, C channels, M = N*k sorted rows.

// The top k of each row of a router's probabilities: probs (N,E) -> values (N,k) (probs' dtype),
// largest first (ties: the lower expert first, as torch.topk), divided by their row's sum when
// normalize (Qwen3-MoE's norm_topk_prob; Mixtral always), and experts (N,k) i32, their indices.
// Differentiable in probs through values (the indices are constants).
struct TopK {
  Tensor values, experts;
};
TopK moe_topk(const Tensor& probs, int64_t k, bool normalize);

// N tokens' k choices each among E experts, sorted by expert (stable: choice n*k+j in token order
// within an expert). Computed on the host from experts (N,k) i32 (copied from a GPU); no gradient.
struct MoeRouting {
  int64_t tokens = 0, k = 0;    // N, k
  Tensor order;                 // (N*k) i32 on experts' device: sorted row r is choice order[r] = n*k + j
  std::vector<int64_t> counts;  // (E) the rows of each expert, summing to N*k
};
MoeRouting moe_sort(const Tensor& experts, int64_t E);

// x (N,C) -> (N*k, C): sorted row r is x[order[r] / k] (each token copied once per choice).
// Backward: the rows' gradients added back to their tokens.
Tensor moe_dispatch(const Tensor& x, const MoeRouting& r);

// One GEMM per group over rows grouped by counts: x (M,in), w (G,in,out), counts (G) summing to
// M -> (M,out): the rows of group g times w[g]. Groups with no rows are skipped (their w[g] gets a
// zero gradient). Backward: dx rows = dy_g w[g]^T, dw[g] = x_g^T dy_g. Differentiable in x and w.
Tensor grouped_matmul(const Tensor& x, const Tensor& w, const std::vector<int64_t>& counts);

// y (N*k, C) in sorted order, weights (N,k) -> (N,C): out[n] = sum_j weights[n,j] * y[row of
// choice n*k+j]. Differentiable in y and weights.
Tensor moe_combine(const Tensor& y, const Tensor& weights, const MoeRouting& r);

// ---- shapes (ops/shape.cpp) ------------------------------------------------------
Tensor view(const Tensor& x, const Shape& shape);                   // x contiguous
Tensor permute(const Tensor& x, const std::vector<int64_t>& dims);  // result contiguous
Tensor transpose(const Tensor& x, int64_t d0, int64_t d1);          // result contiguous
// Split the last dim into pieces of the given sizes (they must add up), and its inverse;
// split and concat do the same along any dim, each piece one contiguous copy.
std::vector<Tensor> split_last(const Tensor& x, const std::vector<int64_t>& sizes);
Tensor concat_last(const std::vector<Tensor>& xs);
std::vector<Tensor> split(const Tensor& x, int64_t dim, const std::vector<int64_t>& sizes);
Tensor concat(const std::vector<Tensor>& xs, int64_t dim);
// (B, T, NH, HS) <-> (B, NH, T, HS)
Tensor heads_to_front(const Tensor& x);
Tensor heads_to_back(const Tensor& x);

}  // namespace ndt
