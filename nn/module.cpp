#include "nn/module.h"

namespace ndt::nn {

void Module::param(const std::string& name, Tensor* slot, Shape shape, Init init, bool weight_decay) {
  for (const Entry& e : entries_) NDT_CHECK(e.name != name, "Module: '", name, "' registered twice");
  entries_.push_back({name, nullptr, ParamSpec{name, std::move(shape), init, weight_decay, slot, TpSlice{}}});
}

void Module::child(const std::string& name, Module* m) {
  for (const Entry& e : entries_) NDT_CHECK(e.name != name, "Module: '", name, "' registered twice");
  entries_.push_back({name, m, {}});
}

void Module::split_param(const std::string& name, int dim, int64_t parts, int64_t rank, int64_t groups) {
  for (Entry& e : entries_) {
    if (e.child || e.name != name) continue;
    ParamSpec& s = e.spec;
    NDT_CHECK(s.tp.dim < 0, "split_param: '", name, "' is split already");
    NDT_CHECK(dim >= 0 && dim < static_cast<int>(s.shape.size()), "split_param: '", name, "' ",
              shape_str(s.shape), " has no dimension ", dim);
    NDT_CHECK(parts >= 1 && rank >= 0 && rank < parts && groups >= 1, "split_param: bad part ", rank, " of ",
              parts);
    NDT_CHECK(s.shape[dim] % (parts * groups) == 0, "split_param: dimension ", dim, " of '", name, "' ",
              shape_str(s.shape), " does not divide into ", groups, " x ", parts, " parts");
    s.tp = TpSlice{dim, parts, rank, groups, s.shape};
    s.shape[dim] /= parts;  // Init::rows stays global: materialize maps local to global indices
    return;
  }
  NDT_FAIL("split_param: no parameter '", name, "'");
}

void Module::split_experts(const std::string& name, int64_t parts, int64_t rank) {
  split_param(name, 0, parts, rank);
  for (Entry& e : entries_)
    if (!e.child && e.name == name) e.spec.tp.experts = true;
}

void Module::mark_partial_grads(const std::string& name) {
  for (Entry& e : entries_)
    if (!e.child && (name.empty() || e.name == name)) e.spec.tp.partial_grad = true;
}

std::vector<ParamSpec> Module::parameters(const std::string& prefix) const {
  std::vector<ParamSpec> out;
  for (const Entry& e : entries_) {
    const std::string full = prefix.empty() ? e.name : prefix + "." + e.name;
    if (e.child) {
      for (ParamSpec& s : e.child->parameters(full)) out.push_back(std::move(s));
    } else {
      ParamSpec s = e.spec;
      s.name = full;
      out.push_back(std::move(s));
    }
  }
  return out;
}

}  // namespace ndt::nn
