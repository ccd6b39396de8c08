// A model's chat template: loading it from the folder transformers saves, rendering a
// conversation, and locating each assistant message's trained text (see chat_template.h).
#include "tokenizer/chat_template.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tensor/error.h"
#include "tokenizer/json_checked.h"

namespace ndt::tok {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  NDT_CHECK(in.good(), "chat template: cannot read ", p.string());
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

json read_config(const fs::path& p) {
  try {
    return parse_json_checked(read_file(p), p.string());
  } catch (const json::exception& e) {
    NDT_FAIL("chat template: ", p.string(), " is not valid JSON (", e.what(), ")");
  }
}

// bos_token / eos_token: a string, an AddedToken object {"content": ...}, or null/absent.
bool token_field(const json& cfg, const char* key, std::string& out, const std::string& file) {
  if (!cfg.contains(key) || cfg[key].is_null()) return false;
  const json& v = cfg[key];
  if (v.is_string()) {
    out = v.get<std::string>();
    return true;
  }
  NDT_CHECK(v.is_object() && v.contains("content") && v["content"].is_string(), "chat template: ", file, ": ",
            key, " must be a string or an object with a string \"content\"");
  out = v["content"].get<std::string>();
  return true;
}

// tokenizer_config.json's chat_template: a string, or [{"name", "template"}] with a "default".
std::string template_field(const json& v, const std::string& file) {
  if (v.is_string()) return v.get<std::string>();
  NDT_CHECK(v.is_array(), "chat template: ", file,
            ": chat_template must be a string or a list of {name, template}");
  for (const json& t : v) {
    NDT_CHECK(t.is_object() && t.contains("name") && t.contains("template") && t["name"].is_string() &&
                  t["template"].is_string(),
              "chat template: ", file,
              ": each chat_template entry must be {\"name\": ..., \"template\": ...}");
    if (t["name"] == "default") return t["template"].get<std::string>();
  }
  NDT_FAIL("chat template: ", file, ": chat_template lists no template named \"default\"");
}

constexpr const char* kSentinel = "NDTSENTINELc9f1e27";

}  // namespace

bool ChatTemplate::folder_has_template(const std::string& dir) {
  std::error_code ec;
  if (fs::is_regular_file(fs::path(dir) / "chat_template.jinja", ec)) return true;
  const fs::path cfg = fs::path(dir) / "tokenizer_config.json";
  if (!fs::is_regular_file(cfg, ec)) return false;
  const json j = read_config(cfg);
  return j.is_object() && j.contains("chat_template") && !j["chat_template"].is_null();
}

ChatTemplate ChatTemplate::from_folder(const std::string& dir) {
  std::error_code ec;
  NDT_CHECK(fs::is_directory(dir, ec), "chat template: ", dir, " is not a folder (give a model folder)");
  const fs::path cfg_path = fs::path(dir) / "tokenizer_config.json";
  const fs::path jinja_path = fs::path(dir) / "chat_template.jinja";
  json cfg = json::object();
  if (fs::is_regular_file(cfg_path, ec)) cfg = read_config(cfg_path);
  NDT_CHECK(cfg.is_object(), "chat template: ", cfg_path.string(), " must hold a JSON object");
  std::string text, source;
  if (fs::is_regular_file(jinja_path, ec)) {
    text = read_file(jinja_path), source = jinja_path.string();
  } else if (cfg.contains("chat_template") && !cfg["chat_template"].is_null()) {
    text = template_field(cfg["chat_template"], cfg_path.string()), source = cfg_path.string();
  } else {
    NDT_FAIL("chat template: ", dir,
             " has no chat template (neither chat_template.jinja nor a "
             "\"chat_template\" in tokenizer_config.json); use a chat (Instruct) model's folder");
  }
  ChatTemplate t;
  try {
    t.tmpl_ = jinja::Template::parse(text);
  } catch (const ndt::Error& e) {
    NDT_FAIL(source, ": ", e.what());
  }
  t.source_ = source;
  t.has_bos_ = token_field(cfg, "bos_token", t.bos_, cfg_path.string());
  t.has_eos_ = token_field(cfg, "eos_token", t.eos_, cfg_path.string());
  return t;
}

