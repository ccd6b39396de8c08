#include "dist/ulysses/ulysses.h"

#include <string>

#include "autograd/node.h"
#include "autograd/ops.h"

namespace ndt::dist {

void check_ulysses(const models::GPTConfig& cfg, int64_t seq_len, int64_t sp, int64_t tp, int64_t cp) {
  // tensor parallelism first gives each tp rank n_head / tp heads (and n_kv_head / tp kv heads,
  // which check_tensor_parallel requires); Ulysses splits those over sp
  const std::string sp_key =
      tp > 1 ? "parallel.tp_size x sp_size = " + std::to_string(tp) + " x " + std::to_string(sp)
             : "parallel.sp_size = " + std::to_string(sp);
  NDT_CHECK(cfg.n_head % (tp * sp) == 0, "Ulysses sequence parallelism: model.n_head = ", cfg.n_head,
            " must be divisible by ", sp_key, " (each rank attends with n_head / ",
            tp > 1 ? "(tp_size x sp_size)" : "sp_size", " heads)");
  // context parallelism first gives each cp rank seq_len / cp tokens; Ulysses splits those over sp
  NDT_CHECK(seq_len % (cp * sp) == 0, "Ulysses sequence parallelism: train.seq_len = ", seq_len,
            " must be divisible by ",
            cp > 1 ? "parallel.cp_size x sp_size = " + std::to_string(cp) + " x " + std::to_string(sp)
                   : "parallel.sp_size = " + std::to_string(sp),
            " (each rank holds seq_len / ", cp > 1 ? "(cp_size x sp_size)" : "sp_size", " tokens)");
  if (cfg.kv_heads() % tp != 0) return;  // check_tensor_parallel's error
  const int64_t kv = cfg.kv_heads() / tp;
  NDT_CHECK(
      kv % sp == 0 || sp % kv == 0, "Ulysses sequence parallelism: model.n_kv_head = ", cfg.kv_heads(),
      tp > 1 ? " (" + std::to_string(kv) + " per tp rank)" : std::string(), " and parallel.sp_size = ", sp,
      ": one must divide the other (kv heads are split over sp ranks, or replicated sp / n_kv_head times)");
}

namespace {

// The exchange without autograd: piece j of x along split_dim to rank j, the pieces received
// joined along cat_dim in rank order.
Tensor exchange(const Tensor& x, int64_t split_dim, int64_t cat_dim, Communicator& sp) {
  const int64_t n = sp.size(), r = sp.rank();
  const int64_t piece = x.size(split_dim) / n, len = x.size(cat_dim);
  Shape in_shape = x.shape(), out_shape = x.shape();
  in_shape[static_cast<size_t>(split_dim)] = piece;
  out_shape[static_cast<size_t>(split_dim)] = piece;
  out_shape[static_cast<size_t>(cat_dim)] = len * n;
  Tensor out = Tensor::empty(out_shape, x.dtype(), x.device());
  out.narrow(cat_dim, r * len, len).copy_(x.narrow(split_dim, r * piece, piece));
  for (int64_t s = 1; s < n; ++s) {  // step s: send to rank r+s, receive from rank r-s
    const int64_t to = (r + s) % n, from = (r + n - s) % n;
    Tensor send = x.narrow(split_dim, to * piece, piece).contiguous();
    Tensor recv = Tensor::empty(in_shape, x.dtype(), x.device());
    sp.sendrecv(send, static_cast<int>(to), recv, static_cast<int>(from))->wait();
    out.narrow(cat_dim, from * len, len).copy_(recv);
  }
  return out;
}

}  // namespace

Tensor all_to_all(const Tensor& x, int64_t split_dim, int64_t cat_dim, Communicator& sp) {
  NDT_CHECK(split_dim >= 0 && split_dim < x.dim() && cat_dim >= 0 && cat_dim < x.dim() &&
                split_dim != cat_dim && x.size(split_dim) % sp.size() == 0,
            "all_to_all: dimension ", split_dim, " of ", x.shape_str(), " must split into ", sp.size(),
            " equal pieces, joined along another dimension (", cat_dim, ")");
  sp.note_unit("all_to_all");
  Tensor out = exchange(x, split_dim, cat_dim, sp);
  const Shape out_shape = out.shape();
  const DType dtype = x.dtype();
  const Device device = x.device();
  Communicator* c = &sp;
  autograd::record(
      "all_to_all", {out}, {x},
      [c, split_dim, cat_dim, out_shape, dtype, device](const autograd::Grads& g) -> autograd::Grads {
        // every rank takes part in the exchange, with zeros if nothing used the output
        const Tensor dout = g[0].defined() ? g[0] : Tensor::zeros(out_shape, dtype, device);
        c->note_unit("all_to_all backward");
        return {exchange(dout, cat_dim, split_dim, *c)};
      });
  return out;
}

namespace {

// k or v (B, NKV, L, HS) with NKV < sp -> (B, sp, L, HS): kv head i repeated sp / NKV times in
// place, so that the query heads of every rank find theirs (autograd adds the copies' gradients).
Tensor replicate_kv(const Tensor& kv, int64_t sp) {
  const int64_t nkv = kv.size(1);
  if (nkv % sp == 0) return kv;
  std::vector<Tensor> heads = split(kv, 1, std::vector<int64_t>(static_cast<size_t>(nkv), 1)), copies;
  for (const Tensor& h : heads)
    for (int64_t i = 0; i < sp / nkv; ++i) copies.push_back(h);
  return concat(copies, 1);
}

}  // namespace

Tensor ulysses_attention(const Tensor& q, const Tensor& k, const Tensor& v, Communicator& sp,
                         const Tensor& docs, const nn::AttendFn& inner) {
  // q (B,NH,L,HS), k, v (B,NKV,L,HS) with L = T/sp: checked before anything is sent
  const int64_t n = sp.size();
  NDT_CHECK(q.dim() == 4 && k.dim() == 4 && k.shape() == v.shape() && k.size(0) == q.size(0) &&
                k.size(2) == q.size(2) && k.size(3) == q.size(3) && q.size(1) % n == 0 && k.size(1) > 0 &&
                q.size(1) % k.size(1) == 0 && (k.size(1) % n == 0 || n % k.size(1) == 0),
            "ulysses_attention: q must be (B, NH, T/sp, HS) and k, v (B, NKV, T/sp, HS) with sp = ", n,
            " dividing NH and NKV dividing NH and dividing or divided by sp, got q ", q.shape_str(), ", k ",
            k.shape_str(), ", v ", v.shape_str());
  // docs: the whole rows' (B, T); under an inner attention (USP: ring attention over cp) T is a
  // multiple of the group's n L positions, which the inner attention checks
  const int64_t group_T = n * q.size(2);
  NDT_CHECK(!docs.defined() || (docs.dim() == 2 && docs.dtype() == DType::i32 && docs.size(0) == q.size(0) &&
                                (inner ? docs.size(1) % group_T == 0 : docs.size(1) == group_T)),
            "ulysses_attention: docs must be the whole rows' documents (B, T) = (", q.size(0), ", ",
            inner ? "a multiple of " : "", group_T, ") int32, got ", docs.desc());
  // (B, H, T/sp, HS) -> (B, H/sp, T, HS): this rank's heads over the group's positions
  const Tensor qh = all_to_all(q, 1, 2, sp), kh = all_to_all(replicate_kv(k, n), 1, 2, sp),
               vh = all_to_all(replicate_kv(v, n), 1, 2, sp);
  // (B, NH/sp, T, HS): attention over the whole sequence, or (USP) over the ring of cp ranks
  const Tensor o = inner ? inner(qh, kh, vh, 0, docs) : attention(qh, kh, vh, 0, 0, 0.0, docs).out;
  return all_to_all(o, 2, 1, sp);  // -> (B, NH, T/sp, HS)
}

namespace {

// (B, T) positions pos_offset .. pos_offset+T-1 of every row
Tensor offsets(int64_t B, int64_t T, int64_t pos_offset, Device device) {
  std::vector<int32_t> pos(static_cast<size_t>(B * T));
  for (int64_t i = 0; i < B * T; ++i) pos[static_cast<size_t>(i)] = static_cast<int32_t>(pos_offset + i % T);
  return Tensor::from_vector(pos, {B, T}, device);
}

}  // namespace

Ulysses::Ulysses(models::GPT& gpt, Communicator& sp, int64_t seq_len, const SequenceSplit* split, int64_t tp,
                 int64_t cp)
    : sp_(sp), T_(seq_len / cp) {
  check_ulysses(gpt.cfg, seq_len, sp.size(), tp, cp);
  auto active = [split] { return !split || split->active; };
  Communicator* c = &sp;
  for (auto& block : gpt.h) {
    const nn::AttendFn inner = block->attend();  // CP's ring attention, or none (the whole sequence)
    block->attend() = [c, active, inner](const Tensor& q, const Tensor& k, const Tensor& v,
                                         int64_t pos_offset, const Tensor& docs) {
      if (active()) return ulysses_attention(q, k, v, *c, docs, inner);
      return inner ? inner(q, k, v, pos_offset, docs)
                   : attention(q, k, v, pos_offset, pos_offset, 0.0, docs).out;
    };
  }
  // the positions of the group's n L tokens (CP's: its two chunks; else the whole rows'), then
  // this rank's contiguous part of them; packed rows: restarting at each document's start,
  // which may lie in another rank's part
  const int64_t n = sp.size(), r = sp.rank(), L = T_ / n;
  const auto inner = gpt.positions;
  gpt.positions = [active, inner, n, r, L](const Tensor& idx, int64_t pos_offset, const Tensor& docs) {
    const bool on = active();
    const int64_t B = idx.size(0), T = on ? n * L : idx.size(1);
    NDT_CHECK(!on || idx.size(1) == L, "Ulysses sequence parallelism: ", idx.desc(), " tokens, expected (B, ",
              L, ") (this rank's part)");
    Tensor all;
    if (inner)
      all = inner(on ? Tensor::empty({B, T}, DType::i32, idx.device()) : idx, pos_offset, docs);
    else if (docs.defined()) {
      NDT_CHECK(docs.size(1) == T, "Ulysses sequence parallelism: docs ", docs.desc(),
                " must be the whole rows' (B, ", T, ") for this rank's ", idx.desc(), " tokens");
      all = document_positions(docs, pos_offset);
    } else {
      all = offsets(B, T, pos_offset, idx.device());
    }
    return on ? all.narrow(1, r * L, L).contiguous() : all;
  };
}

Tensor Ulysses::local(const Tensor& tokens) const {
  const int64_t n = sp_.size(), L = T_ / n;
  NDT_CHECK(tokens.size(1) == T_, "Ulysses sequence parallelism: a batch of ", tokens.size(1),
            " tokens per row, expected ", T_);
  return tokens.narrow(1, sp_.rank() * L, L).contiguous();
}

}  // namespace ndt::dist
