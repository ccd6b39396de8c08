// The op case registry (see op_cases.h). Legend: N rows, C channels, V vocab, B batch,
// T time, NH heads, HS head size; M, K, N matrix dims and Bt batch for matmul.
#include "support/op_cases.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <limits>
#include <map>

#include "autograd/engine.h"
#include "autograd/hooks.h"
#include "autograd/ops.h"
#include "autograd/recompute.h"
#include "tensor/kernels.h"

namespace ndt::testing {

namespace {

constexpr uint64_t kSeed = 20240611;

// One input of a case: normal floats (mean, std), or int32 ids in [0, ids_hi) when ids_hi > 0.
struct Spec {
  Shape shape;
  float mean = 0.0f;
  float std = 1.0f;
  int32_t ids_hi = 0;
};
Spec ids(const Shape& shape, int32_t hi) { return {shape, 0.0f, 1.0f, hi}; }

// Every input gets its own RNG stream, so no two inputs of a case share values.
std::function<std::vector<Tensor>(DType, Device)> inputs_of(std::vector<Spec> specs) {
  return [specs](DType dt, Device dev) {
    std::vector<Tensor> v;
    for (size_t i = 0; i < specs.size(); ++i) {
      const Spec& s = specs[i];
      const uint64_t stream = 100 + i;
      v.push_back(s.ids_hi > 0 ? random_ids(s.shape, s.ids_hi, dev, stream)
                               : randn(s.shape, dt, dev, stream, s.mean, s.std));
    }
    return v;
  };
}

std::vector<bool> all_grad(size_t n) { return std::vector<bool>(n, true); }

// Sets a few int32 entries of a CPU or device tensor (targets: ignored rows).
Tensor with_entries(const Tensor& t, const std::vector<std::pair<int64_t, int32_t>>& entries) {
  std::vector<int32_t> v = t.to_vector<int32_t>();
  for (auto [i, val] : entries) v[i] = val;
  return Tensor::from_vector<int32_t>(v, t.shape(), t.device());
}

// ---- the composite cases ------------------------------------------------------------

constexpr int64_t kB = 2, kT = 7, kC = 12, kNH = 3, kV = 11;

// The 13 tensors of one pre-LN block after x: ln_1 (w, b), c_attn (w, b), attn c_proj (w, b),
// ln_2 (w, b), c_fc (w, b), mlp c_proj (w, b). Weights in (C, OC) layout.
std::vector<Spec> block_param_specs() {
  return {{{kC}, 1.0f, 0.3f},         {{kC}, 0.0f, 0.3f},      // ln_1
          {{kC, 3 * kC}, 0.0f, 0.3f}, {{3 * kC}, 0.0f, 0.1f},  // c_attn
          {{kC, kC}, 0.0f, 0.3f},     {{kC}, 0.0f, 0.1f},      // attn c_proj
          {{kC}, 1.0f, 0.3f},         {{kC}, 0.0f, 0.3f},      // ln_2
          {{kC, 4 * kC}, 0.0f, 0.3f}, {{4 * kC}, 0.0f, 0.1f},  // c_fc
          {{4 * kC, kC}, 0.0f, 0.2f}, {{kC}, 0.0f, 0.1f}};     // mlp c_proj
}

// x (B,T,C), p[first..first+12) the block's tensors -> (B,T,C)
Tensor transformer_block(const Tensor& x, const std::vector<Tensor>& p, size_t first) {
  const Tensor* w = &p[first];
  const int64_t B = x.size(0), T = x.size(1), C = x.size(2), HS = C / kNH;
  // attention: x + c_proj(attn(split(c_attn(ln_1(x)))))
  Tensor h = layernorm(x, w[0], w[1]);
  Tensor qkv = linear(h, w[2], w[3]);  // (B,T,3C)
  std::vector<Tensor> parts = split_last(qkv, {C, C, C});
  auto heads = [&](const Tensor& t) { return heads_to_front(view(t, {B, T, kNH, HS})); };  // (B,NH,T,HS)
  AttentionOut a = attention(heads(parts[0]), heads(parts[1]), heads(parts[2]));
  Tensor y = view(heads_to_back(a.out), {B, T, C});
  Tensor x1 = add(x, linear(y, w[4], w[5]));
  // MLP: x1 + c_proj(gelu(c_fc(ln_2(x1))))
  Tensor m = linear(gelu(linear(layernorm(x1, w[6], w[7]), w[8], w[9])), w[10], w[11]);
  return add(x1, m);
}

// ---- mixture of experts ---------------------------------------------------------------

constexpr int64_t kE = 5;  // experts

// x (N,C) tokens, router w_r (C,E), experts' w_gate, w_up (E,C,H) and w_down (E,H,C) -> (N,C):
// the MoE block of Qwen3-MoE / Mixtral, softmax -> top k -> dispatch -> grouped SwiGLU MLP ->
// combine
Tensor moe_block(const std::vector<Tensor>& p, int64_t k, bool normalize) {
  TopK t = moe_topk(softmax(matmul(p[0], p[1])), k, normalize);
  MoeRouting r = moe_sort(t.experts, p[1].size(1));
  Tensor xs = moe_dispatch(p[0], r);  // (N*k, C)
  Tensor h = silu_mul(grouped_matmul(xs, p[2], r.counts), grouped_matmul(xs, p[3], r.counts));
  return moe_combine(grouped_matmul(h, p[4], r.counts), t.values, r);
}

void add_moe_cases(std::vector<OpCase>& cs) {
  using V = std::vector<Tensor>;
  // probs (N,E) positive and apart (the smallest gap of a row ~1e-2, far above the differences'
  // eps): the top k never changes under the finite differences
  cs.push_back({"moe_topk", inputs_of({{{kT, kE}, 2.0f, 0.5f}}),
                [](const V& x) { return V{moe_topk(x[0], 3, false).values}; }, all_grad(1)});
  cs.push_back({"moe_topk_normalized", inputs_of({{{kT, kE}, 2.0f, 0.5f}}),
                [](const V& x) { return V{moe_topk(x[0], 2, true).values}; }, all_grad(1)});
  // experts (N,2) drawn at random (a token may even pick one expert twice: the ops allow it)
  cs.push_back({"moe_dispatch",
                inputs_of({{{kT, kC}}, ids({kT, 2}, kE)}),
                [](const V& x) { return V{moe_dispatch(x[0], moe_sort(x[1], kE))}; },
                {true, false}});
  cs.push_back({"moe_combine",
                inputs_of({{{2 * kT, kC}}, {{kT, 2}}, ids({kT, 2}, kE)}),
                [](const V& x) { return V{moe_combine(x[0], x[1], moe_sort(x[2], kE))}; },
                {true, true, false}});
  // unequal groups, one empty in the middle, and empty groups at both ends
  cs.push_back({"grouped_matmul", inputs_of({{{10, kC}}, {{4, kC, 5}, 0.0f, 0.3f}}),
                [](const V& x) {
                  return V{grouped_matmul(x[0], x[1], {3, 0, 6, 1})};
                },
                all_grad(2)});
  cs.push_back({"grouped_matmul_empty_ends", inputs_of({{{10, kC}}, {{4, kC, 5}, 0.0f, 0.3f}}),
                [](const V& x) {
                  return V{grouped_matmul(x[0], x[1], {0, 7, 3, 0})};
                },
                all_grad(2)});
  // the whole block; router logits with std ~2 so that no two probabilities of a row are close
  const std::vector<Spec> block = {{{kT, kC}},
                                   {{kC, kE}, 0.0f, 0.6f},
                                   {{kE, kC, 8}, 0.0f, 0.3f},
                                   {{kE, kC, 8}, 0.0f, 0.3f},
                                   {{kE, 8, kC}, 0.0f, 0.3f}};
  cs.push_back(
      {"moe_block", inputs_of(block), [](const V& x) { return V{moe_block(x, 2, true)}; }, all_grad(5)});
  cs.push_back({"moe_block_unnormalized", inputs_of(block),
                [](const V& x) { return V{moe_block(x, 3, false)}; }, all_grad(5)});
}

// ---- the registry ---------------------------------------------------------------------

std::vector<OpCase> build_cases() {
  std::vector<OpCase> cs;
  auto add_case = [&](OpCase c) { cs.push_back(std::move(c)); };

  // matmul: every operand layout the op supports
  struct MM {
    const char* name;
    Shape a, b;
    bool ta, tb;
  };
  const MM mms[] = {
      {"matmul_2d", {5, 7}, {7, 6}, false, false},
      {"matmul_2d_ta", {7, 5}, {7, 6}, true, false},
      {"matmul_2d_tb", {5, 7}, {6, 7}, false, true},
      {"matmul_2d_ta_tb", {7, 5}, {6, 7}, true, true},
      {"matmul_3d_3d", {3, 5, 7}, {3, 7, 6}, false, false},
      {"matmul_3d_3d_ta_tb", {3, 7, 5}, {3, 6, 7}, true, true},
      {"matmul_3d_3d_tb", {3, 5, 7}, {3, 6, 7}, false, true},
      {"matmul_3d_2d", {3, 5, 7}, {7, 6}, false, false},
      {"matmul_3d_2d_tb", {3, 5, 7}, {6, 7}, false, true},
  };
  for (const MM& m : mms) {
    const bool ta = m.ta, tb = m.tb;
    add_case(
        {m.name, inputs_of({{m.a}, {m.b}}),
         [ta, tb](const std::vector<Tensor>& x) { return std::vector<Tensor>{matmul(x[0], x[1], ta, tb)}; },
         all_grad(2)});
  }
  add_case({"matmul_2d_a_only",
            inputs_of({{{5, 7}}, {{7, 6}}}),
            [](const std::vector<Tensor>& x) { return std::vector<Tensor>{matmul(x[0], x[1])}; },
            {true, false}});
  add_case({"matmul_2d_b_only",
            inputs_of({{{5, 7}}, {{7, 6}}}),
            [](const std::vector<Tensor>& x) { return std::vector<Tensor>{matmul(x[0], x[1])}; },
            {false, true}});

  // linear: x (B,T,C) @ w (C,OC) + b (OC)
  add_case({"linear_bias", inputs_of({{{kB, 5, kC}}, {{kC, 9}, 0.0f, 0.3f}, {{9}}}),
            [](const std::vector<Tensor>& x) { return std::vector<Tensor>{linear(x[0], x[1], x[2])}; },
            all_grad(3)});
  add_case({"linear_gelu", inputs_of({{{kB, 5, kC}}, {{kC, 16}, 0.0f, 0.5f}, {{16}, 0.0f, 0.5f}}),
            [](const std::vector<Tensor>& x) { return std::vector<Tensor>{linear_gelu(x[0], x[1], x[2])}; },
            all_grad(3)});
  add_case(
      {"linear_gelu_no_bias", inputs_of({{{kT, kC}}, {{kC, 8}, 0.0f, 0.5f}}),
       [](const std::vector<Tensor>& x) { return std::vector<Tensor>{linear_gelu(x[0], x[1], Tensor())}; },
       all_grad(2)});
  add_case({"linear_no_bias", inputs_of({{{kT, kC}}, {{kC, 5}, 0.0f, 0.3f}}),
            [](const std::vector<Tensor>& x) { return std::vector<Tensor>{linear(x[0], x[1], Tensor())}; },
            all_grad(2)});

  // elementwise, same shape and row (bias) broadcast
  using BinOp = Tensor (*)(const Tensor&, const Tensor&);
  const std::pair<const char*, BinOp> bins[] = {{"add", &add}, {"sub", &sub}, {"mul", &mul}};
  for (auto [name, op] : bins) {
    add_case({std::string(name) + "_same", inputs_of({{{5, 7}}, {{5, 7}}}),
              [op](const std::vector<Tensor>& x) { return std::vector<Tensor>{op(x[0], x[1])}; },
              all_grad(2)});
    add_case({std::string(name) + "_row", inputs_of({{{3, 5, 7}}, {{7}}}),
              [op](const std::vector<Tensor>& x) { return std::vector<Tensor>{op(x[0], x[1])}; },
              all_grad(2)});
  }
  add_case({"scale", inputs_of({{{5, 7}}}),
            [](const std::vector<Tensor>& x) { return std::vector<Tensor>{scale(x[0], -1.7)}; },
            all_grad(1)});
  // dropout (LoRA's lora_dropout): the mask is a function of the key and the element's global
  // indices only, so every dtype and device drops the same elements (rows 3.., columns 2..9 of
  // a 10-column whole)
  add_case({"dropout", inputs_of({{{6, 8}}}),
            [](const std::vector<Tensor>& x) {
              const kernels::DropoutKey key{
                  .p = 0.3, .seed = 5, .stream = 7, .row_start = 3, .row_stride = 10, .col_start = 2};
              return std::vector<Tensor>{dropout(x[0], key)};
            },
            all_grad(1)});
  // ... and a rank's pieces of 2 sequences of 10 tokens (context parallelism's chunks): its 3
  // tokens of each at positions 1, 2 and 8
  add_case({"dropout_positions", inputs_of({{{6, 8}}}),
            [](const std::vector<Tensor>& x) {
              const kernels::DropoutKey key{
                  .p = 0.3, .seed = 5, .stream = 7, .row_start = 20, .row_stride = 8, .seq_len = 10};
              const Tensor pos = Tensor::from_vector(std::vector<int32_t>{1, 2, 8}, {3}, x[0].device());
              return std::vector<Tensor>{ndt::dropout(x[0], key, pos)};  // not kernels::dropout (ADL)
            },
            all_grad(1)});
  add_case({"gelu", inputs_of({{{5, 7}, 0.0f, 2.0f}}),
            [](const std::vector<Tensor>& x) { return std::vector<Tensor>{gelu(x[0])}; }, all_grad(1)});
  // cast: the identity cast checks exactly; a detour through f32 rounds the forward to
  // float precision, so its finite differences need a large eps (cast is linear, so that
  // costs nothing but rounding: error ~ 2^-24 |x| / eps ~ 1e-5).
  add_case({"cast_identity", inputs_of({{{5, 7}}}),
            [](const std::vector<Tensor>& x) { return std::vector<Tensor>{cast(x[0], x[0].dtype())}; },
            all_grad(1)});
  {
    OpCase c{"cast_via_f32", inputs_of({{{5, 7}}}),
             [](const std::vector<Tensor>& x) {
               return std::vector<Tensor>{cast(cast(x[0], DType::f32), x[0].dtype())};
             },
             all_grad(1)};
    c.gradcheck.eps = 1e-2;
    c.gradcheck.rtol = 1e-4;
    c.gradcheck.atol = 1e-6;
    add_case(c);
  }

  // reductions
  add_case({"sum", inputs_of({{{5, 7}}}),
            [](const std::vector<Tensor>& x) { return std::vector<Tensor>{sum(x[0])}; }, all_grad(1)});
  add_case({"mean", inputs_of({{{3, 5, 7}}}),
            [](const std::vector<Tensor>& x) { return std::vector<Tensor>{mean(x[0])}; }, all_grad(1)});
  add_case({"sum_squares", inputs_of({{{5, 7}}}),
            [](const std::vector<Tensor>& x) { return std::vector<Tensor>{sum_squares(x[0])}; },
            all_grad(1)});

  // normalization, softmax, loss
  add_case({"layernorm", inputs_of({{{kB, 5, kC}, 0.5f, 2.0f}, {{kC}, 1.0f, 0.5f}, {{kC}, 0.0f, 0.5f}}),
            [](const std::vector<Tensor>& x) { return std::vector<Tensor>{layernorm(x[0], x[1], x[2])}; },
            all_grad(3)});
  // 37 channels: two full kLanes blocks and a tail in the CPU's f32 row loops
  add_case({"layernorm_wide", inputs_of({{{kB, 3, 37}, 0.5f, 2.0f}, {{37}, 1.0f, 0.5f}, {{37}, 0.0f, 0.5f}}),
            [](const std::vector<Tensor>& x) { return std::vector<Tensor>{layernorm(x[0], x[1], x[2])}; },
            all_grad(3)});
  add_case(
      {"add_layernorm",
       inputs_of(
           {{{kB, 5, kC}, 0.5f, 2.0f}, {{kB, 5, kC}, 0.0f, 1.0f}, {{kC}, 1.0f, 0.5f}, {{kC}, 0.0f, 0.5f}}),
       [](const std::vector<Tensor>& x) {
         AddNormOut r = add_layernorm(x[0], x[1], x[2], x[3]);
         return std::vector<Tensor>{r.sum, r.out};
       },
       all_grad(4)});
  add_case({"rms_norm", inputs_of({{{kB, 5, kC}, 0.5f, 2.0f}, {{kC}, 1.0f, 0.5f}}),
            [](const std::vector<Tensor>& x) { return std::vector<Tensor>{rms_norm(x[0], x[1], 1e-6)}; },
            all_grad(2)});
  // the Llama MLP as nn::SwiGLU runs it: down(silu(x gate) * (x up)), no biases, after an RMSNorm
  add_case({"swiglu_mlp",
            inputs_of({{{kB, 5, kC}},
                       {{kC}, 1.0f, 0.3f},
                       {{kC, 16}, 0.0f, 0.4f},
                       {{kC, 16}, 0.0f, 0.4f},
                       {{16, kC}, 0.0f, 0.3f}}),
            [](const std::vector<Tensor>& x) {
              const Tensor h = rms_norm(x[0], x[1], 1e-6);
              return std::vector<Tensor>{
                  linear(silu_mul(linear(h, x[2], Tensor()), linear(h, x[3], Tensor())), x[4], Tensor())};
            },
            all_grad(5)});
  add_case({"silu_mul", inputs_of({{{5, 7}, 0.0f, 2.0f}, {{5, 7}}}),
            [](const std::vector<Tensor>& x) { return std::vector<Tensor>{silu_mul(x[0], x[1])}; },
            all_grad(2)});
  // x (B,T,NH,HS) and cos, sin (B,T,HS/2): the backward is the transpose for any cos and
  // sin (random here, not on the unit circle); x comes as (B,NH,T,HS), as attention holds q
  add_case({"rotary",
            inputs_of({{{kB, kNH, kT, 6}}, {{kB, kT, 3}}, {{kB, kT, 3}}}),
            [](const std::vector<Tensor>& x) {
              return std::vector<Tensor>{rotary(transpose(x[0], 1, 2), x[1], x[2])};
            },
            {true, false, false}});
  add_case({"softmax", inputs_of({{{kT, kV}, 0.0f, 2.0f}}),
            [](const std::vector<Tensor>& x) { return std::vector<Tensor>{softmax(x[0])}; }, all_grad(1)});
  add_case({"softmax_3d", inputs_of({{{2, 3, 5}, 0.0f, 2.0f}}),
            [](const std::vector<Tensor>& x) { return std::vector<Tensor>{softmax(x[0])}; }, all_grad(1)});
  add_case({"cross_entropy",
            inputs_of({{{kT, kV}, 0.0f, 2.0f}, ids({kT}, kV)}),
            [](const std::vector<Tensor>& x) { return std::vector<Tensor>{cross_entropy(x[0], x[1])}; },
            {true, false}});
  {
    // rows 1 and 4 ignored (ignore_index -100), only the first 8 of 11 columns are vocabulary
    auto base = inputs_of({{{kT, kV}, 0.0f, 2.0f}, ids({kT}, 8)});
    add_case(
        {"cross_entropy_ignore_vlimit",
         [base](DType dt, Device dev) {
           std::vector<Tensor> v = base(dt, dev);
           v[1] = with_entries(v[1], {{1, -100}, {4, -100}});
           return v;
         },
         [](const std::vector<Tensor>& x) { return std::vector<Tensor>{cross_entropy(x[0], x[1], -100, 8)}; },
         {true, false}});
  }

  // the fused classifier writes its gradient over the logits, so they must be an
  // intermediate: scale(x, 1.5) stands for the lm_head's output
  add_case({"cross_entropy_fused",
            inputs_of({{{kT, kV}, 0.0f, 2.0f}, ids({kT}, kV)}),
            [](const std::vector<Tensor>& x) {
              return std::vector<Tensor>{cross_entropy_fused(scale(x[0], 1.5), x[1])};
            },
            {true, false}});
  {
    auto base = inputs_of({{{kT, kV}, 0.0f, 2.0f}, ids({kT}, 8)});
    add_case({"cross_entropy_fused_ignore_vlimit",
              [base](DType dt, Device dev) {
                std::vector<Tensor> v = base(dt, dev);
                v[1] = with_entries(v[1], {{1, -100}, {4, -100}});
                return v;
              },
              [](const std::vector<Tensor>& x) {
                return std::vector<Tensor>{cross_entropy_fused(scale(x[0], 1.5), x[1], -100, 8)};
              },
              {true, false}});
  }

  // embedding: 14 ids into 11 rows, so some ids repeat (and their gradients must add)
  add_case({"embedding",
            inputs_of({ids({kB, kT}, kV), {{kV, 6}}}),
            [](const std::vector<Tensor>& x) { return std::vector<Tensor>{embedding(x[0], x[1])}; },
            {false, true}});

  // a vocabulary shard (tensor parallelism): rows [4, 9) of 11; the other ids give zero rows
  add_case({"embedding_shard",
            inputs_of({ids({kB, kT}, kV), {{5, 6}}}),
            [](const std::vector<Tensor>& x) { return std::vector<Tensor>{embedding(x[0], x[1], 4, kV)}; },
            {false, true}});

  // attention: q (B,NH,Tq,HS), k, v (B,NKV,Tk,HS); both outputs. NKV < NH: grouped-query
  // attention (query head h with kv head h / (NH/NKV)), NKV = 1 multi-query
  struct Att {
    const char* name;
    int64_t nh, nkv, tq, tk, q_off, k_off;
    int64_t masked_rows;  // leading queries that see no key: their lse is -inf, left out
  };
  const Att atts[] = {
      {"attention_causal", kNH, kNH, kT, kT, 0, 0, 0},
      {"attention_block_q7_k3", kNH, kNH, 5, 6, 7, 3, 0},   // query 7 sees keys 3..7, later ones all 6
      {"attention_masked_rows", kNH, kNH, kT, 4, 0, 3, 3},  // queries 0..2 see no key at all
      {"attention_past_block", kNH, kNH, 4, 5, 9, 0, 0},    // every key lies before every query
      // GQA, 4 query heads over 2 and over 1 kv heads, at ring attention's offsets
      {"attention_gqa_causal", 4, 2, kT, kT, 0, 0, 0},
      {"attention_gqa_block_q7_k3", 4, 2, 5, 6, 7, 3, 0},
      {"attention_gqa_masked_rows", 4, 2, kT, 4, 0, 3, 3},
      {"attention_mqa_block_q7_k3", 4, 1, 5, 6, 7, 3, 0},
      {"attention_mqa_past_block", 4, 1, 4, 5, 9, 0, 0},
  };
  for (const Att& a : atts) {
    const int64_t qo = a.q_off, ko = a.k_off, mr = a.masked_rows, tq = a.tq;
    add_case({a.name, inputs_of({{{kB, a.nh, a.tq, 4}}, {{kB, a.nkv, a.tk, 4}}, {{kB, a.nkv, a.tk, 4}}}),
              [qo, ko, mr, tq](const std::vector<Tensor>& x) {
                AttentionOut r = attention(x[0], x[1], x[2], qo, ko);
                Tensor lse = mr ? split_last(r.lse, {mr, tq - mr})[1] : r.lse;
                return std::vector<Tensor>{r.out, lse};
              },
              all_grad(3)});
  }
  // the composed path (on the CPU attention() runs the fused kernel): a block at offsets
  // with rows of every visibility; multi-head, and GQA with 2 and 1 kv heads for 4 query heads
  const std::pair<const char*, std::array<int64_t, 2>> composed_heads[] = {
      {"attention_composed_block", {kNH, kNH}},
      {"attention_composed_gqa_block", {4, 2}},
      {"attention_composed_mqa_block", {4, 1}}};
  for (const auto& [name, heads] : composed_heads)
    add_case({name, inputs_of({{{kB, heads[0], 5, 4}}, {{kB, heads[1], 6, 4}}, {{kB, heads[1], 6, 4}}}),
              [](const std::vector<Tensor>& x) {
                AttentionOut r = attention_composed(x[0], x[1], x[2], 7, 3);
                return std::vector<Tensor>{r.out, r.lse};
              },
              all_grad(3)});
  add_case({"attention_out_only_scale", inputs_of({{{1, 2, 5, 3}}, {{1, 2, 5, 3}}, {{1, 2, 5, 3}}}),
            [](const std::vector<Tensor>& x) {
              return std::vector<Tensor>{attention(x[0], x[1], x[2], 0, 0, 0.7).out};
            },
            all_grad(3)});
  add_case({"attention_lse_only",
            inputs_of({{{1, 2, 5, 3}}, {{1, 2, 6, 3}}, {{1, 2, 6, 3}}}),
            [](const std::vector<Tensor>& x) {
              return std::vector<Tensor>{attention(x[0], x[1], x[2], 4, 0).lse};
            },
            {true, true, false}});

  // packed rows: docs (B, Td), the document of every position. Rows of 1, 2 and 4 documents
  // of unequal lengths, some of one token: queries attend only inside their document.
  // attention() fused (CPU) and composed, multi-head and GQA; and a block of queries 7..11
  // over keys 3..8 (ring attention's offsets) whose documents cut through both blocks.
  const std::vector<int32_t> docs3x7 = {4, 4, 4, 4, 4, 4, 4, 1, 2, 2, 2, 2, 2, 2, 0, 0, 0, 5, 6, 6, 9};
  const std::vector<int32_t> docs2x12 = {0, 0, 0, 0, 1, 1, 1, 2, 2, 2, 2, 2,
                                         0, 1, 2, 3, 3, 3, 3, 3, 4, 4, 4, 4};
  struct DocAtt {
    const char* name;
    int64_t nh, nkv, B, tq, tk, q_off, k_off;
    bool composed;
  };
  const DocAtt doc_atts[] = {
      {"attention_docs", kNH, kNH, 3, kT, kT, 0, 0, false},
      {"attention_docs_gqa", 4, 2, 3, kT, kT, 0, 0, false},
      {"attention_docs_block", kNH, kNH, 2, 5, 6, 7, 3, false},
      {"attention_docs_mqa_block", 4, 1, 2, 5, 6, 7, 3, false},
      {"attention_composed_docs", kNH, kNH, 3, kT, kT, 0, 0, true},
      {"attention_composed_docs_gqa_block", 4, 2, 2, 5, 6, 7, 3, true},
  };
  for (const DocAtt& a : doc_atts) {
    const Tensor docs =
        a.B == 3 ? Tensor::from_vector(docs3x7, {3, 7}) : Tensor::from_vector(docs2x12, {2, 12});
    add_case({a.name, inputs_of({{{a.B, a.nh, a.tq, 4}}, {{a.B, a.nkv, a.tk, 4}}, {{a.B, a.nkv, a.tk, 4}}}),
              [a, docs](const std::vector<Tensor>& x) {
                AttentionOut r = a.composed
                                     ? attention_composed(x[0], x[1], x[2], a.q_off, a.k_off, 0.0, docs)
                                     : attention(x[0], x[1], x[2], a.q_off, a.k_off, 0.0, docs);
                return std::vector<Tensor>{r.out, r.lse};
              },
              all_grad(3)});
  }
  // a ring attention pair on packed rows: queries 8..11 over the earlier keys 2..7, where the
  // last two queries' documents (one of a single token) start after every key: they see none
  // (out 0, lse -inf: their lse is left out), the others one key or all six
  {
    const Tensor docs = Tensor::from_vector<int32_t>(
        {0, 0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1}, {2, 12});
    const std::pair<const char*, std::array<int64_t, 3>> pairs[] = {
        {"attention_docs_ring_pair", {kNH, kNH, 0}},
        {"attention_docs_gqa_ring_pair", {4, 2, 0}},
        {"attention_composed_docs_ring_pair", {kNH, kNH, 1}}};
    for (const auto& [name, h] : pairs)
      add_case({name, inputs_of({{{2, h[0], 4, 4}}, {{2, h[1], 6, 4}}, {{2, h[1], 6, 4}}}),
                [docs, composed = h[2] == 1](const std::vector<Tensor>& x) {
                  AttentionOut r = composed ? attention_composed(x[0], x[1], x[2], 8, 2, 0.0, docs)
                                            : attention(x[0], x[1], x[2], 8, 2, 0.0, docs);
                  return std::vector<Tensor>{r.out, split_last(r.lse, {2, 2})[0]};
                },
                all_grad(3)});
  }
  // self_attention on packed rows: the fused kernel's blocks of 64 queries cut through
  // documents of 1, 40, 30, 1 and 58 tokens (T 130: three blocks, the last partial)
  {
    std::vector<int32_t> d130;
    const int64_t lens[] = {1, 40, 30, 1, 58};
    for (int32_t i = 0; i < 5; ++i) d130.insert(d130.end(), static_cast<size_t>(lens[i]), i);
    const Tensor docs130 = Tensor::from_vector(d130, {1, 130}), docs7 = Tensor::from_vector(docs3x7, {3, 7});
    add_case({"self_attention_docs", inputs_of({{{3, kT, 3 * kC}}}),
              [docs7](const std::vector<Tensor>& x) {
                return std::vector<Tensor>{self_attention(x[0], kNH, docs7)};
              },
              all_grad(1)});
    add_case({"self_attention_docs_blocks", inputs_of({{{1, 130, 3 * 6}}}),
              [docs130](const std::vector<Tensor>& x) {
                return std::vector<Tensor>{self_attention(x[0], 2, docs130)};
              },
              all_grad(1)});
    add_case({"self_attention_composed_docs", inputs_of({{{3, kT, 3 * kC}}}),
              [docs7](const std::vector<Tensor>& x) {
                return std::vector<Tensor>{self_attention_composed(x[0], kNH, docs7)};
              },
              all_grad(1)});
  }

  // self_attention: the sequence on itself from packed qkv (B,T,3C); on CPU the fused kernel
  // (blocks of 64 queries: T 130 makes three, the last partial), on CUDA the composed path
  struct SelfAtt {
    const char* name;
    int64_t B, T, C, NH;
  };
  const SelfAtt sas[] = {{"self_attention", kB, kT, kC, kNH}, {"self_attention_blocks", 1, 130, 6, 2}};
  for (const SelfAtt& a : sas) {
    const int64_t nh = a.NH;
    add_case({a.name, inputs_of({{{a.B, a.T, 3 * a.C}}}),
              [nh](const std::vector<Tensor>& x) { return std::vector<Tensor>{self_attention(x[0], nh)}; },
              all_grad(1)});
  }

  // merge_attention: the queries' attention over two key blocks, each computed alone and
  // merged through the lse (ring attention). q (B,NH,Tq,HS), then k and v of block a, then
  // of block b, (B,NKV,Tk,HS); a block at k_off holds global keys k_off.. k_off+tk-1.
  struct Merge {
    const char* name;
    int64_t nh, nkv, tq, q_off, tk_a, k_off_a, tk_b, k_off_b;
    int64_t masked_rows;  // leading queries that see no key in either block: lse -inf, left out
  };
  const Merge merges[] = {
      // keys 0..2 and 3..6: queries 0..2 see nothing in block b (its lse is -inf there)
      {"merge_attention_two_blocks", kNH, kNH, kT, 0, 3, 0, 4, 3, 0},
      // a ring step: the query block 4..7 against the past block 0..3 and its own block 4..7
      {"merge_attention_ring_step", kNH, kNH, 4, 4, 4, 0, 4, 4, 0},
      // block a (keys 5..7) is masked for every query; block b (keys 2..4) for queries 0 and 1,
      // which therefore see no key at all (out 0, lse -inf)
      {"merge_attention_masked_block", kNH, kNH, 5, 0, 3, 5, 3, 2, 2},
      // the ring step with GQA: 4 query heads over 2 kv heads
      {"merge_attention_gqa_ring_step", 4, 2, 4, 4, 4, 0, 4, 4, 0},
  };
  for (const Merge& m : merges) {
    add_case(
        {m.name,
         inputs_of({{{kB, m.nh, m.tq, 4}},
                    {{kB, m.nkv, m.tk_a, 4}},
                    {{kB, m.nkv, m.tk_a, 4}},
                    {{kB, m.nkv, m.tk_b, 4}},
                    {{kB, m.nkv, m.tk_b, 4}}}),
         [m](const std::vector<Tensor>& x) {
           AttentionOut a = attention(x[0], x[1], x[2], m.q_off, m.k_off_a);
           AttentionOut b = attention(x[0], x[3], x[4], m.q_off, m.k_off_b);
           AttentionOut r = merge_attention(a.out, a.lse, b.out, b.lse);
           Tensor lse = m.masked_rows ? split_last(r.lse, {m.masked_rows, m.tq - m.masked_rows})[1] : r.lse;
           return std::vector<Tensor>{r.out, lse};
         },
         all_grad(5)});
  }

  // shapes
  add_case({"view", inputs_of({{{3, 7, 2}}}),
            [](const std::vector<Tensor>& x) {
              return std::vector<Tensor>{view(x[0], {7, -1})};
            },
            all_grad(1)});
  add_case({"permute", inputs_of({{{2, 3, 5}}}),
            [](const std::vector<Tensor>& x) {
              return std::vector<Tensor>{permute(x[0], {2, 0, 1})};
            },
            all_grad(1)});
  add_case({"transpose", inputs_of({{{3, 5, 2}}}),
            [](const std::vector<Tensor>& x) { return std::vector<Tensor>{transpose(x[0], -1, 0)}; },
            all_grad(1)});
  add_case({"split_last", inputs_of({{{3, kC}}}),
            [](const std::vector<Tensor>& x) {
              return split_last(x[0], {5, 3, 4});
            },
            all_grad(1)});
  add_case({"split_last_unused_piece", inputs_of({{{3, kC}}}),
            [](const std::vector<Tensor>& x) {
              std::vector<Tensor> p = split_last(x[0], {5, 3, 4});
              return std::vector<Tensor>{p[0], p[2]};  // the middle piece gets no gradient
            },
            all_grad(1)});
  add_case({"concat_last",
            inputs_of({{{3, 2}}, {{3, 5}}, {{3, 1}}}),
            [](const std::vector<Tensor>& x) { return std::vector<Tensor>{concat_last(x)}; },
            {true, false, true}});
  add_case({"split_dim", inputs_of({{{2, 7, 3}}}),
            [](const std::vector<Tensor>& x) {
              return split(x[0], 1, {3, 4});
            },
            all_grad(1)});
  add_case({"concat_dim", inputs_of({{{2, 3, 4}}, {{2, 1, 4}}}),
            [](const std::vector<Tensor>& x) { return std::vector<Tensor>{concat(x, 1)}; }, all_grad(2)});
  add_case({"heads_to_front", inputs_of({{{kB, kT, kNH, 4}}}),
            [](const std::vector<Tensor>& x) { return std::vector<Tensor>{heads_to_front(x[0])}; },
            all_grad(1)});
  add_case({"heads_to_back", inputs_of({{{kB, kNH, kT, 4}}}),
            [](const std::vector<Tensor>& x) { return std::vector<Tensor>{heads_to_back(x[0])}; },
            all_grad(1)});

  // autograd machinery used as ops: on_backward (identity) and recompute (activation checkpointing)
  add_case({"on_backward", inputs_of({{{5, 7}}}),
            [](const std::vector<Tensor>& x) {
              return std::vector<Tensor>{autograd::on_backward(gelu(x[0]), [] {})};
            },
            all_grad(1)});
  add_case({"recompute_mlp",
            inputs_of({{{5, kC}}, {{kC, 20}, 0.0f, 0.3f}, {{20}}, {{20, kC}, 0.0f, 0.3f}, {{kC}}}),
            [](const std::vector<Tensor>& x) {
              // the parameters are captured, not passed: their gradients come from the recompute
              auto mlp = [w1 = x[1], b1 = x[2], w2 = x[3], b2 = x[4]](const std::vector<Tensor>& in) {
                return std::vector<Tensor>{linear(gelu(linear(in[0], w1, b1)), w2, b2)};
              };
              return autograd::recompute(mlp, {x[0]});
            },
            all_grad(5)});

  // a pre-LN transformer block: x, then its 12 tensors
  {
    std::vector<Spec> specs = {{{kB, kT, kC}}};
    for (const Spec& s : block_param_specs()) specs.push_back(s);
    add_case({"transformer_block", inputs_of(specs),
              [](const std::vector<Tensor>& x) { return std::vector<Tensor>{transformer_block(x[0], x, 1)}; },
              all_grad(specs.size())});
  }
  // a one-block GPT with tied embeddings and a padded vocab, to the loss:
  // ids (B,T), targets (B*T), wte (V,C), wpe (T,C), the block's 12, ln_f (w, b)
  {
    std::vector<Spec> specs = {
        ids({kB, kT}, kV), ids({kB * kT}, kV - 2), {{kV, kC}, 0.0f, 0.5f}, {{kT, kC}, 0.0f, 0.5f}};
    for (const Spec& s : block_param_specs()) specs.push_back(s);
    specs.push_back({{kC}, 1.0f, 0.3f});
    specs.push_back({{kC}, 0.0f, 0.3f});
    auto base = inputs_of(specs);
    std::vector<bool> rg(specs.size(), true);
    rg[0] = rg[1] = false;
    OpCase c{"gpt_tiny_loss",
             [base](DType dt, Device dev) {
               std::vector<Tensor> v = base(dt, dev);
               v[1] = with_entries(v[1], {{3, -1}});  // one ignored target
               return v;
             },
             [](const std::vector<Tensor>& x) {
               const Tensor &idx = x[0], &tgt = x[1], &wte = x[2], &wpe = x[3];
               const int64_t B = idx.size(0), T = idx.size(1), C = wte.size(1), V = wte.size(0);
               std::vector<int32_t> pos(B * T);
               for (int64_t i = 0; i < B * T; ++i) pos[i] = static_cast<int32_t>(i % T);
               Tensor pos_ids = Tensor::from_vector<int32_t>(pos, {B, T}, idx.device());
               Tensor h = add(embedding(idx, wte), embedding(pos_ids, wpe));  // (B,T,C)
               h = transformer_block(h, x, 4);
               h = layernorm(h, x[16], x[17]);
               Tensor logits = matmul(view(h, {B * T, C}), wte, false, true);  // (B*T,V), tied wte
               return std::vector<Tensor>{cross_entropy(logits, tgt, -1, V - 2)};
             },
             rg};
    // bf16 rounds every activation of ~20 chained ops, and the deepest gradients (ln_1,
    // c_attn, wpe) are small sums of cancelling terms: measured 1.9e-2 against f32.
    c.bf16_tol = 4e-2;
    add_case(c);
  }
  add_moe_cases(cs);
  return cs;
}

}  // namespace

const std::vector<OpCase>& op_cases() {
  static const std::vector<OpCase> cases = [] {
    std::vector<OpCase> cs = build_cases();
    std::map<std::string, int> seen;
    for (const OpCase& c : cs) {
      NDT_CHECK(seen[c.name]++ == 0, "op_cases: duplicate case name '", c.name, "'");
      NDT_CHECK(
          std::all_of(c.name.begin(), c.name.end(), [](char ch) { return std::isalnum(ch) || ch == '_'; }),
          "op_cases: case name '", c.name, "' is not a valid test name");
    }
    return cs;
  }();
  return cases;
}

const OpCase& op_case(const std::string& name) {
  for (const OpCase& c : op_cases())
    if (c.name == name) return c;
  NDT_FAIL("op_case: no case named '", name, "'");
}

std::vector<std::string> op_case_names() {
  std::vector<std::string> names;
  for (const OpCase& c : op_cases()) names.push_back(c.name);
  return names;
}

std::vector<Tensor> case_inputs(const OpCase& c, DType dtype, Device device) {
  std::vector<Tensor> in = c.make_inputs(dtype, device);
  NDT_CHECK(in.size() == c.requires_grad.size(), "case ", c.name, ": ", in.size(), " inputs but ",
            c.requires_grad.size(), " requires_grad flags");
  for (size_t i = 0; i < in.size(); ++i)
    if (c.requires_grad[i]) in[i].set_requires_grad(true);
  return in;
}

std::vector<Tensor> convert_inputs(const OpCase& c, const std::vector<Tensor>& inputs, DType dtype,
                                   Device device) {
  std::vector<Tensor> out;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& x = inputs[i];
    Tensor y = x.detach().to(device);
    if (is_floating(y.dtype())) y = y.to(dtype);
    if (y.shares_storage(x)) y = y.clone();  // a fresh leaf, never the caller's storage
    if (c.requires_grad[i]) y.set_requires_grad(true);
    out.push_back(y);
  }
  return out;
}

