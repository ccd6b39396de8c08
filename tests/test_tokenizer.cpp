// The tokenizer on its own (no Python): UTF-8 handling as Python's errors="replace", the
// streaming decoder, a small hand-made tokenizer.json (merges by rank, added tokens, the BOS
// template, ignore_merges), the regex rewriting, threads, and one clear error for every field
// ndtrain does not read. tests/test_tokenizer_reference.cpp checks the ids against tokenizers.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "support/testing.h"
#include "tokenizer/bpe_json.h"
#include "tokenizer/regex.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

using namespace ndt;
using ndt::testing::error_of;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

std::string byte_char(int b) {
  std::string s;
  tok::append_utf8(s, tok::byte_to_char(static_cast<uint8_t>(b)));
  return s;
}

// GPT-2's pipeline in miniature: the 256 bytes (id = byte), merges "Ġ t" (256), "h e" (257),
// "Ġt he" (258), "t h" (259, ranked after "h e": "the" merges as t + he), and the special
// <|endoftext|> (260), which a template puts first.
json tiny() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_char(b)] = b;
  vocab["Ġt"] = 256;
  vocab["he"] = 257;
  vocab["Ġthe"] = 258;
  vocab["th"] = 259;
  json j;
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  j["added_tokens"] = json::array({{{"id", 260},
                                    {"content", "<|endoftext|>"},
                                    {"single_word", false},
                                    {"lstrip", false},
                                    {"rstrip", false},
                                    {"normalized", false},
                                    {"special", true}}});
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = {
      {"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  j["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single", json::array({{{"SpecialToken", {{"id", "<|endoftext|>"}, {"type_id", 0}}}},
                              {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
      {"pair", json::array()},
      {"special_tokens",
       {{"<|endoftext|>", {{"id", "<|endoftext|>"}, {"ids", {260}}, {"tokens", {"<|endoftext|>"}}}}}}};
  j["decoder"] = {
      {"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}};
  j["model"] = tok::bpe_model_json(vocab, json::array({"Ġ t", "h e", json::array({"Ġt", "he"}), "t h"}));
  return j;
}

tok::Tokenizer load(const json& j) { return tok::Tokenizer::from_json(j.dump(), "tiny.json"); }

std::vector<int32_t> bytes_of(const std::string& s) {
  std::vector<int32_t> ids;
  for (unsigned char c : s) ids.push_back(c);
  return ids;
}

}  // namespace

TEST(Tokenizer, InvalidUtf8IsReplacedAsPythonDoes) {
  // bytes.decode("utf-8", errors="replace"): one U+FFFD per maximal invalid subpart
  const std::string R = "\xEF\xBF\xBD";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"a\xFF"
       "b",
       "a" + R + "b"},
      {"\xC0\xAF", R + R},  // C0 never starts a character
      {"\xE2\x82", R},      // a 3-byte character cut short
      {"\xE2\x82"
       "a",
       R + "a"},
      {"\xED\xA0\x80", R + R + R},          // a surrogate
      {"\xF4\x90\x80\x80", R + R + R + R},  // above U+10FFFF
      {"\xF0\x9F\x98", R},                  // an emoji cut short
      {"\x80"
       "abc\xC3",
       R + "abc" + R},
      {"\xE4\xBD\xA0\xE5\xA5\xBD", "\xE4\xBD\xA0\xE5\xA5\xBD"},  // valid
  };
  for (const auto& [in, want] : cases) {
    EXPECT_EQ(tok::utf8_replace_invalid(in), want) << in;
    EXPECT_EQ(tok::utf8_valid(in), in == want) << in;
  }
  EXPECT_EQ(tok::utf8_complete_prefix("ab\xE4\xBD"), 2u);  // held: a character to complete
  EXPECT_EQ(tok::utf8_complete_prefix("ab\xE4\xBD\xA0"), 5u);
  EXPECT_EQ(tok::utf8_complete_prefix("ab\xFF"), 3u);  // invalid: complete (as U+FFFD)
  EXPECT_EQ(tok::utf8_complete_prefix("\xF0\x9F\x98"), 0u);
}

