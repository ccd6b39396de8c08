// Expert parallelism (see expert_parallel.h). Legend: N tokens, k choices per token, C channels,
// E experts, El = E / n experts per rank, n members of the ep group, R rows this rank receives.
#include "dist/expert_parallel/expert_parallel.h"

#include "autograd/ops.h"
#include "dist/expert_parallel/comm.h"

namespace ndt::dist {

void check_expert_parallel(const models::GPTConfig& cfg, const ParallelDims& dims) {
  if (dims.ep == 1) return;
  NDT_CHECK(
      cfg.moe(), "parallel.ep_size = ", dims.ep,
      " but the model has no mixture-of-experts layers (model.n_experts = 0); set parallel.ep_size = 1");
  NDT_CHECK(cfg.n_experts % dims.ep == 0, "parallel.ep_size = ", dims.ep,
            " must divide model.n_experts = ", cfg.n_experts,
            " (each rank holds n_experts / ep_size experts of every MoE layer)");
}

namespace {
void split_layer(nn::MoeMLP& mlp, int64_t parts, int64_t rank) {
  for (const char* name : {"gate_proj", "up_proj", "down_proj"}) mlp.experts.split_experts(name, parts, rank);
}
}  // namespace

void split_experts(models::GPT& gpt, int64_t parts, int64_t rank) {
  for (auto& block : gpt.h)
    if (auto* moe = dynamic_cast<nn::MoeBlock*>(block.get())) split_layer(moe->mlp, parts, rank);
}

void apply_expert_parallel(nn::MoeMLP& mlp, Communicator& ep, bool slice) {
  if (slice) split_layer(mlp, ep.size(), ep.rank());
  mlp.run_experts = [&ep](const nn::Experts& ex, const Tensor& xf, const Tensor& w, const Tensor& choices) {
    return expert_parallel_mlp(ex, xf, w, choices, ep);
  };
}

void apply_expert_parallel(models::GPT& gpt, Communicator& ep, bool slice) {
  for (auto& block : gpt.h)
    if (auto* moe = dynamic_cast<nn::MoeBlock*>(block.get())) apply_expert_parallel(moe->mlp, ep, slice);
  // (a dense layer, model.dense_layers, stays as it is)
}

namespace {

// What one MoE layer's exchange moves, from every member's counts per expert.
struct Exchange {
  std::vector<int64_t> send, recv;  // (n) rows to and from each member
  std::vector<int64_t> local;       // (El) rows of each of this rank's experts
  std::vector<int32_t> by_expert;   // (R) received row of the r-th row in local-expert order
};

Exchange plan_exchange(const std::vector<int64_t>& counts, const std::vector<int64_t>& all, int64_t n,
                       int64_t me) {
  const int64_t E = static_cast<int64_t>(counts.size()), El = E / n;
  Exchange x;
  x.local.assign(static_cast<size_t>(El), 0);
  std::vector<int64_t> at(
      static_cast<size_t>(n * El));  // (n, El) where block (j, e) starts in the received rows
  int64_t R = 0;
  for (int64_t j = 0; j < n; ++j) {
    int64_t to_j = 0, from_j = 0;
    for (int64_t e = 0; e < El; ++e) {
      to_j += counts[static_cast<size_t>(j * El + e)];
      const int64_t c = all[static_cast<size_t>(j * E + me * El + e)];
      at[static_cast<size_t>(j * El + e)] = R + from_j;
      from_j += c;
      x.local[static_cast<size_t>(e)] += c;
    }
    x.send.push_back(to_j);
    x.recv.push_back(from_j);
    R += from_j;
  }
  for (int64_t e = 0; e < El; ++e)  // local expert order: expert e's rows from member 0, 1, ...
    for (int64_t j = 0; j < n; ++j)
      for (int64_t t = 0; t < all[static_cast<size_t>(j * E + me * El + e)]; ++t)
        x.by_expert.push_back(static_cast<int32_t>(at[static_cast<size_t>(j * El + e)] + t));
  return x;
}

// w (El, ...) this rank's slice as it is, or (E, ...) whole -> its rows [rank El, (rank + 1) El)
// (split's backward gives the other rows a zero gradient)
Tensor my_experts(const Tensor& w, int64_t El, int64_t rank) {
  if (w.size(0) == El) return w;
  std::vector<int64_t> sizes;
  if (rank > 0) sizes.push_back(rank * El);
  sizes.push_back(El);
  if (w.size(0) > (rank + 1) * El) sizes.push_back(w.size(0) - (rank + 1) * El);
  return split(w, 0, sizes)[rank > 0 ? 1 : 0];
}

// x (R, C) -> (R, C): row r is x[order[r]] (a row gather; backward: the scatter-add)
Tensor permute_rows(const Tensor& x, const std::vector<int32_t>& order) {
  const int64_t R = x.size(0);
  MoeRouting p;
  p.tokens = R, p.k = 1, p.counts = {R};
  p.order = Tensor::from_vector(order, {R}).to(x.device());
  return moe_dispatch(x, p);
}

}  // namespace

Tensor expert_parallel_mlp(const nn::Experts& ex, const Tensor& xf, const Tensor& w, const Tensor& choices,
                           Communicator& ep) {
  const int64_t n = ep.size(), E = ex.E;
  NDT_CHECK(E % n == 0 && (ex.gate_proj.size(0) == E / n || ex.gate_proj.size(0) == E),
            "expert parallelism: ", ex.gate_proj.size(0), " experts here of ", E, " over ", n,
            " ranks; apply_expert_parallel slices them");
  const MoeRouting r = moe_sort(choices, E);  // (N k) rows sorted by expert: member j's contiguous
  const Exchange x = plan_exchange(r.counts, gather_counts(r.counts, ep), n, ep.rank());
  std::vector<int32_t> back(x.by_expert.size());  // the inverse permutation: received order
  for (size_t i = 0; i < back.size(); ++i)
    back[static_cast<size_t>(x.by_expert[i])] = static_cast<int32_t>(i);
  const Tensor xr = dispatch_to_experts(moe_dispatch(xf, r), x.send, x.recv, ep);  // (R, C)
  const int64_t El = E / n, me = ep.rank();
  // (R = 0, no rows here: the experts still run, on none, so that their (zero) gradients arrive
  // every backward and FSDP reduces their unit with the other ranks holding them)
  const Tensor xe = permute_rows(xr, x.by_expert);  // (R, C) by local expert
  const Tensor ye = nn::Experts::swiglu(xe, my_experts(ex.gate_proj, El, me), my_experts(ex.up_proj, El, me),
                                        my_experts(ex.down_proj, El, me), x.local);
  const Tensor yr = permute_rows(ye, back);                       // (R, C) in the received order
  const Tensor y = combine_from_experts(yr, x.send, x.recv, ep);  // (N k, C) in r's order
  return moe_combine(y, w, r);                                    // (N, C)
}

}  // namespace ndt::dist
