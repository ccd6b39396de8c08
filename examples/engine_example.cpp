// The engine in one page (docs/engine.md): build a tiny computation, run backward, and
// check autograd's gradients against finite differences in float64.
#include <cstring>
#include <iostream>

#include "autograd/engine.h"
#include "autograd/gradcheck.h"
#include "autograd/ops.h"
#include "tensor/kernels.h"

using namespace ndt;

Tensor randn(const Shape& shape, uint64_t stream) {  // N(0,1), f64, same values everywhere
  Tensor t = Tensor::empty(shape, DType::f64);
  kernels::fill_normal(t, /*seed=*/42, stream, /*start=*/0, 0.0f, 1.0f);
  return t;
}

// The example itself: 0 when the gradients check out.
int example() {
  // x (4,3) @ w (3,2) + b (2) -> gelu -> sum: a scalar loss
  Tensor x = randn({4, 3}, 0);
  Tensor w = randn({3, 2}, 1).set_requires_grad(true).set_name("w");
  Tensor b = randn({2}, 2).set_requires_grad(true).set_name("b");
  auto f = [](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{ndt::sum(ndt::gelu(ndt::linear(in[0], in[1], in[2])))};
  };

  Tensor loss = f({x, w, b})[0];
  ndt::backward(loss);  // w.grad() += dloss/dw, b.grad() += dloss/db
  std::cout << "loss " << loss.item() << "\ndloss/dw " << w.grad() << "\ndloss/db " << b.grad() << "\n";

  autograd::GradcheckResult r = autograd::gradcheck(f, {x, w, b});
  std::cout << "gradcheck " << (r.ok ? "passed" : "FAILED: " + r.message) << " (" << r.checked
            << " elements, max abs err " << r.max_abs_err << ")\n";
  return r.ok ? 0 : 1;
}

int main(int argc, char** argv) {
  if (argc == 2 && (std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0)) {
    std::cout
        << "usage: engine_example\n  builds gelu(x w + b), runs backward and checks the gradients against "
           "finite differences in float64 (docs/engine.md); exits 1 when the check fails\n";
    return 0;
  }
  if (argc > 1) {
    std::cerr << "engine_example: error: it takes no arguments, got " << argv[1] << " (see --help)\n";
    return 2;
  }
  try {
    return example();
  } catch (const std::exception& e) {
    std::cerr << "engine_example: error: " << e.what() << "\n";
    return 1;
  }
}
