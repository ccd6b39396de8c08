// ndtrain: generating text from a GPT with temperature and top-k sampling.
//
//   std::vector<int32_t> ids = train::generate(gpt, prompt_ids, /*length=*/200,
//                                              /*temperature=*/0.8, /*top_k=*/40, /*seed=*/1, device);
//
// Each new token is drawn with the counter-based RNG keyed by (seed, token index), so a
// sample is reproducible. The context is the last block_size tokens (no KV cache: simple,
// and fast enough for the small models it is used with here).
//
// `bucket` > 1 pads the context on the right to a multiple of it (at most block_size) with
// token 0: causal attention keeps position T-1 blind to what follows, so the next token is
// the same, and the model sees few distinct lengths. That matters on CUDA, where cuDNN's
// fused attention builds a graph per shape (up to a second each): 0 (the default) is 64 on
// CUDA and 1 on the CPU, where the padding would only cost time.
#pragma once

#include <cstdint>
#include <vector>

#include "models/gpt.h"

namespace ndt::train {

std::vector<int32_t> generate(const models::GPT& gpt, std::vector<int32_t> prompt, int64_t length,
                              double temperature, int64_t top_k, uint64_t seed, Device device,
                              int64_t bucket = 0);

}  // namespace ndt::train
