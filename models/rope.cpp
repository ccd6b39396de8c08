#include "models/rope.h"

#include <cmath>

#include "tensor/error.h"

namespace ndt::models {

std::vector<float> rope_inv_freq(int64_t head_dim, const RopeConfig& rope) {
  NDT_CHECK(head_dim >= 2 && head_dim % 2 == 0, "rotary embedding: the head dimension ", head_dim,
            " must be even (pairs of channels turn together)");
  NDT_CHECK(std::isfinite(rope.theta) && rope.theta > 1, "rotary embedding: rope_theta = ", rope.theta,
            " must be a finite number > 1");
  const int64_t H = head_dim / 2;
  std::vector<float> inv(static_cast<size_t>(H));
  // as HF: base ** (arange(0, dim, 2) / dim) in float32, then its reciprocal
  for (int64_t i = 0; i < H; ++i)
    inv[i] = 1.0f / std::pow(static_cast<float>(rope.theta), static_cast<float>(2 * i) / static_cast<float>(head_dim));
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
  for (float& f : inv) {
    const double wavelen = 2 * M_PI / f;
    if (wavelen < high_wavelen) continue;  // high frequencies: as trained
    if (wavelen > low_wavelen) {           // low frequencies: stretched by factor
      f = static_cast<float>(f / s.factor);
      continue;
    }
    // the band between: blended from stretched to as trained
    const double smooth = (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
    f = static_cast<float>((1 - smooth) * f / s.factor + smooth * f);
  }
  return inv;
}

RopeTables rope_tables(const Tensor& positions, int64_t head_dim, const RopeConfig& rope, DType dtype) {
  NDT_CHECK(positions.dim() == 2 && positions.dtype() == DType::i32, "rope_tables: positions (B, T) i32, got ",
            positions.desc());
  const std::vector<float> inv = rope_inv_freq(head_dim, rope);
  const int64_t B = positions.size(0), T = positions.size(1), H = head_dim / 2;
  const std::vector<int32_t> pos = positions.to(Device::cpu()).contiguous().to_vector<int32_t>();
  std::vector<float> c(static_cast<size_t>(B * T * H)), s(c.size());
  for (int64_t bt = 0; bt < B * T; ++bt)
    for (int64_t i = 0; i < H; ++i) {
      const float angle = static_cast<float>(pos[bt]) * inv[i];  // float32, as HF
      c[bt * H + i] = std::cos(angle);
      s[bt * H + i] = std::sin(angle);
    }
  auto table = [&](const std::vector<float>& v) {
    return Tensor::from_vector(v, {B, T, H}).to(dtype).to(positions.device());
  };
  return {table(c), table(s)};
}

}  // namespace ndt::models
