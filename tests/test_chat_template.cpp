// Chat templates (tokenizer/chat_template.h, tokenizer/jinja.h) against transformers itself
// (tests/scripts/chat_template_reference.py, in the venv of scripts/setup.sh --reference):
// the templates of Llama 3 and 3.1, Qwen2.5, Qwen3, SmolLM2 and Mistral v0.3
// (tests/data/chat_templates/) on multi-turn conversations with and without a system prompt,
// unicode and whitespace edges, add_generation_prompt both ways and Qwen3's enable_thinking
// render the same text as transformers' render_jinja_template, and that text tokenizes to the
// ids transformers gives (add_special_tokens=False) on a tokenizer trained by the script with
// the templates' control tokens; small templates pin the Jinja semantics (whitespace control,
// scoping, filters, tests, slicing) the same way. Every assistant span is exactly the message's
// content as written plus the end-of-turn token. Each unsupported construct and each template
// error is one error naming it (and its line). The reference tests skip, with the reason,
// where the venv is missing.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "support/launch.h"
#include "support/testing.h"
#include "tensor/error.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

using namespace ndt;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

const fs::path kData = fs::path(NDT_SOURCE_DIR) / "tests/data/chat_templates";
const std::vector<std::string> kModels = {"llama3", "llama3.1", "qwen2.5",
                                          "qwen3",  "smollm2",  "mistral-v0.3"};

using Chat = std::vector<tok::ChatMessage>;
const std::vector<Chat>& conversations() {
  static const std::vector<Chat> c = {
      {{"system", "You are a terse assistant."},
       {"user", "What is 2+2?"},
       {"assistant", "4."},
       {"user", "And 3+3?"},
       {"assistant", "6."}},
      {{"user", "Hello!"}, {"assistant", "Hi, how can I help?"}, {"user", "Tell me a joke."}},
      {{"user", "Grüße aus Köln 🌍 — 你好，世界"}, {"assistant", "Привет! ¿Qué tal? 👋🏽"}},
      {{"system", "  padded system\n\n"},
       {"user", "  leading and trailing  \n"},
       {"assistant", "line1\n\nline2\t"},
       {"user", "\ttabs\tand\r\nCRLF"}},
      {{"user", "quotes ' \" and braces {{ }} {% %} and backslash \\n"}, {"assistant", "ok"}},
  };
  return c;
}

// ordered: the templates see each message's keys in the order given (role, then content)
nlohmann::ordered_json to_json(const Chat& chat) {
  nlohmann::ordered_json m = nlohmann::ordered_json::array();
  for (const auto& x : chat) m.push_back({{"role", x.role}, {"content", x.content}});
  return m;
}

struct Case {
  std::string folder, template_text;
  Chat chat;
  bool gen = false;
  json extra = json::object();
};

tok::ChatOptions options(const Case& c) {
  tok::ChatOptions o;
  o.add_generation_prompt = c.gen;
  for (auto it = c.extra.begin(); it != c.extra.end(); ++it) {
    if (it->is_boolean()) o.extra.set(it.key(), jinja::Value(it->get<bool>()));
    if (it->is_string()) o.extra.set(it.key(), jinja::Value(it->get<std::string>()));
  }
  return o;
}

// The reference's results for the cases, and its tokenizer's folder; "" and the reason
// when the venv is missing.
std::pair<json, std::string> reference(const std::vector<Case>& cases, const std::string& name,
                                       fs::path& out) {
  if (!fs::exists(ndt::testing::reference_python()))
    return {json(), "transformers not available: no venv at " + ndt::testing::reference_python() +
                        " (scripts/setup.sh --reference)"};
  out = ndt::testing::fresh_dir("chat_" + name);
  nlohmann::ordered_json j = nlohmann::ordered_json::array();
  for (const Case& c : cases) {
    nlohmann::ordered_json x = {
        {"messages", to_json(c.chat)}, {"add_generation_prompt", c.gen}, {"extra", c.extra}};
    if (c.folder.empty())
      x["template"] = c.template_text;
    else
      x["folder"] = (kData / c.folder).string();
    j.push_back(x);
  }
  std::ofstream(out / "cases.json") << j.dump();
  auto r = ndt::testing::run_shell(ndt::testing::reference_python() + " " + NDT_SOURCE_DIR +
                                   "/tests/scripts/chat_template_reference.py " +
                                   (out / "cases.json").string() + " " + out.string() + " 2>&1");
  if (r.rc == 3) return {json(), r.out};
  EXPECT_EQ(r.rc, 0) << r.out;
  std::ifstream in(out / "ref.json");
  json ref = json::parse(in);
  EXPECT_EQ(ref.size(), cases.size());
  return {ref, ""};
}

