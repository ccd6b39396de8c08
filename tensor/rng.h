// ndtrain: counter-based random numbers (Philox4x32-10).
//
// The value at element i of a fill depends only on (seed, stream, i): no hidden state,
// identical on CPU and CUDA, and any slice generated alone equals the same slice of the
// whole tensor generated at once. Parameters are initialized this way, keyed by
// (seed, parameter id, global element index), so every layout and device sees the same
// values and no rank ever materializes more than its shard.
//
//   Tensor w = Tensor::empty({768, 3072});
//   kernels::fill_normal(w, /*seed=*/1337, /*stream=*/param_id, /*start=*/0, 0.0f, 0.02f);
//   // shard r of 4: the same values as rows [r*192, (r+1)*192) of the whole
//   kernels::fill_normal(shard, 1337, param_id, /*start=*/r * 192 * 3072, 0.0f, 0.02f);
//
// The fills themselves are kernels (tensor/kernels.h, tensor/{cpu,cuda}/rng); this header
// holds the generator both share.
//
// Element i uses Philox block i/4 (counter = (i/4, stream)), lane i%4, key = seed.
// Uniform: lo + (hi-lo) * ((u>>8) + 0.5) / 2^24 (never exactly lo or hi). Normal: Box-Muller
// on the lane pair (2*(i/2)%4, +1) of the same block: cos for even i, sin for odd i.
#pragma once

#include <cmath>
#include <cstdint>

#include "tensor/dtype.h"

namespace ndt {

struct Philox {
  // One Philox4x32-10 block: counter (c0..c3), key (k0,k1) -> 4 random 32-bit words.
  NDT_HD static void block(uint32_t c[4], uint32_t k0, uint32_t k1) {
    constexpr uint32_t M0 = 0xD2511F53u, M1 = 0xCD9E8D57u, W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
    for (int r = 0; r < 10; ++r) {
      const uint64_t p0 = static_cast<uint64_t>(M0) * c[0];
      const uint64_t p1 = static_cast<uint64_t>(M1) * c[2];
      const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
      const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
      const uint32_t n0 = hi1 ^ c[1] ^ k0, n2 = hi0 ^ c[3] ^ k1;
      c[0] = n0;
      c[1] = lo1;
      c[2] = n2;
      c[3] = lo0;
      k0 += W0;
      k1 += W1;
    }
  }
  // The 4 words of block `idx` for (seed, stream).
  NDT_HD static void words(uint64_t seed, uint64_t stream, uint64_t idx, uint32_t out[4]) {
    out[0] = static_cast<uint32_t>(idx);
    out[1] = static_cast<uint32_t>(idx >> 32);
    out[2] = static_cast<uint32_t>(stream);
    out[3] = static_cast<uint32_t>(stream >> 32);
    block(out, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  }
  NDT_HD static double uniform01(uint32_t u) {  // in (0, 1), 24 random bits
    return (static_cast<double>(u >> 8) + 0.5) * (1.0 / 16777216.0);
  }
  // Dropout's mask (kernels::dropout): whether element i of (seed, stream) is kept with
  // probability 1 - p (lane i % 4 of block i / 4, as uniform).
  NDT_HD static bool keep(uint64_t seed, uint64_t stream, uint64_t i, double p) {
    uint32_t w[4];
    words(seed, stream, i / 4, w);
    return uniform01(w[i % 4]) >= p;
  }
  // Computed in double and rounded once to float, so CPU and CUDA agree (the libm
  // functions differ by at most an ulp in double, far below float resolution).
  NDT_HD static float uniform(uint64_t seed, uint64_t stream, uint64_t i, float lo, float hi) {
    uint32_t w[4];
    words(seed, stream, i / 4, w);
    return static_cast<float>(lo + (static_cast<double>(hi) - lo) * uniform01(w[i % 4]));
  }
  NDT_HD static float normal(uint64_t seed, uint64_t stream, uint64_t i, float mean, float std) {
    uint32_t w[4];
    words(seed, stream, i / 4, w);
    const int pair = static_cast<int>((i % 4) / 2) * 2;
    const double u1 = uniform01(w[pair]), u2 = uniform01(w[pair + 1]);
    const double r = sqrt(-2.0 * log(u1));
    const double a = 6.283185307179586 * u2;
    return static_cast<float>(mean + static_cast<double>(std) * ((i % 2 == 0) ? r * cos(a) : r * sin(a)));
  }
};

}  // namespace ndt
