// ndtrain: fine-tuning rows (.jsonl, one JSON object a line; or a .parquet file's rows,
// train/data/parquet.h) into documents of tokens with loss masks, as TRL and Axolotl read
// them. A row's format comes from its fields (their names can be changed; other fields are
// ignored), tried in this order:
//   messages   [{"role", "content"}, ...]: rendered by the model folder's chat template
//              (tokenizer/chat_template.h), tokenized without adding special tokens (the
//              template writes them); only the assistant messages' content and end of turn
//              are trained. Roles: system, user, assistant, tool (where the template has it).
//   prompt + completion: tokenized as the tokenizer adds special tokens (BOS for Llama 3),
//              then the tokenizer's eos; only the completion and the eos are trained (the
//              prompt's tokens are those of the prompt alone, as TRL counts them).
//   text       a document, all trained, with the special tokens added and then the eos.
// train_on_all trains every token. A bad row (malformed JSON, a missing or non-string field,
// an unknown role, an empty conversation, a template error) throws BadRow naming the reason.
//
//   tok::Tokenizer t = tok::Tokenizer::from_file("models/qwen3");
//   data::JsonlReader reader(t, "models/qwen3", {});
//   data::Document d = reader.row(R"({"prompt": "2+2=", "completion": "4"})");
//   // d.ids: the tokens; d.trained[i]: 1 when token i is a trained target
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace ndt::data {

struct JsonlOptions {
  std::string text_field = "text", prompt_field = "prompt", completion_field = "completion",
              messages_field = "messages";
  bool train_on_all = false;  // every token trained (the prompt and the template's text too)
};

struct Document {
  std::vector<int32_t> ids;
  std::vector<uint8_t> trained;  // per token: 1 trained as a target, 0 not
};

// Why a row cannot be read (without the file and line, which the caller knows).
struct BadRow : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class JsonlReader {
 public:
  // tokenizer_path: the --tokenizer given (tokenizer.json or its folder): its folder's chat
  // template renders messages rows (none there: such rows are bad rows saying so).
  JsonlReader(const tok::Tokenizer& t, const std::string& tokenizer_path, JsonlOptions o);
  // One line's document; throws BadRow. A blank line gives an empty document (no row).
  Document row(std::string_view line) const;
  // A row already parsed (a Parquet file's: train/data/parquet.h).
  Document row(const nlohmann::json& row) const;
  // A text row's document (a text file given beside the .jsonl files).
  Document text_row(const std::string& text) const;

 private:
  Document completion_row(const std::string& prompt, const std::string& completion) const;
  Document messages_row(const std::vector<tok::ChatMessage>& chat) const;

  const tok::Tokenizer& tok_;
  JsonlOptions o_;
  std::optional<tok::ChatTemplate> chat_;
  std::string no_chat_;  // why there is no chat template
};

}  // namespace ndt::data
