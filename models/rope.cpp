#include "models/rope.h"

#include <cmath>

#include "tensor/error.h"

namespace ndt::models {

namespace {

// The frequencies in T: float (as Hugging Face computes them) or double (a float64 model).
template <typename T>
std::vector<T> inv_freq(int64_t head_dim, const RopeConfig& rope) {
  NDT_CHECK(head_dim >= 2 && head_dim % 2 == 0, "rotary embedding: the head dimension ", head_dim,
            " must be even (pairs of channels turn together)");
  NDT_CHECK(std::isfinite(rope.theta) && rope.theta > 1, "rotary embedding: rope_theta = ", rope.theta,
            " must be a finite number > 1");
  const int64_t H = head_dim / 2;
  std::vector<T> inv(static_cast<size_t>(H));
  // as HF: base ** (arange(0, dim, 2) / dim), then its reciprocal
  for (int64_t i = 0; i < H; ++i)
    inv[i] = T(1) / std::pow(static_cast<T>(rope.theta), static_cast<T>(2 * i) / static_cast<T>(head_dim));
  if (!rope.llama3) return inv;
  const Llama3Scaling& s = *rope.llama3;
  NDT_CHECK(s.factor > 0 && s.low_freq_factor > 0 && s.high_freq_factor > s.low_freq_factor &&
                s.original_max_position > 0,
            "rotary embedding: llama3 scaling needs factor > 0, 0 < low_freq_factor < high_freq_factor and "
            "original_max_position_embeddings > 0, got factor ",
            s.factor, ", low_freq_factor ", s.low_freq_factor, ", high_freq_factor ", s.high_freq_factor,
            ", original_max_position_embeddings ", s.original_max_position);
  const double old_len = static_cast<double>(s.original_max_position);
  const double low_wavelen = old_len / s.low_freq_factor, high_wavelen = old_len / s.high_freq_factor;
  for (T& f : inv) {
    const double wavelen = 2 * M_PI / f;
    if (wavelen < high_wavelen) continue;  // high frequencies: as trained
    if (wavelen > low_wavelen) {           // low frequencies: stretched by factor
      f = static_cast<T>(f / s.factor);
      continue;
    }
    // the band between: blended from stretched to as trained
    const double smooth = (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
    f = static_cast<T>((1 - smooth) * f / s.factor + smooth * f);
  }
  return inv;
}

template <typename T>
RopeTables tables(const Tensor& positions, int64_t head_dim, const RopeConfig& rope, DType dtype) {
  const std::vector<T> inv = inv_freq<T>(head_dim, rope);
  const int64_t B = positions.size(0), T_ = positions.size(1), H = head_dim / 2;
  const std::vector<int32_t> pos = positions.to(Device::cpu()).contiguous().to_vector<int32_t>();
  std::vector<T> c(static_cast<size_t>(B * T_ * H)), s(c.size());
  for (int64_t bt = 0; bt < B * T_; ++bt)
    for (int64_t i = 0; i < H; ++i) {
      const T angle = static_cast<T>(pos[bt]) * inv[i];
      c[bt * H + i] = std::cos(angle);
      s[bt * H + i] = std::sin(angle);
    }
  auto table = [&](const std::vector<T>& v) {
    return Tensor::from_vector(v, {B, T_, H}).to(dtype).to(positions.device());
  };
  return {table(c), table(s)};
}

}  // namespace

std::vector<float> rope_inv_freq(int64_t head_dim, const RopeConfig& rope) {
  return inv_freq<float>(head_dim, rope);
}

RopeTables rope_tables(const Tensor& positions, int64_t head_dim, const RopeConfig& rope, DType dtype) {
  NDT_CHECK(positions.dim() == 2 && positions.dtype() == DType::i32,
            "rope_tables: positions (B, T) i32, got ", positions.desc());
  // float32 angles as Hugging Face computes them; a float64 model (gradient checks, the
  // reference tests) keeps float64 throughout
  return dtype == DType::f64 ? tables<double>(positions, head_dim, rope, dtype)
                             : tables<float>(positions, head_dim, rope, dtype);
}

}  // namespace ndt::models
