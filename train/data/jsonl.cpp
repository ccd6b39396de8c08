#include "train/data/jsonl.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "tensor/error.h"

namespace ndt::data {
namespace {

// The string field `name` of row `j`.
std::string string_field(const nlohmann::json& j, const std::string& name, const char* what = "field") {
  if (!j.contains(name)) throw BadRow(std::string("missing ") + what + " \"" + name + "\"");
  if (!j[name].is_string()) throw BadRow(std::string(what) + " \"" + name + "\" is not a string");
  return j[name].get<std::string>();
}

// The conversation of a messages row.
std::vector<tok::ChatMessage> conversation(const nlohmann::json& list, const std::string& field) {
  if (!list.is_array()) throw BadRow("field \"" + field + "\" is not a list of messages");
  if (list.empty()) throw BadRow("empty conversation (field \"" + field + "\" is [])");
  std::vector<tok::ChatMessage> chat;
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string at = "message " + std::to_string(i + 1) + ": ";
    if (!list[i].is_object()) throw BadRow(at + "not an object {\"role\", \"content\"}");
    try {
      chat.push_back({string_field(list[i], "role"), string_field(list[i], "content")});
    } catch (const BadRow& e) {
      throw BadRow(at + e.what());
    }
    const std::string& r = chat.back().role;
    if (r != "system" && r != "user" && r != "assistant" && r != "tool")
      throw BadRow(at + "unknown role \"" + r + "\" (system, user, assistant or tool)");
  }
  return chat;
}

// The byte offset in `text` where each token of ids starts (ids.size() + 1 entries, the last
// text.size()); empty when the tokens' bytes do not spell the text (a normalizer changed it).
std::vector<size_t> token_offsets(const tok::Tokenizer& t, const std::vector<int32_t>& ids,
                                  const std::string& text) {
  std::vector<size_t> at{0};
  for (int32_t id : ids) {
    const std::string& b = t.token_bytes(id);
    if (text.compare(at.back(), b.size(), b) != 0) return {};
    at.push_back(at.back() + b.size());
  }
  if (at.back() != text.size()) return {};
  return at;
}

}  // namespace

JsonlReader::JsonlReader(const tok::Tokenizer& t, const std::string& tokenizer_path, JsonlOptions o)
    : tok_(t), o_(std::move(o)) {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::is_directory(tokenizer_path) ? fs::path(tokenizer_path) : fs::path(tokenizer_path).parent_path();
  const std::string folder = dir.empty() ? "." : dir.string();
  if (tok::ChatTemplate::folder_has_template(folder)) {
    try {
      chat_ = tok::ChatTemplate::from_folder(folder);
    } catch (const std::exception& e) {
      no_chat_ = e.what();
    }
  } else {
    no_chat_ = "the tokenizer's folder " + folder +
               " has no chat template (chat_template.jinja or tokenizer_config.json's chat_template)";
  }
}

Document JsonlReader::text_row(const std::string& text) const {
  Document d;
  d.ids = tok_.encode(text, /*add_special=*/true);
  if (tok_.eos_id()) d.ids.push_back(*tok_.eos_id());
  d.trained.assign(d.ids.size(), 1);
  return d;
}

Document JsonlReader::completion_row(const std::string& prompt, const std::string& completion) const {
  Document d = text_row(prompt + completion);  // all trained, then the prompt's tokens not
  const size_t n_prompt = std::min(tok_.encode(prompt, /*add_special=*/true).size(), d.ids.size());
  if (!o_.train_on_all) std::fill(d.trained.begin(), d.trained.begin() + static_cast<long>(n_prompt), 0);
  return d;
}

// The rendered conversation tokenized as a whole; a token is trained when its bytes overlap
// an assistant span. Where the tokens' bytes do not spell the text, the pieces between the
// spans' edges are tokenized one by one instead.
Document JsonlReader::messages_row(const std::vector<tok::ChatMessage>& chat) const {
  if (!chat_) throw BadRow(no_chat_);
  tok::RenderedChat r;
  try {
    r = chat_->render_with_spans(chat);
  } catch (const std::exception& e) {
    throw BadRow(std::string("chat template error: ") + e.what());
  }
  tok::EncodeOptions opt;  // no special tokens added: the template wrote them
  Document d;
  d.ids = tok_.encode(r.text, opt);
  const std::vector<size_t> at = token_offsets(tok_, d.ids, r.text);
  if (!at.empty()) {
    d.trained.assign(d.ids.size(), o_.train_on_all ? 1 : 0);
    for (const tok::AssistantSpan& s : r.assistant)
      for (size_t i = 0; i < d.ids.size(); ++i)
        if (at[i] < s.end && at[i + 1] > s.begin) d.trained[i] = 1;
    return d;
  }
  d = {};
  size_t from = 0;
  auto piece = [&](size_t end, bool trained) {
    const std::vector<int32_t> ids = tok_.encode(std::string_view(r.text).substr(from, end - from), opt);
    d.ids.insert(d.ids.end(), ids.begin(), ids.end());
    d.trained.insert(d.trained.end(), ids.size(), trained || o_.train_on_all ? 1 : 0);
    from = end;
  };
  for (const tok::AssistantSpan& s : r.assistant) {
    piece(s.begin, false);
    piece(s.end, true);
  }
  piece(r.text.size(), false);
  return d;
}

Document JsonlReader::row(std::string_view line) const {
  if (line.find_first_not_of(" \t\r\n") == std::string_view::npos) return {};
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line);
  } catch (const std::exception& e) {
    throw BadRow(std::string("malformed JSON (") + e.what() + ")");
  }
  return row(j);
}

Document JsonlReader::row(const nlohmann::json& j) const {
  if (!j.is_object()) throw BadRow("not a JSON object");
  if (j.contains(o_.messages_field))
    return messages_row(conversation(j[o_.messages_field], o_.messages_field));
  if (j.contains(o_.prompt_field) || j.contains(o_.completion_field))
    return completion_row(string_field(j, o_.prompt_field), string_field(j, o_.completion_field));
  if (j.contains(o_.text_field)) return text_row(string_field(j, o_.text_field));
  throw BadRow("no field \"" + o_.messages_field + "\", \"" + o_.prompt_field + "\" + \"" +
               o_.completion_field + "\" or \"" + o_.text_field +
               "\" (set their names with --messages_field, " +
               "--prompt_field, --completion_field, --text_field)");
}

}  // namespace ndt::data
