#include "models/kv_cache.h"

#include "autograd/node.h"
#include "autograd/ops.h"
#include "tensor/error.h"

namespace ndt::models {

KVCache::KVCache(const GPT& gpt, int64_t capacity, LogitsFn logits_fn)
    : gpt_(gpt), logits_fn_(std::move(logits_fn)), capacity_(capacity) {
  NDT_CHECK(capacity >= 1 && capacity <= gpt.cfg.block_size, "KVCache: capacity ", capacity,
            " must be in 1..model.block_size (", gpt.cfg.block_size, ")");
  const size_t L = gpt.h.size();
  k_.resize(L), v_.resize(L), saved_.resize(L);
  for (size_t i = 0; i < L; ++i) {
    nn::AttendFn& hook = gpt.h[i]->attend();
    saved_[i] = std::move(hook);
    hook = [this, i](const Tensor& q, const Tensor& k, const Tensor& v, int64_t pos_offset,
                     const Tensor& docs) {
      NDT_CHECK(!docs.defined(),
                "KVCache: packed rows (docs) cannot be sampled from a KV cache; "
                "give generation one sequence per row, without docs");
      return attend(i, q, k, v, pos_offset);
    };
  }
}

KVCache::~KVCache() {
  for (size_t i = 0; i < gpt_.h.size(); ++i) gpt_.h[i]->attend() = std::move(saved_[i]);
}

Tensor KVCache::attend(size_t layer, const Tensor& q, const Tensor& k, const Tensor& v, int64_t pos_offset) {
  const int64_t B = k.size(0), NKV = k.size(1), T = k.size(2), HS = k.size(3), end = pos_offset + T;
  Tensor& K = k_[layer];
  Tensor& V = v_[layer];
  if (!K.defined() || K.size(0) != B || K.size(1) != NKV || K.size(3) != HS || K.dtype() != k.dtype() ||
      K.device() != k.device()) {
    K = Tensor::empty({B, NKV, capacity_, HS}, k.dtype(), k.device());
    V = Tensor::empty({B, NKV, capacity_, HS}, v.dtype(), v.device());
  }
  NDT_CHECK(end <= capacity_, "KVCache: positions up to ", end - 1, " do not fit its capacity ", capacity_);
  K.narrow(2, pos_offset, T).copy_(k);
  V.narrow(2, pos_offset, T).copy_(v);
  // queries at positions pos_offset.., keys 0..end-1: each sees the keys at or before it.
  // A GPU's single-token steps take the composed path: cuDNN would build a graph for every
  // new key length (its graphs are per shape), costing more than the step.
  const Tensor Kv = K.narrow(2, 0, end), Vv = V.narrow(2, 0, end);
  if (q.device().is_cuda() && T == 1) return attention_composed(q, Kv, Vv, pos_offset, 0).out;
  return attention(q, Kv, Vv, pos_offset, 0).out;  // (B,NH,T,HS)
}

void KVCache::check_room(const Tensor& idx) const {
  NDT_CHECK(idx.dim() == 2 && idx.size(1) >= 1, "KVCache: tokens must be (B, T) with T >= 1, got ",
            idx.desc());
  NDT_CHECK(batch_ < 0 || idx.size(0) == batch_, "KVCache: ", idx.size(0), " rows, but the cache holds ",
            batch_, " (clear() does not change it; make a new cache)");
  NDT_CHECK(length_ + idx.size(1) <= capacity_, "KVCache: ", length_, " positions kept and ", idx.size(1),
            " more do not fit its capacity ", capacity_);
}

Tensor KVCache::next_token_logits(const Tensor& idx) {
  check_room(idx);
  autograd::NoGradGuard no_grad;
  Tensor out = logits_fn_ ? logits_fn_(idx, length_) : gpt_.next_token_logits(idx, length_);
  batch_ = idx.size(0), length_ += idx.size(1);
  return out;
}

Tensor KVCache::logits(const Tensor& idx) {
  check_room(idx);
  autograd::NoGradGuard no_grad;
  Tensor out = gpt_.forward(idx, Tensor(), length_).logits;
  batch_ = idx.size(0), length_ += idx.size(1);
  return out;
}

}  // namespace ndt::models