CaseRun run_case(const OpCase& c, const std::vector<Tensor>& inputs) {
  CaseRun r;
  std::vector<Tensor> outs = c.fn(inputs);
  std::vector<Tensor> used, grads;
  for (size_t k = 0; k < outs.size(); ++k) {
    // R_k: standard normal, rounded to bf16 so that every dtype projects with equal values
    Tensor rk = randn(outs[k].shape(), DType::f32, Device::cpu(), 1000 + k).to(DType::bf16);
    if (outs[k].requires_grad()) {
      used.push_back(outs[k]);
      grads.push_back(rk.to(outs[k].dtype()).to(outs[k].device()));
    }
    r.outputs.push_back(outs[k].to(Device::cpu()).to(DType::f64).contiguous());
  }
  if (!used.empty()) backward(used, grads);
  for (const Tensor& x : inputs) {
    if (!x.requires_grad()) {
      r.grads.emplace_back();
      continue;
    }
    // an input no output depends on has no grad: that is a zero gradient
    r.grads.push_back(x.grad().defined() ? x.grad().to(Device::cpu()).to(DType::f64).contiguous()
                                         : Tensor::zeros(x.shape(), DType::f64));
  }
  return r;
}

double rel_error(const Tensor& a, const Tensor& b) {
  NDT_CHECK(a.shape() == b.shape(), "rel_error: shapes ", a.shape_str(), " and ", b.shape_str(), " differ");
  std::vector<double> va = a.to_vector<double>(), vb = b.to_vector<double>();
  double num = 0, den = 0;
  for (size_t i = 0; i < va.size(); ++i) {
    num += (va[i] - vb[i]) * (va[i] - vb[i]);
    den += vb[i] * vb[i];
  }
  if (std::isnan(num) || std::isnan(den)) return std::numeric_limits<double>::quiet_NaN();
  if (den == 0) return num == 0 ? 0.0 : std::numeric_limits<double>::infinity();
  return std::sqrt(num / den);
}

Tensor randn(const Shape& shape, DType dtype, Device device, uint64_t stream, float mean, float std) {
  Tensor t = Tensor::empty(shape, dtype, device);
  kernels::fill_normal(t, kSeed, stream, 0, mean, std);
  return t;
}

Tensor randu(const Shape& shape, DType dtype, Device device, uint64_t stream, float lo, float hi) {
  Tensor t = Tensor::empty(shape, dtype, device);
  kernels::fill_uniform(t, kSeed, stream, 0, lo, hi);
  return t;
}

Tensor random_ids(const Shape& shape, int32_t hi, Device device, uint64_t stream) {
  std::vector<float> u =
      randu(shape, DType::f32, Device::cpu(), stream, 0.0f, static_cast<float>(hi)).to_vector<float>();
  std::vector<int32_t> v(u.size());
  // the uniform value can round up to exactly hi in float: clamp
  for (size_t i = 0; i < u.size(); ++i) v[i] = std::min(hi - 1, static_cast<int32_t>(std::floor(u[i])));
  return Tensor::from_vector<int32_t>(v, shape, device);
}

}  // namespace ndt::testing
