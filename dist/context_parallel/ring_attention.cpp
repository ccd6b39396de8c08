#include "dist/context_parallel/ring_attention.h"

#include <array>

#include "autograd/ops.h"
#include "autograd/recompute.h"
#include "dist/context_parallel/comm.h"

namespace ndt::dist {

void check_context_parallel(int64_t seq_len, int64_t cp) {
  NDT_CHECK(seq_len % (2 * cp) == 0, "context parallelism: train.seq_len = ", seq_len,
            " must be divisible by 2 x cp_size = ", 2 * cp,
            " (each rank holds two chunks of seq_len / (2 cp))");
}

namespace {

// (B, NH, 2Tc, X) -> its two halves along time, (B, NH, Tc, X) each; and back.
std::array<Tensor, 2> halves(const Tensor& t) {
  const int64_t Tc = t.size(2) / 2;
  std::vector<Tensor> h = split(t, 2, {Tc, Tc});
  return {h[0], h[1]};
}
Tensor join(const Tensor& a, const Tensor& b) { return concat({a, b}, 2); }

// Head-tail load balancing: of the 2 n chunks of a sequence, rank r holds chunk r (its
// head) and this one (its tail), so every rank has as many keys to attend to as any other.
int64_t tail_chunk(int64_t rank, int64_t n) { return 2 * n - 1 - rank; }

}  // namespace

Tensor ring_attention(const Tensor& q, const Tensor& k, const Tensor& v, Communicator& cp,
                      const Tensor& docs) {
  // q (B,NH,2Tc,HS), k, v (B,NKV,2Tc,HS): checked here, before anything is sent, as every pair's
  // attention() would check them
  NDT_CHECK(q.dim() == 4 && k.dim() == 4 && k.shape() == v.shape() && k.size(0) == q.size(0) &&
                k.size(2) == q.size(2) && k.size(3) == q.size(3) && q.size(2) % 2 == 0,
            "ring_attention: q must be (B, NH, 2 Tc, HS) and k, v (B, NKV, 2 Tc, HS), got q ", q.shape_str(),
            ", k ", k.shape_str(), ", v ", v.shape_str());
  NDT_CHECK(k.size(1) > 0 && q.size(1) % k.size(1) == 0, "ring_attention: q has ", q.size(1),
            " heads and k, v ", k.size(1),
            ": the kv heads must divide the query heads (grouped-query attention)");
  const int64_t n = cp.size(), r = cp.rank(), Tc = q.size(2) / 2, HS = q.size(3);
  NDT_CHECK(!docs.defined() || (docs.dim() == 2 && docs.dtype() == DType::i32 && docs.size(0) == q.size(0) &&
                                docs.size(1) == 2 * n * Tc),
            "ring_attention: docs must be the whole rows' documents (B, 2 cp Tc) = (", q.size(0), ", ",
            2 * n * Tc, ") int32, got ", docs.desc());
  // Packed rows: every rank holds the whole rows' documents (the loader reads whole rows), so
  // each pair's mask comes from them at its global offsets, and nothing about documents
  // travels around the ring. On the host once, not once per pair (each pair reads them there).
  const Tensor docs_host = docs.defined() ? docs.to(Device::cpu()) : Tensor();
  const std::array<Tensor, 2> qh = halves(q);
  const std::array<int64_t, 2> q_chunk = {r, tail_chunk(r, n)};
  std::array<AttentionOut, 2> acc;
  Tensor kv = concat_last({k, v});  // (B, NKV, 2Tc, 2HS): one message per step, the kv heads only
  int64_t owner = r;                // whose chunks kv holds
  // On the CPU attention() is fused and keeps no probabilities; elsewhere each block is
  // recomputed in backward instead of keeping its (Tc x Tc) probabilities: one score block
  // alive at a time
  const bool recompute = !attention_fused_on_cpu(q.device());
  for (int64_t step = 0; step < n; ++step) {
    RingPass next;
    if (step + 1 < n) next = ring_pass(kv, cp);  // in flight while we compute on kv
    const std::array<Tensor, 2> kvh = halves(kv);
    const std::array<int64_t, 2> k_chunk = {owner, tail_chunk(owner, n)};
    for (int b = 0; b < 2; ++b) {
      if (k_chunk[b] > q_chunk[1]) continue;                   // after every query of both chunks: all masked
      std::vector<Tensor> kvs = split_last(kvh[b], {HS, HS});  // K, V of key chunk b
      for (int a = 0; a < 2; ++a) {
        if (k_chunk[b] > q_chunk[a]) continue;  // every key is after every query: all masked
        const int64_t qo = q_chunk[a] * Tc, ko = k_chunk[b] * Tc;
        AttentionOut o;
        if (recompute) {
          std::vector<Tensor> block = autograd::recompute(
              [qo, ko, docs_host](const std::vector<Tensor>& in) {
                const AttentionOut pair = attention(in[0], in[1], in[2], qo, ko, 0.0, docs_host);
                return std::vector<Tensor>{pair.out, pair.lse};
              },
              {qh[a], kvs[0], kvs[1]});
          o = {block[0], block[1]};
        } else {
          o = attention(qh[a], kvs[0], kvs[1], qo, ko, 0.0, docs_host);
        }
        // (packed rows: a query whose document starts after this key chunk sees none of it,
        // out 0 and lse -inf, which the merge gives no weight)
        acc[a] = acc[a].out.defined() ? merge_attention(acc[a].out, acc[a].lse, o.out, o.lse) : o;
      }
    }
    if (step + 1 < n) {
      next.done->wait();
      kv = next.out;
      owner = (owner + n - 1) % n;
    }
  }
  return join(acc[0].out, acc[1].out);  // each query saw at least itself, in its diagonal block
}

namespace {

// (B, T) of whole sequences -> (B, 2 Tc): rank r's head chunk r and tail chunk 2n-1-r.
Tensor head_and_tail(const Tensor& t, int64_t n, int64_t r, int64_t Tc) {
  Tensor out = Tensor::empty({t.size(0), 2 * Tc}, t.dtype(), t.device());
  out.narrow(1, 0, Tc).copy_(t.narrow(1, r * Tc, Tc));
  out.narrow(1, Tc, Tc).copy_(t.narrow(1, tail_chunk(r, n) * Tc, Tc));
  return out;
}

}  // namespace

ContextParallel::ContextParallel(models::GPT& gpt, Communicator& cp, int64_t seq_len,
                                 const SequenceSplit* split)
    : cp_(cp), T_(seq_len) {
  check_context_parallel(seq_len, cp.size());
  auto active = [split] { return !split || split->active; };
  Communicator* c = &cp;
  for (auto& block : gpt.h)
    block->attend() = [c, active](const Tensor& q, const Tensor& k, const Tensor& v, int64_t pos_offset,
                                  const Tensor& docs) {
      return active() ? ring_attention(q, k, v, *c, docs)
                      : attention(q, k, v, pos_offset, pos_offset, 0.0, docs).out;
    };
  const int64_t n = cp.size(), r = cp.rank(), Tc = seq_len / (2 * n);
  gpt.positions = [active, n, r, Tc](const Tensor& idx, int64_t pos_offset, const Tensor& docs) {
    const int64_t B = idx.size(0), T = idx.size(1);
    if (docs.defined() && !active()) return document_positions(docs, pos_offset);
    if (docs.defined()) {
      // packed rows: a document's positions restart at its start, which may lie in a chunk of
      // another rank: the positions of the whole rows, then this rank's two pieces of them
      NDT_CHECK(docs.size(1) == 2 * n * Tc && T == 2 * Tc, "context parallelism: docs ", docs.desc(),
                " must be the whole rows' (B, ", 2 * n * Tc, ") for this rank's ", idx.desc(), " tokens");
      return head_and_tail(document_positions(docs, pos_offset), n, r, Tc);
    }
    std::vector<int32_t> pos(static_cast<size_t>(B * T));
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t)
        pos[b * T + t] = static_cast<int32_t>(!active() ? pos_offset + t
                                              : t < Tc  ? r * Tc + t
                                                        : tail_chunk(r, n) * Tc + (t - Tc));
    return Tensor::from_vector(pos, {B, T}, idx.device());
  };
}

Tensor ContextParallel::local(const Tensor& tokens) const {
  const int64_t n = cp_.size(), r = cp_.rank(), Tc = T_ / (2 * n);
  NDT_CHECK(tokens.size(1) == T_, "context parallelism: a batch of ", tokens.size(1),
            " tokens per row, expected ", T_);
  return head_and_tail(tokens, n, r, Tc);
}

}  // namespace ndt::dist
