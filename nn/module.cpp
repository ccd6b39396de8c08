#include "nn/module.h"

namespace ndt::nn {

void Module::param(const std::string& name, Tensor* slot, Shape shape, Init init, bool weight_decay) {
  for (const Entry& e : entries_) NDT_CHECK(e.name != name, "Module: '", name, "' registered twice");
  entries_.push_back({name, nullptr, ParamSpec{name, std::move(shape), init, weight_decay, slot}});
}

void Module::child(const std::string& name, Module* m) {
  for (const Entry& e : entries_) NDT_CHECK(e.name != name, "Module: '", name, "' registered twice");
  entries_.push_back({name, m, {}});
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