TEST(Tokenizer, NfcComposesAndLeavesAsciiAlone) {
  EXPECT_EQ(tok::normalize(tok::NormalForm::nfc, "e\xCC\x81"), "\xC3\xA9");  // e + U+0301 -> é
  EXPECT_EQ(tok::normalize(tok::NormalForm::nfkc, "\xEF\xAC\x81x"), "fix");  // ﬁx
  EXPECT_TRUE(tok::normalize_is_noop(tok::NormalForm::nfc, "caf\xC3\xA9"));  // é is below U+0300
  EXPECT_FALSE(tok::normalize_is_noop(tok::NormalForm::nfc, "e\xCC\x81"));
}

TEST(Tokenizer, MergesByRankAddedTokensAndTheTemplate) {
  const tok::Tokenizer t = load(tiny());
  EXPECT_EQ(t.vocab_size(), 261);
  EXPECT_EQ(t.encode(" the"), std::vector<int32_t>({258}));
  // "the": "h e" (rank 1) before "t h" (rank 3): t + he, and no merge makes "the"
  EXPECT_EQ(t.encode("the"), std::vector<int32_t>({'t', 257}));
  EXPECT_EQ(t.encode("a<|endoftext|> the"), std::vector<int32_t>({'a', 260, 258}));
  EXPECT_EQ(t.encode("x", true), std::vector<int32_t>({260, 'x'}));
  tok::EncodeOptions plain;
  plain.parse_special = false;  // a special token in the text is text
  EXPECT_EQ(t.encode("<|endoftext|>", plain), bytes_of("<|endoftext|>"));
  EXPECT_EQ(t.bos_id(), 260);
  EXPECT_EQ(t.eos_id(), 260);
  EXPECT_EQ(t.id_of("Ġthe"), 258);
  EXPECT_EQ(t.id_of("<|endoftext|>"), 260);
  EXPECT_FALSE(t.id_of("nope"));
  EXPECT_TRUE(t.is_special(260));
  EXPECT_EQ(t.token_bytes(258), " the");
  const std::vector<int32_t> ids = t.encode("x<|endoftext|> the");
  EXPECT_EQ(t.decode(ids), "x<|endoftext|> the");
  EXPECT_EQ(t.decode(ids, /*skip_special=*/true), "x the");
  EXPECT_NE(error_of([&] { t.decode(std::vector<int32_t>{261}); }).find("id 261 is not in the vocabulary"),
            std::string::npos);

  json j = tiny();  // "the" a token that no merge makes
  j["model"]["vocab"].erase("th");
  j["model"]["vocab"]["the"] = 259;
  j["model"]["merges"].erase(3);
  EXPECT_EQ(load(j).encode("the"), std::vector<int32_t>({'t', 257}));
  j["model"]["ignore_merges"] = true;  // a pre-token that is a token: that token
  EXPECT_EQ(load(j).encode("the"), std::vector<int32_t>({259}));
}

TEST(Tokenizer, DecodingHoldsIncompleteCharactersUntilTheyComplete) {
  const tok::Tokenizer t = load(tiny());
  // "你好" and an emoji, one byte per token: whole characters come out, never half of one
  const std::string text = "a\xE4\xBD\xA0\xE5\xA5\xBD \xF0\x9F\x98\x80!";
  const std::vector<int32_t> ids = t.encode(text);
  ASSERT_EQ(ids, bytes_of(text));
  tok::StreamDecoder d(t);
  std::vector<std::string> pieces;
  std::string all;
  for (int32_t id : ids) {
    pieces.push_back(d.push(id));
    EXPECT_TRUE(tok::utf8_valid(pieces.back()));
    all += pieces.back();
  }
  all += d.flush();
  EXPECT_EQ(all, text);
  EXPECT_EQ(pieces[1], "");  // first byte of 你
  EXPECT_EQ(pieces[3], "\xE4\xBD\xA0");
  // an incomplete character at the end: U+FFFD at flush, as decode gives
  const std::vector<int32_t> cut = {'a', 0xF0, 0x9F};
  tok::StreamDecoder e(t);
  std::string s;
  for (int32_t id : cut) s += e.push(id);
  EXPECT_EQ(s, "a");
  s += e.flush();
  EXPECT_EQ(s, t.decode(cut));
  EXPECT_EQ(s, "a\xEF\xBF\xBD");
}