std::vector<Case> model_cases() {
  std::vector<Case> cases;
  for (const std::string& m : kModels)
    for (const Chat& chat : conversations())
      for (bool gen : {false, true}) {
        cases.push_back({m, "", chat, gen});
        if (m == "qwen3")
          for (bool think : {false, true}) cases.push_back({m, "", chat, gen, {{"enable_thinking", think}}});
      }
  // Qwen3 moves a <think> part of the last turn into its own block and drops it from earlier ones
  const Chat thinking = {{"user", "Why?"},
                         {"assistant", "<think>\nbecause\n</think>\n\nBecause."},
                         {"user", "Sure?"},
                         {"assistant", "<think>checking</think>Yes."}};
  cases.push_back({"qwen3", "", thinking, false});
  cases.push_back({"qwen3", "", thinking, true, {{"enable_thinking", false}}});
  return cases;
}

TEST(ChatTemplateReference, SixModelsRenderAndTokenizeAsTransformers) {
  const std::vector<Case> cases = model_cases();
  fs::path out;
  auto [ref, why] = reference(cases, "models", out);
  if (!why.empty()) GTEST_SKIP() << why;
  const tok::Tokenizer tk = tok::Tokenizer::from_file((out / "tokenizer.json").string());
  size_t checked = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    SCOPED_TRACE(c.folder + " case " + std::to_string(i) + " gen=" + std::to_string(c.gen) + " " +
                 c.extra.dump());
    ASSERT_TRUE(ref[i].contains("text")) << ref[i].dump();
    const tok::ChatTemplate t = tok::ChatTemplate::from_folder((kData / c.folder).string());
    const std::string text = t.render(c.chat, options(c));
    ASSERT_EQ(text, ref[i]["text"].get<std::string>());
    EXPECT_EQ(tk.encode(text, false), ref[i]["ids"].get<std::vector<int32_t>>());
    ++checked;
  }
  EXPECT_EQ(checked, cases.size());
  std::printf("[ chat ] %zu renderings of 6 templates equal transformers' text and ids\n", checked);
}

// The text each assistant span covers: the content as the template writes it, then the end of turn.
TEST(ChatTemplate, AssistantSpansAreContentPlusEndOfTurn) {
  const std::map<std::string, std::string> eot = {{"llama3", "<|eot_id|>"},  {"llama3.1", "<|eot_id|>"},
                                                  {"qwen2.5", "<|im_end|>"}, {"qwen3", "<|im_end|>"},
                                                  {"smollm2", "<|im_end|>"}, {"mistral-v0.3", "</s>"}};
  const std::set<std::string> trims = {"llama3", "llama3.1", "mistral-v0.3"};  // `content | trim`
  for (const std::string& m : kModels) {
    const tok::ChatTemplate t = tok::ChatTemplate::from_folder((kData / m).string());
    EXPECT_EQ(t.end_of_turn(), eot.at(m)) << m;
    for (const Chat& chat : conversations()) {
      const tok::RenderedChat r = t.render_with_spans(chat);
      EXPECT_EQ(r.text, t.render(chat));
      size_t k = 0;
      for (size_t i = 0; i < chat.size(); ++i) {
        if (chat[i].role != "assistant") continue;
        ASSERT_LT(k, r.assistant.size()) << m;
        const tok::AssistantSpan& s = r.assistant[k++];
        EXPECT_EQ(s.message, i);
        std::string content = chat[i].content;
        if (trims.count(m)) {
          while (!content.empty() && std::isspace(uint8_t(content.back()))) content.pop_back();
          while (!content.empty() && std::isspace(uint8_t(content.front()))) content.erase(0, 1);
        }
        EXPECT_EQ(r.text.substr(s.begin, s.end - s.begin), content + eot.at(m)) << m << " message " << i;
      }
      EXPECT_EQ(k, r.assistant.size()) << m;
    }
  }
}