ChatTemplate ChatTemplate::from_string(const std::string& text, const std::string& bos,
                                       const std::string& eos, const std::string& source) {
  ChatTemplate t;
  t.tmpl_ = jinja::Template::parse(text);
  t.bos_ = bos, t.eos_ = eos, t.source_ = source;
  t.has_bos_ = !bos.empty(), t.has_eos_ = !eos.empty();
  return t;
}

std::string ChatTemplate::render_raw(const std::vector<ChatMessage>& messages, const ChatOptions& opt) const {
  jinja::List msgs;
  for (const ChatMessage& m : messages) {
    jinja::Object o;
    o.set("role", jinja::Value(m.role));
    o.set("content", jinja::Value(m.content));
    msgs.push_back(jinja::Value::object(std::move(o)));
  }
  jinja::Object vars;  // apply_chat_template: special tokens, then the caller's kwargs over them
  if (has_bos_) vars.set("bos_token", jinja::Value(bos_));
  if (has_eos_) vars.set("eos_token", jinja::Value(eos_));
  for (const auto& [k, v] : opt.extra.items) vars.set(k, v);
  vars.set("messages", jinja::Value::list(std::move(msgs)));
  vars.set("tools", jinja::Value::none());
  vars.set("documents", jinja::Value::none());
  vars.set("add_generation_prompt", jinja::Value(opt.add_generation_prompt));
  return tmpl_.render(vars);
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages, const ChatOptions& opt) const {
  try {
    return render_raw(messages, opt);
  } catch (const ndt::Error& e) {
    NDT_FAIL(source_, ": ", e.what());
  }
}

std::string ChatTemplate::end_of_turn() const {
  const std::string text = render({{"user", "hi"}, {"assistant", kSentinel}}, {});
  const size_t at = text.find(kSentinel);
  NDT_CHECK(at != std::string::npos, source_, ": the template does not write an assistant message's content");
  const std::string after = text.substr(at + std::string(kSentinel).size());
  if (!eos_.empty() && after.rfind(eos_, 0) == 0) return eos_;
  const size_t close = after.rfind("<|", 0) == 0  ? after.find("|>")
                       : after.rfind("<", 0) == 0 ? after.find('>')
                                                  : std::string::npos;
  NDT_CHECK(close != std::string::npos, source_,
            ": the template writes no end-of-turn token right after an assistant message (it writes \"",
            after.substr(0, 20), "\"); its assistant spans and stop token cannot be found");
  return after.substr(0, close + (after[1] == '|' ? 2 : 1));
}

RenderedChat ChatTemplate::render_with_spans(const std::vector<ChatMessage>& messages,
                                             const ChatOptions& opt) const {
  RenderedChat r;
  r.text = render(messages, opt);
  std::string eot;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (messages[i].role != "assistant") continue;
    if (eot.empty()) eot = end_of_turn();
    NDT_CHECK(messages[i].content.find(kSentinel) == std::string::npos, "chat: message ", i,
              " contains the span sentinel text");
    std::vector<ChatMessage> probe = messages;
    probe[i].content = kSentinel;
    const std::string s = render(probe, opt);
    const size_t at = s.find(kSentinel);
    const size_t n = std::string(kSentinel).size();
    NDT_CHECK(at != std::string::npos && s.find(kSentinel, at + 1) == std::string::npos, source_,
              ": assistant message ", i, " is not written exactly once; its trained span cannot be found");
    const std::string prefix = s.substr(0, at), suffix = s.substr(at + n);
    const bool fits = r.text.size() >= prefix.size() + suffix.size() && r.text.compare(0, at, prefix) == 0 &&
                      r.text.compare(r.text.size() - suffix.size(), suffix.size(), suffix) == 0;
    NDT_CHECK(fits, source_, ": the template rewrites assistant message ", i,
              " (for example Qwen3 moves or drops a <think>...</think> part), so its trained span cannot be "
              "located; give that message without such a part");
    NDT_CHECK(suffix.rfind(eot, 0) == 0, source_, ": assistant message ", i,
              " is not followed by the end-of-turn ", eot, "; its trained span cannot be found");
    r.assistant.push_back({i, prefix.size(), r.text.size() - suffix.size() + eot.size()});
  }
  return r;
}

}  // namespace ndt::tok