TEST(Tokenizer, RegexesTakeOnigurumasMeaning) {
  EXPECT_EQ(tok::oniguruma_to_pcre2(R"(\s+(?!\S)|[^\s\p{L}])", "p"),
            R"([\t-\r\x{85}\p{Z}]+(?![^\t-\r\x{85}\p{Z}])|[^\t-\r\x{85}\p{Z}\p{L}])");
  const auto matches = [](const std::string& pattern, const std::string& text) {
    tok::Regex re(pattern, false, "p");
    tok::Regex::Matcher m(re);
    std::vector<std::string> out;
    size_t pos = 0, a, b;
    while (m.next(text, pos, a, b)) out.push_back(text.substr(a, b - a));
    return out;
  };
  // \s is White_Space: NEL and the ideographic space yes, U+180E no
  EXPECT_EQ(matches(R"(\s)",
                    "a\xC2\x85"
                    "b\xE3\x80\x80"
                    "c\xE1\xA0\x8E"),
            std::vector<std::string>({"\xC2\x85", "\xE3\x80\x80"}));
  EXPECT_EQ(matches(R"(\w+)",
                    "a\xCC\x81"
                    "b_\xC2\xB9 x"),
            std::vector<std::string>({"a\xCC\x81"
                                      "b_\xC2\xB9",
                                      "x"}));
  EXPECT_EQ(matches(R"(\h+)", "zab12g"), std::vector<std::string>({"ab12"}));
  EXPECT_EQ(matches(R"((?i:'s))", "'S 'x '\xC5\xBF"), std::vector<std::string>({"'S", "'\xC5\xBF"}));  // ſ
  EXPECT_EQ(matches("x*", "ab"), std::vector<std::string>({"", "", ""}));  // empty matches, as find_iter
  EXPECT_EQ(matches("^a", "a\na"), std::vector<std::string>({"a", "a"}));  // Ruby's line anchors
  for (const char* bad : {R"([\S])", R"(\bx)", "[[:alpha:]]", "[a[b]]"})
    EXPECT_NE(error_of([&] {
                tok::Regex re(bad, false, "pre_tokenizer.pattern.Regex");
              }).find("pre_tokenizer.pattern.Regex: the regex"),
              std::string::npos)
        << bad;
}

