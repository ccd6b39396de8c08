// ndtrain: the "model" object of a byte-level BPE tokenizer.json, as Hugging Face's
// `tokenizers` writes it and tokenizer/load.cpp reads it: the vocabulary and the merges,
// every other field at its default. For the files ndtrain writes (a byte vocabulary as
// tokenizer.json) and the tests' small tokenizers.
//
//   j["model"] = tok::bpe_model_json({{"a", 0}, {"b", 1}, {"ab", 2}}, {"a b"});
#pragma once

#include <nlohmann/json.hpp>

namespace ndt::tok {

// vocab: an object token -> id; merges: an array of "a b" strings or ["a", "b"] pairs.
nlohmann::json bpe_model_json(nlohmann::json vocab, nlohmann::json merges);

}  // namespace ndt::tok