TEST(ChatTemplate, RewrittenAssistantContentIsRefusedForSpans) {
  const tok::ChatTemplate t = tok::ChatTemplate::from_folder((kData / "qwen3").string());
  const Chat thinking = {{"user", "Why?"}, {"assistant", "<think>\nbecause\n</think>\n\nBecause."}};
  EXPECT_NO_THROW(t.render(thinking));
  try {
    t.render_with_spans(thinking);
    FAIL() << "a rewritten assistant message was given a span";
  } catch (const ndt::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("rewrites assistant message 1"), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
  // without a <think> part the same conversation has its span
  const tok::RenderedChat r = t.render_with_spans({{"user", "Why?"}, {"assistant", "Because."}});
  ASSERT_EQ(r.assistant.size(), 1u);
  EXPECT_EQ(r.text.substr(r.assistant[0].begin, r.assistant[0].end - r.assistant[0].begin),
            "Because.<|im_end|>");
}

// Small templates that pin the Jinja semantics the real ones lean on, each against jinja2.
const std::vector<std::string>& snippets() {
  static const std::vector<std::string> s = {
      "a\n  {% if true %}\n    x\n  {% endif %}\nb {{ 1 }}\n{# c #}\nd",
      "{%- for m in messages -%}\n  [{{ loop.index }}/{{ loop.length }} {{ loop.index0 }} {{ loop.revindex "
      "}} "
      "{{ loop.first }} {{ loop.last }}]\n{%- endfor %}",
      "{% for x in [] %}x{% else %}empty{% endfor %}|{% for x in [1,2,3,4] if x is even %}{{ x }}{% endfor "
      "%}",
      "{% for i in range(5) %}{% if i == 1 %}{% continue %}{% endif %}{% if i == 3 %}{% break %}{% endif %}"
      "{{ i }}{% endfor %}",
      "{% set ns = namespace(n=0, s='') %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% set x = 1 %}"
      "{% endfor %}{{ ns.n }}|{{ x is defined }}",
      "{% set t %}in {{ 'block' | upper }}{% endset %}[{{ t }}]",
      "{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 1.5 + 1 }} {{ 3.0 }} {{ 1e20 }} "
      "{{ 0.0001 }} {{ 'a' ~ 1 ~ none }} {{ 'ab' * 3 }} {{ 10 - 2 * 3 }}",
      "{{ [1, 'a', none, true, 1.5] }} {{ {'k': 'v', 'n': [1]} }} {{ none }} {{ true }} {{ undefinedvar }}",
      "{{ 'héllo wörld'[1:4] }}|{{ 'abc'[::-1] }}|{{ [1,2,3,4][1:] }}|{{ [1,2,3][-1] }}|{{ 'xyz'[0] }}",
      "{{ '  a b  ' | trim }}|{{ 'xxaxx'.strip('x') }}|{{ ' a '.lstrip() }}|{{ ' a '.rstrip() }}|"
      "{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'abc'.startswith('ab') }}|{{ "
      "'abc'.endswith(('x','c')) }}",
      "{{ 'Hello World'.lower() }} {{ 'hello world' | title }} {{ 'hELLO' | capitalize }} {{ "
      "'a-b'.replace('-', '+') }}"
      " {{ 'banana'.find('an') }} {{ 'banana'.count('a') }} {{ 'x' | length }} {{ 'öé' | length }}",
      "{{ messages | selectattr('role', 'equalto', 'user') | list | length }}|"
      "{{ messages | rejectattr('role', 'equalto', 'user') | map(attribute='role') | join(',') }}|"
      "{{ messages | first | tojson }}|{{ (messages | last).content }}",
      "{{ {'a': 1, 'b': [true, none, 'é\"\\n']} | tojson }}|{{ {'a': {'b': [1, 2]}, 'c': []} | "
      "tojson(indent=2) }}",
      "{% set d = {'x': 1, 'y': 2} %}{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{{ d.get('z', "
      "'no') }}"
      "{{ d.keys() | list }}{{ d.values() | list }}{{ d | items | list }}{{ d.x }}{{ d['y'] }}",
      "{{ x | default('dflt') }} {{ '' | default('e', true) }} {{ '42' | int + 1 }} {{ '2.5' | float }} "
      "{{ 3 is odd }} {{ 4 is divisibleby 2 }} {{ none is none }} {{ 'a' is string }} {{ {} is mapping }} "
      "{{ [] is iterable }} {{ 1 is number }} {{ true is boolean }} {{ x is undefined }} {{ false is false "
      "}}",
      "{{ 'yes' if 1 in [1, 2] else 'no' }} {{ 'b' in 'abc' }} {{ 'k' in {'k': 1} }} {{ 3 not in [1] }} "
      "{{ not 1 == 2 and (2 > 1 or false) }} {{ 1 < 2 <= 2 }} {{ 'a' < 'b' }} {{ (1, 2) }}",
      "{{- '  x  ' -}}   \n  {{- 'y' }}  {%- if true -%}  z  {%- endif -%}  \n w {#- c -#} v",
      "  {%+ if true %}kept{% endif %}\n{%- generation %}gen {{ 1 }}{% endgeneration %}",
      "{{ dict(a=1, b='x') | tojson }} {{ messages[0]['content'] | string }} {{ messages[5] is defined }}",
      "ends with a newline\n",
      "crlf\r\nlines\r{{ 'x\r\ny' }}\r\n{% if true %}\r\nin\r\n{% endif %}\r\n",
      "  {# comment #}\n  {% set a = 1 %}\n{{ a }}\n\n",
      "{{ '\\u00e9\\x41\\t' }}|{{ \"it's\" }}|{{ 'a' 'b' }}|{{ loop is defined }}",
      "{% for m in messages %}{{ loop.previtem.role if loop.previtem is defined else '-' }} {% endfor %}",
  };
  return s;
}

TEST(ChatTemplateReference, JinjaSemanticsAsJinja2) {
  std::vector<Case> cases;
  for (const std::string& s : snippets()) cases.push_back({"", s, conversations()[0], false});
  fs::path out;
  auto [ref, why] = reference(cases, "snippets", out);
  if (!why.empty()) GTEST_SKIP() << why;
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].template_text);
    ASSERT_TRUE(ref[i].contains("text")) << ref[i].dump();
    const tok::ChatTemplate t = tok::ChatTemplate::from_string(cases[i].template_text, "", "");
    EXPECT_EQ(t.render(cases[i].chat), ref[i]["text"].get<std::string>());
  }
}