// Oniguruma's meaning written for PCRE2 (tests/test_tokenizer_reference.cpp checks each against
// tokenizers), and what has none refused naming the construct and where it is.
TEST(Tokenizer, OnigurumaConstructsAreTranslatedOrRefusedByName) {
  const auto pcre2 = [](const char* p) { return tok::oniguruma_to_pcre2(p, "p"); };
  EXPECT_EQ(pcre2("(?m)a.b"), "(?s:a.b)");  // Oniguruma's m: dot takes newlines
  EXPECT_EQ(pcre2(R"((?m)a.b|\v)"), R"((?s:a.b|\x{B}))");
  EXPECT_EQ(pcre2("(?i-m:a.)(?im)b"), "(?i-s:a.)(?is:b)");
  EXPECT_EQ(pcre2(R"(\v[\v]\\v)"), R"(\x{B}[\x{B}]\\v)");  // the vertical tab; \\v is \ then v
  EXPECT_EQ(pcre2(R"(\V\Q.\E\j[\N\R])"), "VQ.Ej[NR]");
  EXPECT_EQ(pcre2(R"(\h[\h])"), "[0-9a-fA-F][0-9a-fA-F]");
  EXPECT_EQ(pcre2(R"(\O[\O])"), "(?s:.)[O]");
  EXPECT_EQ(pcre2(R"(\u00e9\x41\o{101})"), R"(\x{E9}\x{41}\x{41})");
  EXPECT_EQ(pcre2(R"(\p{Han}\P{^Greek}\p{L}[\p{Han}])"), R"(\p{sc:Han}\P{^sc:Greek}\p{L}[\p{sc:Han}])");
  EXPECT_EQ(pcre2("a(?i)b|c"), "a(?i:b|c)");  // to the end of the group, across |
  EXPECT_EQ(pcre2("(x(?i)y|z)|w"), "(x(?i:y|z))|w");
  EXPECT_EQ(pcre2(R"(\g1\k1\pL)"), "g1k1pL");  // not followed by < ' {: the letters
  EXPECT_EQ(pcre2("(?i:'s|'t|'re|'ve|'m|'ll|'d)"), "(?i:'s|'t|'re|'ve|'m|'ll|'d)");  // Llama 3's
  const auto refusal = [&](const char* p) { return error_of([&] { pcre2(p); }); };
  EXPECT_NE(refusal("(?i)\xC3\x9F").find("p: the regex \"(?i)\xC3\x9F\" uses (?i) on U+00DF at offset 4"),
            std::string::npos);
  EXPECT_NE(refusal("(?i)ss").find("uses (?i) on U+0073 U+0073 at offset 4"), std::string::npos);
  EXPECT_NE(refusal("(?i:x(?:S)s)").find("uses (?i) on U+0053 U+0073 at offset 8"), std::string::npos);
  EXPECT_NE(refusal(R"((?i)[\x{C0}-\x{FF}])").find("(?i) on a class holding U+00C0-U+00FF"),
            std::string::npos);
  EXPECT_NE(refusal(R"((?i)\x{FB01})").find("(?i) on U+FB01"), std::string::npos);
  EXPECT_EQ(pcre2("(?i)s(?-i)s"), "(?i:s(?-i:s))");  // the second s is not caseless
  for (const auto& [p, named] :
       std::vector<std::pair<const char*, const char*>>{{"(?x)a b", "the option (?x) at offset 2"},
                                                        {"(?s)a.b", "the option (?s) at offset 2"},
                                                        {"a(?W)b", "the option (?W) at offset 3"},
                                                        {R"(\y)", "\\y at offset 0"},
                                                        {R"(\C-a)", "\\C at offset 0"},
                                                        {R"(a\x)", "\\x at offset 1"},
                                                        {R"(\u12)", "\\u at offset 0"},
                                                        {R"([a\S])", "\\S at offset 2"},
                                                        {R"(\B)", "\\B at offset 0"}})
    EXPECT_NE(refusal(p).find(named), std::string::npos) << p << ": " << refusal(p);
}

TEST(Tokenizer, ThreadsGiveTheSameIds) {
  const tok::Tokenizer t = load(tiny());
  // 1.6 MB in one piece (no special token): split across the threads; where the parts meet,
  // runs of spaces and newlines make matches that cross them
  std::string text;
  for (int i = 0; i < 120000; ++i)
    text += i % 7 == 0    ? "the  "
            : i % 5 == 0  ? "\n\n"
            : i % 13 == 0 ? std::string(i % 50, ' ')
                          : " the thesis 42 ";
  const std::vector<int32_t> one = t.encode(text);
  tok::EncodeOptions two;
  for (int threads : {2, 3, 7}) {
    two.threads = threads;
    EXPECT_EQ(t.encode(text, two), one) << threads << " threads";
  }
  text += "<|endoftext|>" + text.substr(0, 700000);
  EXPECT_EQ(t.encode(text, two), t.encode(text));
  // one match across every part: a run of spaces, then of digits
  const std::string runs = "a" + std::string(1500000, ' ') + "b " + std::string(900000, '7') + "x";
  EXPECT_EQ(t.encode(runs, two), t.encode(runs));
  const std::vector<std::string_view> docs = {text, "", " the", text.substr(0, 1000)};
  const auto batch = t.encode_batch(docs, two);
  ASSERT_EQ(batch.size(), docs.size());
  for (size_t i = 0; i < docs.size(); ++i) EXPECT_EQ(batch[i], t.encode(docs[i])) << i;
}

