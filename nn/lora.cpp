#include "nn/lora.h"

#include <algorithm>
#include <cmath>
#include <map>

namespace ndt::nn {

double LoraConfig::scale() const {
  const double r = static_cast<double>(rank);
  return rslora ? alpha / std::sqrt(r) : alpha / r;
}

bool lora_target_matches(const std::string& target, const std::string& name) {
  if (target == "all-linear" || target == name) return true;
  return name.size() > target.size() &&
         name.compare(name.size() - target.size(), target.size(), target) == 0 &&
         name[name.size() - target.size() - 1] == '.';
}

std::vector<std::string> default_lora_targets(const std::vector<LinearSite>& sites) {
  for (const LinearSite& s : sites)
    if (lora_target_matches("q_proj", s.name)) return {"q_proj", "v_proj"};
  return {"c_attn"};
}

void check_lora(const LoraConfig& c, const std::vector<LinearSite>& sites) {
  NDT_CHECK(c.rank >= 1, "lora.rank must be >= 1 to train adapters (0: no LoRA), got ", c.rank);
  NDT_CHECK(std::isfinite(c.alpha) && c.alpha > 0, "lora.alpha must be > 0, got ", c.alpha);
  NDT_CHECK(c.dropout >= 0 && c.dropout < 1, "lora.dropout = ", c.dropout,
            " must be in [0, 1) (the probability of dropping an adapter's input element)");
  std::string known;
  for (const LinearSite& s : sites) known += (known.empty() ? "" : ", ") + s.name;
  const std::vector<std::string> targets = c.targets.empty() ? default_lora_targets(sites) : c.targets;
  for (const std::string& t : targets) {
    bool found = false;
    for (const LinearSite& s : sites) {
      if (!lora_target_matches(t, s.name)) continue;
      found = true;
      const int64_t width = std::min(s.linear->in, s.out());
      NDT_CHECK(c.rank <= width, "lora.rank = ", c.rank, " is above the width ", width, " of ", s.name, " (",
                s.linear->in, " -> ", s.out(), "); lower lora.rank");
    }
    NDT_CHECK(found, "lora.targets: '", t, "' names none of this model's linears (", known,
              ", or all-linear)");
  }
}

LoraAdapter::LoraAdapter(int64_t in_, int64_t out_, int64_t r) : in(in_), out(out_), rank(r) {
  // torch's kaiming_uniform_(a = sqrt(5)) on (r, in): bound = sqrt(6 / ((1 + 5) in)) = 1 / sqrt(in)
  param("lora_A", &A, {r, in}, Init::uniform(1.0f / std::sqrt(static_cast<float>(in))), true);
  param("lora_B", &B, {out, r}, Init::zeros(), true);
}

// x (N, in) -> (N, in): its elements' mask keyed as LoraDropout says
Tensor LoraDropout::drop(const Tensor& x, int64_t width, int64_t col_start, uint64_t id) const {
  const kernels::DropoutKey key{
      .p = p,
      .seed = seed,
      .stream = (static_cast<uint64_t>(step) << 32) ^ (static_cast<uint64_t>(micro) << 20) ^ id,
      .row_start = row_start,
      .row_stride = width,
      .col_start = col_start,
      .seq_len = seq_len};  // with positions (the op sets the key's pointer to them)
  return ndt::dropout(x, key, positions);
}

// x (N, in) -> [dropout] -> (x A^T) (N, r) -> x scale -> (N, r) B^T -> (N, out)
Tensor LoraAdapter::forward(const Tensor& x, double s, const LoraDropout* d) const {
  // the mask of x's rows and columns of the whole input (see LoraDropout)
  const Tensor xin = d && d->on() ? d->drop(x, in, in_start, id) : x;
  return matmul(ndt::scale(matmul(xin, A, false, true), s), B, false, true);
}

Tensor LoraLinear::delta(const Tensor& x) const {
  if (site_.part < 0 && parts_.size() == 1 && parts_[0].first < 0)
    return parts_[0].second->forward(x, scale_, dropout_.get());
  // packed: each part's delta (N, groups, size) in its columns of every group (this rank's
  // kv groups under tensor parallelism: B holds their rows), zeros where no adapter
  const int64_t N = x.size(0);
  std::vector<Tensor> deltas(site_.sizes.size());  // (N, groups size) per part
  int64_t groups = 0, width = 0;
  for (const auto& [part, a] : parts_) {
    deltas[static_cast<size_t>(part)] = a->forward(x, scale_, dropout_.get());
    groups = deltas[static_cast<size_t>(part)].size(1) / site_.sizes[static_cast<size_t>(part)];
  }
  std::vector<Tensor> pieces;
  for (size_t p = 0; p < site_.sizes.size(); ++p) {
    const int64_t size = site_.sizes[p];
    width += size;
    pieces.push_back(deltas[p].defined() ? view(deltas[p], {N, groups, size})
                                         : Tensor::zeros({N, groups, size}, x.dtype(), x.device()));
  }
  return view(concat_last(pieces), {N, groups * width});  // (N, groups, width) -> (N, out)
}

LoraBlock::LoraBlock(DecoderBlock& block, const LoraConfig& c, std::shared_ptr<const LoraDropout> dropout,
                     int64_t layer) {
  const std::vector<LinearSite> all = block.linear_sites();
  check_lora(c, all);
  const std::vector<std::string> targets = c.targets.empty() ? default_lora_targets(all) : c.targets;
  std::map<Linear*, std::shared_ptr<LoraLinear>> on;  // each linear's adapters, by part
  for (const LinearSite& s : all) {
    bool targeted = false;
    for (const std::string& t : targets) targeted = targeted || lora_target_matches(t, s.name);
    if (!targeted) continue;
    adapters.push_back(std::make_unique<LoraAdapter>(s.linear->in, s.out(), c.rank));
    adapters.back()->id = (static_cast<uint64_t>(layer) << 8) | adapters.size();  // < 2^20 for 4096 blocks
    names.push_back(s.name);
    sites.push_back(s);
    child(s.name, adapters.back().get());
    std::shared_ptr<LoraLinear>& l = on[s.linear];
    if (!l) l = std::make_shared<LoraLinear>(s, c.scale(), dropout);
    l->add(s.part, adapters.back().get());
  }
  for (auto& [linear, l] : on) linear->adapter = l;
}

void LoraBlock::split_tensor_parallel(const TensorParallelPlan& plan, int64_t parts, int64_t rank) {
  for (size_t i = 0; i < adapters.size(); ++i) {
    const LinearSite& site = sites[i];
    for (const TensorParallelPlan::Split& s : plan.linears) {
      if (s.linear != site.linear) continue;
      LoraAdapter& a = *adapters[i];
      if (s.column) {
        // B (out, r): the rows of the linear's columns on this rank (a packed part's rows
        // are its kv groups in order, split as the linear's whole groups)
        a.split_param("lora_B", 0, parts, rank, site.part < 0 ? s.groups : 1);
        a.mark_partial_grads("lora_A");  // dA = s (dy B)^T x: this rank's columns' share of dy B
      } else {
        a.split_param("lora_A", 1, parts, rank);  // A (r, in): the linear's rows on this rank
        a.in_start = rank * (a.in / parts);       // x's columns: those rows of the whole input
        a.mark_partial_grads("lora_B");           // dB = s dy^T (x_i A_i^T): this rank's rows' share
      }
    }
  }
}

}  // namespace ndt::nn
