// ndtrain: a model's own chat template, read from its folder and rendered as transformers'
// tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=...) renders
// it (the Jinja subset of tokenizer/jinja.h), plus where each assistant message's trained
// text lies in the result, for loss masks.
//
//   tok::ChatTemplate t = tok::ChatTemplate::from_folder("models/qwen3");
//   std::vector<tok::ChatMessage> chat = {{"user", "Hi"}, {"assistant", "Hello!"}};
//   tok::RenderedChat r = t.render_with_spans(chat);
//   // r.text: "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n...Hello!<|im_end|>\n"
//   // r.assistant[0]: the bytes of "Hello!<|im_end|>" in r.text
//   std::string prompt = t.render({{"user", "Hi"}}, {.add_generation_prompt = true});
//   // then Tokenizer::encode(prompt) (no special tokens added: the template wrote them)
//
// The template comes from the folder's chat_template.jinja (transformers 5 writes it), else
// tokenizer_config.json's "chat_template" (a string, or a list of {"name", "template"} whose
// "default" is used); bos_token and eos_token from tokenizer_config.json (a string or an
// AddedToken object {"content": ...}). The template sees messages, add_generation_prompt,
// bos_token, eos_token, tools and documents (none) and the caller's extra variables (for
// example enable_thinking for Qwen3).
//
// Assistant spans. For assistant message i the conversation is rendered a second time with
// that message's content replaced by a sentinel; the text before the sentinel must be a
// prefix of the real rendering and the text after it a suffix, and what lies between is the
// content as the template wrote it (Llama 3 and Mistral trim it). The span is that content
// plus the end-of-turn marker written right after it (end_of_turn(): <|eot_id|>, <|im_end|>,
// </s>), never the role header or the newline after the marker. A template that rewrites an
// assistant message's content (Qwen3 moves a <think>...</think> part into its own block, or
// drops it from earlier turns) breaks the prefix/suffix property for that message: rendering
// spans then throws one error naming the message, never a wrong mask. Spans are byte offsets
// into the UTF-8 text.
#pragma once

#include <string>
#include <vector>

#include "tokenizer/jinja.h"

namespace ndt::tok {

struct ChatMessage {
  std::string role, content;
};

struct ChatOptions {
  bool add_generation_prompt = false;
  jinja::Object extra;  // more template variables, e.g. extra.set("enable_thinking", false)
};

struct AssistantSpan {
  size_t message = 0;         // index in the conversation
  size_t begin = 0, end = 0;  // bytes [begin, end) of the rendered text: content + end of turn
};

struct RenderedChat {
  std::string text;
  std::vector<AssistantSpan> assistant;  // one per assistant message, in order
};

class ChatTemplate {
 public:
  // Throws ndt::Error (one line) when the folder has no chat template or it cannot be read.
  static ChatTemplate from_folder(const std::string& dir);
  static ChatTemplate from_string(const std::string& text, const std::string& bos, const std::string& eos,
                                  const std::string& source = "chat template");
  static bool folder_has_template(const std::string& dir);

  std::string render(const std::vector<ChatMessage>& messages, const ChatOptions& opt = {}) const;
  RenderedChat render_with_spans(const std::vector<ChatMessage>& messages, const ChatOptions& opt = {}) const;

  // The marker the template writes right after an assistant message's content, found by
  // rendering a probe conversation: the eos token if it comes first, else the <|...|> or
  // <...> token there. Throws if the template writes none.
  std::string end_of_turn() const;
  const std::string& bos_token() const { return bos_; }
  const std::string& eos_token() const { return eos_; }
  const std::string& source() const { return source_; }

 private:
  std::string render_raw(const std::vector<ChatMessage>& messages, const ChatOptions& opt) const;
  jinja::Template tmpl_;
  std::string bos_, eos_, source_;
  bool has_bos_ = false, has_eos_ = false;
};

}  // namespace ndt::tok
