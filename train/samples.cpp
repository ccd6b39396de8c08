#include "train/samples.h"

#include <string>

namespace ndt::train {

std::unique_ptr<data::TextCodec> open_sample_vocabulary(const Config& c, std::ostream& out) {
  const std::string vocab_path = data::vocabulary_path(c.data.vocab, c.data.train);
  if (vocab_path.empty()) return nullptr;
  auto vocab = std::make_unique<data::TextCodec>(data::TextCodec::load(vocab_path));
  if (vocab->vocab_size() > c.model.vocab_size)
    throw ConfigError("the vocabulary " + vocab_path + " has " + std::to_string(vocab->vocab_size()) +
                      " tokens but model.vocab_size is " + std::to_string(c.model.vocab_size));
  if (vocab->vocab_size() < c.model.vocab_size && c.sample.every >= 0 && c.sample.length > 0)
    out << "samples: drawn from the " << vocab->vocab_size() << " ids of " << vocab_path
        << " (model.vocab_size " << c.model.vocab_size << ": the ids past them have no text)\n";
  return vocab;
}

void check_sample_prompt(const Config& c, const data::TextCodec& vocab) {
  if (c.sample.every < 0 || c.sample.length <= 0) return;  // no samples: no prompt to encode
  try {
    vocab.encode_prompt(c.sample.prompt);
  } catch (const Error& e) {
    throw ConfigError("sample.prompt cannot be encoded with " +
                      data::vocabulary_path(c.data.vocab, c.data.train) + ": " + e.what());
  }
}

models::SampleOptions sample_options(const Config& c, int64_t step, const data::TextCodec& vocab) {
  models::SampleOptions o;
  o.max_new_tokens = c.sample.length, o.temperature = c.sample.temperature, o.top_k = c.sample.top_k;
  o.top_p = c.sample.top_p, o.seed = static_cast<uint64_t>(c.train.seed + step);
  if (vocab.eos_id()) o.stop_ids = {*vocab.eos_id()};  // a tokenizer's end of text ends the sample
  o.vocab_limit = vocab.vocab_size();                  // never an id without text
  return o;
}

}  // namespace ndt::train
