// ndtrain: the angles of rotary position embedding (RoPE) for the Llama family, as Hugging
// Face computes them (LlamaRotaryEmbedding with rope_type "default" or "llama3").
//
// Head dimension HS has H = HS/2 frequencies, inv_freq_i = theta^(-2i/HS); the token at
// position p turns pair i by p * inv_freq_i. Llama 3's scaling stretches the low
// frequencies (wavelengths past original_max_position / low_freq_factor) by `factor`,
// keeps the high ones (wavelengths under original_max_position / high_freq_factor) and
// blends the band between, so a model trained at 8k positions reads 128k.
//
//   models::RopeConfig rope{.theta = 500000, .llama3 = models::Llama3Scaling{8, 1, 4, 8192}};
//   models::RopeTables t = models::rope_tables(positions, /*head_dim=*/64, rope, DType::f32);
//   Tensor q_rot = ndt::rotary(q, t.cos, t.sin);   // q (B,T,NH,HS), t.cos/t.sin (B,T,HS/2)
//
// As Hugging Face, the frequencies and angles are float32 and cos/sin are then converted to
// the model's dtype; a float64 model computes them in float64 (Hugging Face's own float64
// models do not, which costs them about 1e-7 of accuracy). Positions are given per token, so
// context parallelism's chunks take their global positions.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "tensor/tensor.h"

namespace ndt::models {

struct Llama3Scaling {
  double factor = 8;
  double low_freq_factor = 1;
  double high_freq_factor = 4;
  int64_t original_max_position = 8192;
};

struct RopeConfig {
  double theta = 10000;                 // rope_theta
  std::optional<Llama3Scaling> llama3;  // rope_scaling of rope_type "llama3" (none: default)
};

// The H = head_dim / 2 frequencies (float32), Llama 3's scaling applied when configured.
// Throws ndt::Error for an odd head_dim, a theta <= 1 or scaling factors that are not
// increasing (low < high) or positive.
std::vector<float> rope_inv_freq(int64_t head_dim, const RopeConfig& rope);

struct RopeTables {
  Tensor cos, sin;  // (B, T, H) in the requested dtype, on the positions' device
};
// positions (B, T) i32 (on any device) -> the cos and sin of every token's angles.
RopeTables rope_tables(const Tensor& positions, int64_t head_dim, const RopeConfig& rope, DType dtype);

}  // namespace ndt::models