TEST(Tokenizer, WhatItDoesNotReadIsOneErrorNamingTheField) {
  const auto error = [](const std::function<void(json&)>& change) {
    json j = tiny();
    change(j);
    return error_of([&] { tok::Tokenizer::from_json(j.dump(), "tiny.json"); });
  };
  const std::vector<std::pair<std::function<void(json&)>, std::string>> cases = {
      {[](json& j) { j["model"]["type"] = "Unigram"; }, "model.type: 'Unigram' is not implemented"},
      {[](json& j) { j["model"]["dropout"] = 0.1; }, "model.dropout"},
      {[](json& j) { j["model"]["byte_fallback"] = true; }, "model.byte_fallback"},
      {[](json& j) { j["model"]["continuing_subword_prefix"] = "##"; }, "model.continuing_subword_prefix"},
      {[](json& j) { j["model"]["merges"].push_back("Ġ zz"); },
       "model.merges[4]: token 'zz' is not in model.vocab"},
      {[](json& j) { j["model"]["merges"].push_back("a b"); },
       "model.merges[4]: the merged token 'ab' is not in model.vocab"},
      {[](json& j) { j["model"]["merges"].push_back("a b c"); },
       "model.merges[4]: 'a b c' is not two tokens"},
      {[](json& j) { j["model"]["vocab"]["x"] = -1; }, "model.vocab.x: expected a token id"},
      {[](json& j) {
         j["normalizer"] = {{"type", "Lowercase"}};
       },
       "normalizer.type: 'Lowercase' is not implemented"},
      {[](json& j) {
         j["normalizer"] = {{"type", "Sequence"}, {"normalizers", {{{"type", "NFC"}}, {{"type", "Strip"}}}}};
       },
       "normalizer.normalizers[1].type: 'Strip'"},
      {[](json& j) {
         j["pre_tokenizer"] = {{"type", "Metaspace"}};
       },
       "pre_tokenizer.type: 'Metaspace' is not implemented"},
      {[](json& j) { j["pre_tokenizer"] = nullptr; }, "pre_tokenizer: missing"},
      {[](json& j) {
         j["pre_tokenizer"] = {{"type", "Digits"}, {"individual_digits", true}};
       },
       "pre_tokenizer: has no ByteLevel"},
      {[](json& j) {
         j["pre_tokenizer"] = {
             {"type", "Sequence"},
             {"pretokenizers", {j["pre_tokenizer"], {{"type", "Digits"}, {"individual_digits", true}}}}};
       },
       "pre_tokenizer.pretokenizers[1]: comes after ByteLevel"},
      {[](json& j) {
         j["pre_tokenizer"] = {{"type", "Sequence"},
                               {"pretokenizers",
                                {{{"type", "Split"},
                                  {"pattern", {{"Regex", "\\bx"}}},
                                  {"behavior", "Isolated"},
                                  {"invert", false}},
                                 j["pre_tokenizer"]}}};
       },
       "pre_tokenizer.pretokenizers[0].pattern.Regex: the regex \"\\bx\" uses \\b"},
      {[](json& j) {
         j["pre_tokenizer"] = {{"type", "Sequence"},
                               {"pretokenizers",
                                {{{"type", "Split"},
                                  {"pattern", {{"Regex", "(x"}}},
                                  {"behavior", "Isolated"},
                                  {"invert", false}},
                                 j["pre_tokenizer"]}}};
       },
       "pre_tokenizer.pretokenizers[0].pattern.Regex: the regex \"(x\" does not compile"},
      {[](json& j) {
         j["pre_tokenizer"] = {{"type", "Sequence"},
                               {"pretokenizers",
                                {{{"type", "Split"},
                                  {"pattern", {{"Regex", "x"}}},
                                  {"behavior", "Sideways"},
                                  {"invert", false}},
                                 j["pre_tokenizer"]}}};
       },
       "pre_tokenizer.pretokenizers[0].behavior: 'Sideways' is not a split behavior"},
      {[](json& j) { j["decoder"] = nullptr; }, "decoder: is null"},
      {[](json& j) {
         j["decoder"] = {{"type", "WordPiece"}};
       },
       "decoder.type: 'WordPiece' is not implemented"},
      {[](json& j) {
         j["post_processor"] = {{"type", "RobertaProcessing"}};
       },
       "post_processor.type: 'RobertaProcessing'"},
      {[](json& j) { j["post_processor"]["special_tokens"] = json::object(); },
       "post_processor.single[0]: names special token '<|endoftext|>'"},
      {[](json& j) {
         j["truncation"] = {{"max_length", 8}};
       },
       "truncation: is set"},
      {[](json& j) { j["version"] = "2.0"; }, "version: \"2.0\" is not 1.0"},
  };
  for (const auto& [change, want] : cases) {
    const std::string e = error(change);
    EXPECT_NE(e.find("tokenizer tiny.json: " + want), std::string::npos)
        << "want: " << want << "\ngot:  " << e;
  }
  EXPECT_NE(error_of([] {
              tok::Tokenizer::from_json("{\"model\": ", "x.json");
            }).find("tokenizer x.json: not valid JSON"),
            std::string::npos);
}