// raise_exception: the template's own message, one line, the same one transformers raises.
TEST(ChatTemplateReference, TemplateErrorsSurfaceTheirMessage) {
  const std::vector<Case> cases = {
      {"mistral-v0.3", "", {{"user", "a"}, {"user", "b"}}, false},
      {"mistral-v0.3", "", {{"user", "a"}, {"system", "b"}}, false},
      {"", "line\n{{ raise_exception('bad\\nrole: ' ~ messages[0].role) }}", {{"user", "a"}}, false},
  };
  fs::path out;
  auto [ref, why] = reference(cases, "errors", out);
  if (!why.empty()) GTEST_SKIP() << why;
  for (size_t i = 0; i < cases.size(); ++i) {
    ASSERT_TRUE(ref[i].contains("error")) << ref[i].dump();
    std::string expected = ref[i]["error"].get<std::string>();
    for (char& ch : expected)
      if (ch == '\n') ch = ' ';
    const tok::ChatTemplate t = cases[i].folder.empty()
                                    ? tok::ChatTemplate::from_string(cases[i].template_text, "", "")
                                    : tok::ChatTemplate::from_folder((kData / cases[i].folder).string());
    try {
      t.render(cases[i].chat);
      FAIL() << "case " << i << " rendered";
    } catch (const ndt::Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("chat template raised an error: " + expected), std::string::npos) << msg;
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    }
  }
}

