#include "autograd/gradcheck.h"

#include <cmath>
#include <sstream>

#include "autograd/engine.h"
#include "autograd/node.h"
#include "tensor/kernels.h"

namespace ndt::autograd {
namespace {

double project(const std::vector<Tensor>& outs, const std::vector<std::vector<double>>& r) {
  double l = 0;
  for (size_t k = 0; k < outs.size(); ++k) {
    std::vector<double> v = outs[k].to_vector<double>();
    for (size_t i = 0; i < v.size(); ++i) l += v[i] * r[k][i];
  }
  return l;
}

}  // namespace

GradcheckResult gradcheck(const GradcheckFn& fn, const std::vector<Tensor>& inputs,
                          const GradcheckOptions& opt) {
  for (const Tensor& t : inputs) {
    if (!t.requires_grad()) continue;
    NDT_CHECK(t.dtype() == DType::f64 && t.device().is_cpu() && t.is_contiguous() && t.is_leaf(),
              "gradcheck: inputs requiring grad must be contiguous f64 CPU leaves, got ", t.desc());
  }
  // Analytical: one backward of L = sum_k <out_k, R_k>.
  std::vector<Tensor> outs = fn(inputs);
  std::vector<std::vector<double>> r(outs.size());
  std::vector<Tensor> rt;
  for (size_t k = 0; k < outs.size(); ++k) {
    Tensor rk = Tensor::empty(outs[k].shape(), DType::f64);
    kernels::fill_normal(rk, opt.seed, k, 0, 0.0f, 1.0f);
    r[k] = rk.to_vector<double>();
    rt.push_back(rk.to(outs[k].dtype()));
  }
  for (const Tensor& t : inputs)
    if (t.requires_grad()) t.set_grad(Tensor());
  std::vector<Tensor> used_o, used_g;
  for (size_t k = 0; k < outs.size(); ++k)
    if (outs[k].requires_grad()) {
      used_o.push_back(outs[k]);
      used_g.push_back(rt[k]);
    }
  GradcheckResult res;
  NDT_CHECK(!used_o.empty(), "gradcheck: no output depends on an input requiring grad");
  backward(used_o, used_g);

  // Numerical: central differences, one element at a time.
  NoGradGuard no_grad;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& x = inputs[i];
    if (!x.requires_grad()) continue;
    std::vector<double> ana =
        x.grad().defined() ? x.grad().to_vector<double>() : std::vector<double>(x.numel(), 0.0);
    double* p = x.data<double>();
    for (int64_t e = 0; e < x.numel(); ++e) {
      const double orig = p[e];
      p[e] = orig + opt.eps;
      const double lp = project(fn(inputs), r);
      p[e] = orig - opt.eps;
      const double lm = project(fn(inputs), r);
      p[e] = orig;
      const double num = (lp - lm) / (2 * opt.eps);
      const double err = std::abs(num - ana[e]);
      const double scale = std::max(std::abs(num), std::abs(ana[e]));
      res.checked++;
      res.max_abs_err = std::max(res.max_abs_err, err);
      if (scale >= 1e-4) res.max_rel_err = std::max(res.max_rel_err, err / scale);  // not for ~0 entries
      if (err > opt.atol + opt.rtol * scale && res.ok) {
        res.ok = false;
        std::ostringstream os;
        os.precision(10);
        os << "input " << i << " " << (x.name().empty() ? "" : "'" + x.name() + "' ") << x.shape_str()
           << " element " << e << ": finite difference " << num << " vs autograd " << ana[e] << " (abs err "
           << err << ")";
        res.message = os.str();
      }
    }
  }
  return res;
}

}  // namespace ndt::autograd