// A tokenizer.json (or tokenizer_config.json) nested 100,000 deep is one error naming it.
TEST(Tokenizer, DeeplyNestedJsonIsOneErrorNamingTheFile) {
  const fs::path d = ndt::testing::fresh_dir("tokenizer_deep");
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  std::ofstream((d / "tokenizer.json").string()) << deep;
  std::string e = error_of([&] { tok::Tokenizer::from_file(d.string()); });
  EXPECT_NE(e.find((d / "tokenizer.json").string() + ": JSON nested deeper than 512 levels"),
            std::string::npos)
      << e.substr(0, 300);
  EXPECT_EQ(e.find('\n'), std::string::npos);
  std::ofstream((d / "tokenizer.json").string()) << tiny().dump();
  std::ofstream((d / "tokenizer_config.json").string()) << "{\"eos_token\": " + deep + "}";
  e = error_of([&] { tok::Tokenizer::from_file(d.string()); });
  EXPECT_NE(e.find((d / "tokenizer_config.json").string() + ": JSON nested deeper"), std::string::npos)
      << e.substr(0, 300);
}

TEST(Tokenizer, FromFileTakesTheFileOrItsFolder) {
  const fs::path d = ndt::testing::fresh_dir("tokenizer_file");
  {
    std::ofstream((d / "tokenizer.json").string()) << tiny().dump();
    std::ofstream((d / "tokenizer_config.json").string()) << R"({"eos_token": {"content": "a"}})";
  }
  const tok::Tokenizer from_dir = tok::Tokenizer::from_file(d.string());
  EXPECT_EQ(from_dir.encode(" the"), std::vector<int32_t>({258}));
  EXPECT_EQ(from_dir.eos_id(), 'a');  // tokenizer_config.json's eos_token
  EXPECT_EQ(from_dir.source(), (d / "tokenizer.json").string());
  EXPECT_EQ(tok::Tokenizer::from_file((d / "tokenizer.json").string()).vocab_size(), 261);
  fs::create_directories(d / "empty");
  EXPECT_NE(
      error_of([&] { tok::Tokenizer::from_file((d / "empty").string()); }).find("holds no tokenizer.json"),
      std::string::npos);
  EXPECT_NE(error_of([&] { tok::Tokenizer::from_file((d / "nope.json").string()); }).find("does not exist"),
            std::string::npos);
}
