#include "train/sample.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "autograd/node.h"
#include "tensor/rng.h"

namespace ndt::train {

std::vector<int32_t> generate(const models::GPT& gpt, std::vector<int32_t> ids, int64_t length,
                              double temperature, int64_t top_k, uint64_t seed, Device device,
                              int64_t bucket) {
  autograd::NoGradGuard no_grad;
  if (bucket <= 0) bucket = device.is_cuda() ? 64 : 1;
  if (ids.empty()) ids.push_back(0);
  const int64_t V = gpt.cfg.vocab_size;
  const size_t start = ids.size();
  for (int64_t n = 0; n < length; ++n) {
    const int64_t T = std::min<int64_t>(static_cast<int64_t>(ids.size()), gpt.cfg.block_size);
    std::vector<int32_t> ctx(ids.end() - T, ids.end());
    // right padding to the bucket (positions >= T do not change position T-1's logits)
    const int64_t Tp = std::min<int64_t>((T + bucket - 1) / bucket * bucket, gpt.cfg.block_size);
    ctx.resize(static_cast<size_t>(Tp), 0);
    Tensor logits = gpt.forward(Tensor::from_vector(ctx, {1, Tp}, device), Tensor()).logits;  // (Tp, Vp)
    std::vector<float> last = logits.narrow(0, T - 1, 1).to_vector<float>();
    last.resize(V);  // drop padded columns
    // softmax(logits / temperature) restricted to the top k
    std::vector<int32_t> order(V);
    std::iota(order.begin(), order.end(), 0);
    const int64_t k = top_k > 0 ? std::min(top_k, V) : V;
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
      return last[a] > last[b] || (last[a] == last[b] && a < b);
    });
    std::vector<double> p(k);
    const double mx = last[order[0]];
    double sum = 0;
    for (int64_t i = 0; i < k; ++i) sum += p[i] = std::exp((last[order[i]] - mx) / temperature);
    const double u = Philox::uniform(seed, 0x5A3D1E, start + n, 0.0f, 1.0f) * sum;
    double acc = 0;
    int32_t next = order[k - 1];
    for (int64_t i = 0; i < k; ++i) {
      acc += p[i];
      if (u < acc) {
        next = order[i];
        break;
      }
    }
    ids.push_back(next);
  }
  return ids;
}

}  // namespace ndt::train
