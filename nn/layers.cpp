#include "nn/layers.h"

#include "nn/block_wrapper.h"

namespace ndt::nn {

Linear::Linear(int64_t in_, int64_t out_, bool with_bias, float std)
    : in(in_), out(out_), has_bias(with_bias) {
  param("weight", &weight, {in, out}, Init::normal(std), true);
  if (with_bias) param("bias", &bias, {out}, Init::zeros(), false);
}

Tensor Linear::forward(const Tensor& x) const { return apply(x, false); }
Tensor Linear::forward_gelu(const Tensor& x) const { return apply(x, true); }

// x (..., in) -> (..., out): x -> the input's collectives -> x @ W -> the output's -> + b
// (with an adapter: x @ W + b + delta(x), then the GELU)
Tensor Linear::apply(const Tensor& x, bool gelu) const {
  if (adapter) return apply_adapted(x, gelu);
  const SharedInput shared = comm ? comm->input() : SharedInput{};
  auto gemm = [&](const Tensor& b, bool with_gelu) {  // the bias (and GELU) fused where it can be
    if (shared.gather || shared.reduce_grad) return linear_shared_input(x, weight, b, with_gelu, shared);
    return with_gelu ? linear_gelu(x, weight, b) : linear(x, weight, b);
  };
  if (!comm || !comm->reduces_output()) return gemm(bias, gelu);
  Tensor y = comm->reduce_output(gemm(Tensor(), false));  // the sum of every rank's part
  if (bias.defined()) y = add(y, bias);                   // then the bias, once
  return gelu ? ndt::gelu(y) : y;
}

// With a LoRA adapter: y = x W + b + delta(x), the adapter on the input this rank's GEMM
// sees. Column-parallel: x whole (f, once for both), y this rank's columns. Row-parallel:
// x_i this rank's rows, x_i W_i + delta_i(x_i) a partial sum, g sums the ranks' before the
// bias: sum_i x_i W_i + s (x_i A_i^T) B^T = x W + s (x A^T) B^T.
Tensor Linear::apply_adapted(const Tensor& x, bool gelu) const {
  const bool row = comm && comm->reduces_output();
  const Tensor in = comm && !row ? comm->whole_input(x) : x;       // (..., in) as the GEMM sees it
  const int64_t k = weight.size(0);                                // this rank's in (row-parallel: in / tp)
  Tensor y = linear(in, weight, row ? Tensor() : bias);            // (..., out)
  const Tensor d = adapter->delta(view(in, {in.numel() / k, k}));  // (N, out)
  y = add(y, view(d, y.shape()));
  if (row) {
    y = comm->reduce_output(y);            // the sum of every rank's part
    if (bias.defined()) y = add(y, bias);  // then the bias, once
  }
  return gelu ? ndt::gelu(y) : y;
}

Embedding::Embedding(int64_t num, int64_t dim, float std, int64_t live_rows) {
  param("weight", &weight, {num, dim}, Init::normal(std, live_rows), true);
}

Tensor Embedding::forward(const Tensor& ids) const {
  return lookup ? lookup(ids, weight) : embedding(ids, weight);
}

LayerNorm::LayerNorm(int64_t dim, double eps_) : eps(eps_) {
  param("weight", &weight, {dim}, Init::ones(), false);
  param("bias", &bias, {dim}, Init::zeros(), false);
}

Tensor LayerNorm::forward(const Tensor& x) const { return layernorm(x, weight, bias, eps); }

RMSNorm::RMSNorm(int64_t dim, double eps_) : eps(eps_) {
  param("weight", &weight, {dim}, Init::ones(), false);
}

Tensor RMSNorm::forward(const Tensor& x) const { return rms_norm(x, weight, eps); }

SwiGLU::SwiGLU(int64_t C, int64_t I, float std, float proj_std)
    : gate_proj(C, I, false, std), up_proj(C, I, false, std), down_proj(I, C, false, proj_std) {
  child("gate_proj", &gate_proj);
  child("up_proj", &up_proj);
  child("down_proj", &down_proj);
}

// x (B,T,C) -> gate, up (B,T,I) -> silu(gate) * up -> down (B,T,C)
Tensor SwiGLU::forward(const Tensor& x) const {
  return down_proj.forward(silu_mul(gate_proj.forward(x), up_proj.forward(x)));
}

MLP::MLP(int64_t C, float std, float proj_std) : c_fc(C, 4 * C, true, std), c_proj(4 * C, C, true, proj_std) {
  child("c_fc", &c_fc);
  child("c_proj", &c_proj);
}

// x (B,T,C) -> c_fc (B,T,4C) -> gelu -> c_proj (B,T,C)
Tensor MLP::forward(const Tensor& x) const { return c_proj.forward(c_fc.forward_gelu(x)); }

CausalSelfAttention::CausalSelfAttention(int64_t C, int64_t nh, float std, float proj_std)
    : c_attn(C, 3 * C, true, std), c_proj(C, C, true, proj_std), n_head(nh) {
  NDT_CHECK(nh > 0 && C % nh == 0, "attention: n_embd ", C, " is not divisible by n_head ", nh);
  child("c_attn", &c_attn);
  child("c_proj", &c_proj);
}

namespace {
// HS: the given head size, or C / NH
int64_t head_size(const LlamaDims& d) {
  return d.head_dim > 0 ? d.head_dim : d.n_head > 0 ? d.C / d.n_head : 0;
}
}  // namespace

Tensor CausalSelfAttention::core(const Tensor& qkv, int64_t pos_offset, const Tensor& docs) const {
  // C: this rank's channels of q, k and v (n_embd, or n_embd / tp with tensor parallelism)
  // qkv (B,T,3C) -> y (B,T,C): the sequence attends to itself (the offset cancels out of the
  // mask), on CPU without copying a head out of qkv; packed rows: each document to itself
  if (!attend) return self_attention(qkv, n_head, docs);
  const int64_t B = qkv.size(0), T = qkv.size(1), C = qkv.size(2) / 3, NH = n_head, HS = C / NH;
  // qkv (B,T,3C) -> q, k, v (B,T,C) each -> (B,NH,T,HS)
  std::vector<Tensor> parts = split_last(qkv, {C, C, C});
  auto heads = [&](const Tensor& t) { return heads_to_front(view(t, {B, T, NH, HS})); };
  const Tensor q = heads(parts[0]), k = heads(parts[1]), v = heads(parts[2]);
  Tensor y = attend(q, k, v, pos_offset, docs);  // (B,NH,T,HS), e.g. ring attention over the cp group
  // (B,NH,T,HS) -> (B,T,NH,HS) -> (B,T,C)
  return view(heads_to_back(y), {B, T, C});
}

Tensor CausalSelfAttention::forward(const Tensor& x, int64_t pos_offset, const Tensor& docs) const {
  // x (B,T,n_embd) -> c_attn -> qkv (B,T,3C) -> attention core -> (B,T,C) -> c_proj. Under
  // selective activation checkpointing the core keeps only qkv and runs again in backward.
  const Tensor y = recompute_selected(
      [this, pos_offset, docs](const Tensor& qkv) { return core(qkv, pos_offset, docs); }, c_attn.forward(x));
  return c_proj.forward(y);
}

Block::Block(int64_t C, int64_t n_head, float std, float proj_std, double norm_eps)
    : ln_1(C, norm_eps), attn(C, n_head, std, proj_std), ln_2(C, norm_eps), mlp(C, std, proj_std) {
  child("ln_1", &ln_1);
  child("attn", &attn);
  child("ln_2", &ln_2);
  child("mlp", &mlp);
}

// x + attn(ln_1(x)) -> h;  h + mlp(ln_2(h)) -> out; the first add and ln_2 in one pass
Tensor Block::forward(const Tensor& x, const Positions& pos) const {
  AddNormOut h =
      add_layernorm(x, attn.forward(ln_1.forward(x), pos.offset, pos.docs), ln_2.weight, ln_2.bias, ln_2.eps);
  return add(h.sum, mlp.forward(h.out));
}

GroupedQueryAttention::GroupedQueryAttention(const LlamaDims& d, float std, float proj_std)
    : c_attn(d.C, (d.n_head + 2 * d.n_kv_head) * head_size(d), d.qkv_bias, std),
      c_proj(d.n_head * head_size(d), d.C, false, proj_std),
      n_head(d.n_head),
      n_kv_head(d.n_kv_head),
      head_dim(head_size(d)) {
  NDT_CHECK(d.n_head > 0 && (d.head_dim > 0 || d.C % d.n_head == 0), "attention: n_embd ", d.C,
            " is not divisible by n_head ", d.n_head, " (give the head size)");
  NDT_CHECK(d.n_kv_head > 0 && d.n_head % d.n_kv_head == 0, "attention: n_head ", d.n_head,
            " is not divisible by n_kv_head ", d.n_kv_head);
  child("c_attn", &c_attn);
  child("c_proj", &c_proj);
  if (d.qk_norm) {
    q_norm = std::make_unique<RMSNorm>(head_dim, d.norm_eps);
    k_norm = std::make_unique<RMSNorm>(head_dim, d.norm_eps);
    child("q_norm", q_norm.get());
    child("k_norm", k_norm.get());
  }
}

Tensor GroupedQueryAttention::core(const Tensor& qkv, const Positions& pos) const {
  // qkv (B,T,NKV (G+2) HS), the kv groups side by side -> q (B,T,NH,HS), k, v (B,T,NKV,HS)
  const int64_t B = qkv.size(0), T = qkv.size(1), NKV = n_kv_head, G = n_head / n_kv_head, HS = head_dim;
  std::vector<Tensor> parts = split_last(view(qkv, {B, T, NKV, (G + 2) * HS}), {G * HS, HS, HS});
  Tensor q = view(parts[0], {B, T, NKV * G, HS});  // query head g G + j is group g's j-th
  Tensor k = parts[1], v = parts[2];
  // Qwen3: each head's HS channels of q and k RMS-normalized (one weight for all heads)
  if (q_norm) q = q_norm->forward(q), k = k_norm->forward(k);
  // rotary on q and k at every token's position (B,T,HS/2), then heads in front
  q = heads_to_front(rotary(q, pos.cos, pos.sin));  // (B,NH,T,HS)
  k = heads_to_front(rotary(k, pos.cos, pos.sin));  // (B,NKV,T,HS)
  v = heads_to_front(v);                            // (B,NKV,T,HS)
  Tensor y = attend ? attend(q, k, v, pos.offset, pos.docs)
                    : attention(q, k, v, 0, 0, 0.0, pos.docs).out;  // (B,NH,T,HS)
  // (B,NH,T,HS) -> (B,T,NH,HS) -> (B,T,NH HS)
  return view(heads_to_back(y), {B, T, n_head * HS});
}

Tensor GroupedQueryAttention::forward(const Tensor& x, const Positions& pos) const {
  // x (B,T,C) -> c_attn -> qkv -> attention core -> (B,T,NH HS) -> c_proj -> (B,T,C). Under
  // selective activation checkpointing the core keeps only qkv and runs again in backward
  // (the rotary tables are captured: they are the forward's own, not recomputed).
  const Tensor y =
      recompute_selected([this, pos](const Tensor& qkv) { return core(qkv, pos); }, c_attn.forward(x));
  return c_proj.forward(y);
}

LlamaBlock::LlamaBlock(const Dims& d, float std, float proj_std)
    : ln_1(d.C, d.norm_eps),
      attn(d, std, proj_std),
      ln_2(d.C, d.norm_eps),
      mlp(d.C, d.intermediate, std, proj_std) {
  child("ln_1", &ln_1);
  child("attn", &attn);
  child("ln_2", &ln_2);
  child("mlp", &mlp);
}

// x + attn(ln_1(x)) -> h;  h + mlp(ln_2(h)) -> out
Tensor LlamaBlock::forward(const Tensor& x, const Positions& pos) const {
  const Tensor h = add(x, attn.forward(ln_1.forward(x), pos));
  return add(h, mlp.forward(ln_2.forward(h)));
}

std::vector<LinearSite> Block::linear_sites() {
  return {{"attn.c_attn", &attn.c_attn},
          {"attn.c_proj", &attn.c_proj},
          {"mlp.c_fc", &mlp.c_fc},
          {"mlp.c_proj", &mlp.c_proj}};
}

std::vector<LinearSite> GroupedQueryAttention::linear_sites() {
  // c_attn's columns: NKV groups of G query heads, then k, then v
  const int64_t G = n_head / n_kv_head, HS = head_dim, NKV = n_kv_head;
  const std::vector<int64_t> qkv{G * HS, HS, HS};
  return {{"self_attn.q_proj", &c_attn, 0, NKV, qkv},
          {"self_attn.k_proj", &c_attn, 1, NKV, qkv},
          {"self_attn.v_proj", &c_attn, 2, NKV, qkv},
          {"self_attn.o_proj", &c_proj}};
}

std::vector<LinearSite> LlamaBlock::linear_sites() {
  std::vector<LinearSite> s = attn.linear_sites();
  s.insert(
      s.end(),
      {{"mlp.gate_proj", &mlp.gate_proj}, {"mlp.up_proj", &mlp.up_proj}, {"mlp.down_proj", &mlp.down_proj}});
  return s;
}

TensorParallelPlan& TensorParallelPlan::operator+=(const TensorParallelPlan& o) {
  linears.insert(linears.end(), o.linears.begin(), o.linears.end());
  counts.insert(counts.end(), o.counts.begin(), o.counts.end());
  partial_grads.insert(partial_grads.end(), o.partial_grads.begin(), o.partial_grads.end());
  return *this;
}

TensorParallelPlan SwiGLU::tensor_parallel_plan() {
  return {{{&gate_proj, true}, {&up_proj, true}, {&down_proj, false}}, {}};
}

TensorParallelPlan MLP::tensor_parallel_plan() { return {{{&c_fc, true}, {&c_proj, false}}, {}}; }

TensorParallelPlan Block::tensor_parallel_plan() {
  TensorParallelPlan p{{{&attn.c_attn, true, /*groups=*/3}, {&attn.c_proj, false}},
                       {{&attn.n_head, "heads"}}};
  return p += mlp.tensor_parallel_plan();
}

TensorParallelPlan GroupedQueryAttention::tensor_parallel_plan() {
  TensorParallelPlan p{{{&c_attn, true}, {&c_proj, false}},
                       {{&n_head, "heads"}, {&n_kv_head, "key/value heads"}}};
  if (q_norm) p.partial_grads = {q_norm.get(), k_norm.get()};
  return p;
}

TensorParallelPlan LlamaBlock::tensor_parallel_plan() {
  TensorParallelPlan p = attn.tensor_parallel_plan();
  return p += mlp.tensor_parallel_plan();
}

}  // namespace ndt::nn
