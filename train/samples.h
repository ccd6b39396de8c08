// ndtrain: the samples train_gpt draws while it trains ([sample]): the vocabulary their text
// is decoded with, checked at start (not after hours of training), and the options each
// sample is drawn with.
//
//   std::unique_ptr<data::TextCodec> vocab = open_sample_vocabulary(c, out);  // nullptr: none
//   if (vocab) check_sample_prompt(c, *vocab);
//   ids = pm.generate(vocab->encode_prompt(c.sample.prompt), sample_options(c, step, *vocab));
#pragma once

#include <cstdint>
#include <memory>
#include <ostream>

#include "models/generate.h"
#include "train/config.h"
#include "train/data/text.h"

namespace ndt::train {

// The vocabulary of the samples' text (data::vocabulary_path: data.vocab, or the one of the
// data.train shards; nullptr: none). Throws ConfigError when it has more ids than
// model.vocab_size; says on `out` when the model's ids past it have no text.
std::unique_ptr<data::TextCodec> open_sample_vocabulary(const Config& c, std::ostream& out);

// Throws ConfigError when samples are drawn and sample.prompt cannot be encoded with `vocab`.
void check_sample_prompt(const Config& c, const data::TextCodec& vocab);

// [sample] as the options of the sample after `step`: seeded with train.seed + step (every
// rank draws the same tokens), ended by the tokenizer's end of text, never an id without text.
models::SampleOptions sample_options(const Config& c, int64_t step, const data::TextCodec& vocab);

}  // namespace ndt::train