// Each construct outside the subset: one error naming it and its line, at parse or render time.
TEST(ChatTemplate, UnsupportedConstructsAreOneErrorNamingThem) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"a\n{% macro m() %}x{% endmacro %}", "line 2: {% macro %} is not supported"},
      {"{% include 'x.jinja' %}", "line 1: {% include %} is not supported"},
      {"\n\n{% filter upper %}x{% endfilter %}", "line 3: {% filter %} is not supported"},
      {"{% call m() %}{% endcall %}", "line 1: {% call %} is not supported"},
      {"{% extends 'base' %}", "line 1: {% extends %} is not supported"},
      {"{% raw %}{{ x }}{% endraw %}", "line 1: {% raw %} is not supported"},
      {"x\n{{ 'a' | wordwrap(3) }}", "line 2: the filter 'wordwrap' is not supported"},
      {"{{ 1 is prime }}", "line 1: the test 'prime' is not supported"},
      {"{{ 'a'.zfill(3) }}", "line 1: the method str.zfill() is not supported"},
      {"{{ messages.append(1) }}", "line 1: the method list.append() is not supported"},
      {"{% for x in y recursive %}{% endfor %}", "line 1: recursive for loops are not supported"},
      {"{% set a, b = 1, 2 %}", "line 1: {% set a, b = ... %} (tuple assignment) is not supported"},
      {"{% if x %}", "line 1: {% if %} is not closed with {% endif %}"},
      {"{% endif %}", "line 1: {% endif %} is not supported in chat templates here (no open block)"},
      {"\n{{ foo.bar }}", "line 2: 'foo' is undefined"},
      {"{{ 'a' + 1 }}", "line 1: unsupported operand types for +: 'str' and 'int'"},
      {"{{ x + 'a' }}", "line 1: an undefined value used with '+'"},
      {"{{ 'Ä' | upper }}", "line 1: upper of non-ASCII text is not supported"},
      {"{{ 'abc }}", "line 1: string literal not closed"},
      {"{{ 1 + }}", "line 1: expected an expression"},
  };
  for (const auto& [text, want] : cases) {
    try {
      const tok::ChatTemplate t = tok::ChatTemplate::from_string(text, "", "");
      t.render({{"user", "hi"}});
      ADD_FAILURE() << "rendered: " << text;
    } catch (const ndt::Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("chat template line"), std::string::npos) << msg;
      EXPECT_NE(msg.find(want), std::string::npos) << "template: " << text << "\nerror: " << msg;
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    }
  }
}

TEST(ChatTemplate, LoadingFromAFolder) {
  const fs::path d = ndt::testing::fresh_dir("chat_load");
  // no template: one error that says so
  std::ofstream(d / "tokenizer_config.json") << R"({"eos_token": "</s>"})";
  EXPECT_FALSE(tok::ChatTemplate::folder_has_template(d.string()));
  try {
    tok::ChatTemplate::from_folder(d.string());
    FAIL();
  } catch (const ndt::Error& e) {
    EXPECT_NE(std::string(e.what()).find("has no chat template"), std::string::npos) << e.what();
  }
  // a list of named templates: "default" is used; AddedToken objects for bos/eos
  std::ofstream(d / "tokenizer_config.json")
      << R"({"bos_token": {"content": "<s>"}, "eos_token": "</s>", "chat_template": [)"
      << R"({"name": "tool_use", "template": "T"}, {"name": "default", "template": "{{ bos_token }}D{{ eos_token }}"}]})";
  EXPECT_EQ(tok::ChatTemplate::from_folder(d.string()).render({}), "<s>D</s>");
  // chat_template.jinja wins over the config's
  std::ofstream(d / "chat_template.jinja") << "J{{ messages | length }}";
  EXPECT_EQ(tok::ChatTemplate::from_folder(d.string()).render({{"user", "x"}}), "J1");
  // a list without "default"
  fs::remove(d / "chat_template.jinja");
  std::ofstream(d / "tokenizer_config.json") << R"({"chat_template": [{"name": "rag", "template": "R"}]})";
  EXPECT_THROW(tok::ChatTemplate::from_folder(d.string()), ndt::Error);
  // null bos: undefined to the template, as transformers leaves it out of special_tokens_map
  std::ofstream(d / "tokenizer_config.json")
      << R"({"bos_token": null, "chat_template": "{{ bos_token is defined }}"})";
  EXPECT_EQ(tok::ChatTemplate::from_folder(d.string()).render({}), "False");
}

}  // namespace
