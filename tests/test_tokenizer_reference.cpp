// ndtrain's tokenizer against Hugging Face's tokenizers itself (tests/scripts/
// tokenizer_reference.py, in the venv of scripts/setup.sh --reference): tokenizers trained
// offline on the fortunes text (GPT-2's pipeline; Llama 3's regex, special tokens and BOS;
// unk_token; every added-token flag behind NFKC; every split behavior) and the files
// transformers saves for tiny Qwen2 and Llama models. On a text of English, code, CJK, emoji,
// combining marks, invalid UTF-8, long runs of spaces and digits and every added token, the ids
// (with and without the template, with special tokens parsed or not) and the decoded text equal
// tokenizers'; decode(encode(x)) == x wherever tokenizers round-trips; the whole corpus gives the
// same ids; prepare_text's shards hold exactly the reference's ids. Each split-regex construct
// that Oniguruma and PCRE2 read differently gives tokenizers' pieces and ids, or is refused by
// name. Every test skips, with the reason, where the venv or the fortunes text is missing.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "support/launch.h"
#include "support/testing.h"
#include "tokenizer/regex.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"
#include "train/data/data.h"

using namespace ndt;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

std::string read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The fortunes text (scripts/setup.sh installs it): its files, not the .dat indexes nor the
// .u8 links to them.
std::vector<std::string> corpus_files() {
  std::vector<std::string> out;
  const fs::path dir = "/usr/share/games/fortunes";
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.is_regular_file() && !e.is_symlink() && e.path().extension() != ".dat")
      out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

// tokenizer_reference.py with the venv's python; rc 3 (or no venv): the reason to skip.
ndt::testing::ShellResult reference(const std::string& args) {
  if (!fs::exists(ndt::testing::reference_python()))
    return {3,
            "tokenizers not available: no venv at " + ndt::testing::reference_python() +
                " (scripts/setup.sh --reference)",
            0};
  return ndt::testing::run_shell(ndt::testing::reference_python() + " " + NDT_SOURCE_DIR +
                                 "/tests/scripts/tokenizer_reference.py " + args + " 2>&1");
}

// The trained tokenizers, made once for all the test processes: a folder of the build
// (NDT_TEST_CACHE_DIR), not of the system's temp dir, so that nothing outlives the build;
// named by the script's hash, filled under another name and renamed into place; the folders
// of earlier versions of the script are removed. "" and the reason when they cannot be had.
std::pair<fs::path, std::string> trained() {
  static std::pair<fs::path, std::string> made = [] {
    const std::vector<std::string> files = corpus_files();
    if (files.empty())
      return std::pair<fs::path, std::string>{
          "", "no fortunes text in /usr/share/games/fortunes (scripts/setup.sh installs it)"};
    const std::string script = read(fs::path(NDT_SOURCE_DIR) / "tests/scripts/tokenizer_reference.py");
    const std::string name = "tokenizer_reference_" + std::to_string(std::hash<std::string>{}(script));
    const fs::path dir = fs::path(NDT_TEST_CACHE_DIR) / name;
    if (fs::exists(dir / "done")) return std::pair<fs::path, std::string>{dir, ""};
    fs::create_directories(dir.parent_path());
    const fs::path tmp = dir.string() + ".tmp" + std::to_string(::getpid());
    fs::remove_all(tmp);
    std::string args = "train " + tmp.string();
    for (const std::string& f : files) args += " " + f;
    const ndt::testing::ShellResult r = reference(args);
    if (r.rc != 0) fs::remove_all(tmp);
    if (r.rc == 3) return std::pair<fs::path, std::string>{"", r.out};
    if (r.rc != 0)
      return std::pair<fs::path, std::string>{"", "FAILED: tokenizer_reference.py train: " + r.out};
    std::ofstream((tmp / "done").string()) << "ok\n";
    std::error_code ec;
    fs::rename(tmp, dir, ec);  // another process may have got there first: its copy is as good
    fs::remove_all(tmp, ec);
    for (const auto& e : fs::directory_iterator(dir.parent_path(), ec)) {
      const std::string n = e.path().filename().string();
      if (n.starts_with("tokenizer_reference_") && !n.starts_with(name)) fs::remove_all(e.path(), ec);
    }
    return std::pair<fs::path, std::string>{dir, ""};
  }();
  return made;
}

#define NEED_REFERENCE(dir)                               \
  const auto [dir, why_not] = trained();                  \
  if (why_not.rfind("FAILED", 0) == 0) FAIL() << why_not; \
  if (dir.empty()) GTEST_SKIP() << why_not

// The test text: each kind of text the tokenizers must agree on, then every added token.
std::string test_text(const tok::Tokenizer& t) {
  // clang-format off (version 14 formats these lines differently on each pass)
  std::string s =
      "The quick brown fox jumps over the lazy dog. It's, we'll, they'RE, I'M, you'D've... "
      "\xC5\xBF's 'S 'll\n"  // ſ's
      "int main() {\n    for (int i = 0; i < 10; ++i) printf(\"%d\\n\", i);\n\treturn 0;\n}\n"
      "def f(x):\r\n    return x**2  # comment\r\n\r\n"
      "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E\xE3\x81\xAE\xE3\x83\x86\xE3\x82\xAD\xE3\x82\xB9\xE3\x83"
      "\x88 "  // 日本語のテキスト
      "\xE4\xB8\xAD\xE6\x96\x87\xEF\xBC\x8C\xED\x95\x9C\xEA\xB5\xAD\xEC\x96\xB4\xE3\x80\x82\n"  // 中文，한국어。
      "\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD "
      "\xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x91\xA7 "
      "\xF0\x9F\x87\xAB\xF0\x9F\x87\xB7 \xE2\x9D\xA4\xEF\xB8\x8F\n"  // emoji
      "e\xCC\x81 a\xCC\x88 n\xCC\x83 \xE1\x84\x80\xE1\x85\xA1 A\xCC\x8A \xEF\xAC\x81 \xC2\xBD "
      "\xE2\x91\xA0 "
      "\xCD\x85\n"  // combining marks, ﬁ ½ ①
      "\xFF\xFE \xC0\xAF \xE2\x82 \xED\xA0\x80 \xF4\x90\x80\x80 \x80"
      "abc\xC3 x\xF0\x9F\x98 y\n"                                        // invalid
      "\t\t \xE3\x80\x80\xC2\xA0\xC2\x85 \xE2\x80\xA8 \xE1\xA0\x8E x\n"  // odd spaces
      "1234567890123 \xD9\xA1\xD9\xA2\xD9\xA3 3.14159 1,000,000\n"
      "hello world hello worldly \xEF\xAC\x81x fix New York  New  [SEP]  next <mask> x  <mask>mo "
      "moon\n";
  // clang-format on
  s += std::string(50, ' ') + "\n\n\n" + std::string(300, 'a') + " " + std::string(500, '9') +
       std::string(2000, ' ') + "end\n";
  for (const tok::AddedToken& a : t.added_tokens()) s += " " + a.content + "x" + a.content + a.content + "\n";
  return s;
}

std::vector<int32_t> ints(const json& j) { return j.get<std::vector<int32_t>>(); }
std::string bytes(const json& j) {
  std::string s;
  for (int b : j.get<std::vector<int>>()) s += static_cast<char>(b);
  return s;
}

class TokenizerReference : public ::testing::TestWithParam<std::string> {};

}  // namespace

TEST_P(TokenizerReference, IdsAndTextEqualTokenizers) {
  NEED_REFERENCE(dir);
  const fs::path path = dir / GetParam();
  const tok::Tokenizer t = tok::Tokenizer::from_file(path.string());
  const std::string text = test_text(t);
  const fs::path work = ndt::testing::fresh_dir("tokenizer_ref_" + GetParam());
  std::ofstream((work / "text.txt").string(), std::ios::binary) << text;
  const ndt::testing::ShellResult r = reference(
      "encode " + path.string() + " " + (work / "text.txt").string() + " " + (work / "ref.json").string());
  ASSERT_EQ(r.rc, 0) << r.out;
  const json ref = json::parse(read(work / "ref.json"));

  const std::vector<int32_t> ids = t.encode(text);
  EXPECT_EQ(ids, ints(ref["ids"]));
  EXPECT_EQ(t.encode(text, /*add_special=*/true), ints(ref["ids_special"]));
  tok::EncodeOptions plain;
  plain.parse_special = false;
  EXPECT_EQ(t.encode(text, plain), ints(ref["ids_plain"]));
  EXPECT_EQ(t.decode(ids), bytes(ref["decoded"]));
  EXPECT_EQ(t.decode(ids, /*skip_special=*/true), bytes(ref["decoded_skip"]));
  EXPECT_EQ(t.vocab_size(), ref["vocab_size"].get<int64_t>());
  // the text as tokenizers reads it (invalid UTF-8 replaced) round-trips where tokenizers' does
  const std::string valid = tok::utf8_replace_invalid(text);
  if (ref["roundtrip"].get<bool>()) EXPECT_EQ(t.decode(t.encode(valid)), valid);
  EXPECT_EQ(t.encode(valid), ids);
  // streamed decoding gives the same text
  tok::StreamDecoder d(t);
  std::string streamed;
  for (int32_t id : ids) streamed += d.push(id);
  streamed += d.flush();
  EXPECT_EQ(streamed, t.decode(ids));
  std::cout << GetParam() << ": " << ids.size() << " ids for " << text.size() << " bytes, vocabulary "
            << t.vocab_size() << ", round trip " << ref["roundtrip"] << ", tokenizers " << ref["tokenizers"]
            << "\n";
}

INSTANTIATE_TEST_SUITE_P(Trained, TokenizerReference,
                         ::testing::Values("gpt2", "llama3", "unk", "drop", "added", "splits", "qwen2-tiny",
                                           "llama3-tiny"),
                         [](const auto& info) {
                           std::string n = info.param;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

TEST(TokenizerReferenceCorpus, TheWholeCorpusGivesTheSameIdsOnOneAndTwoThreads) {
  NEED_REFERENCE(dir);
  const fs::path work = ndt::testing::fresh_dir("tokenizer_ref_corpus");
  std::string text;
  for (const std::string& f : corpus_files()) text += read(f);
  std::ofstream((work / "corpus.txt").string(), std::ios::binary) << text;
  for (const char* name : {"gpt2", "llama3", "qwen2-tiny"}) {
    const fs::path path = dir / name;
    const ndt::testing::ShellResult r =
        reference("encode " + path.string() + " " + (work / "corpus.txt").string() + " " +
                  (work / "ref.json").string());
    ASSERT_EQ(r.rc, 0) << r.out;
    const std::vector<int32_t> want = ints(json::parse(read(work / "ref.json"))["ids"]);
    const tok::Tokenizer t = tok::Tokenizer::from_file(path.string());
    EXPECT_EQ(t.encode(text), want) << name;
    tok::EncodeOptions two;
    two.threads = 2;
    EXPECT_EQ(t.encode(text, two), want) << name << ", 2 threads";
    std::cout << name << ": " << want.size() << " ids for " << text.size() << " bytes\n";
  }
}

TEST(TokenizerReferenceCorpus, PrepareTextShardsHoldTheReferenceIds) {
  NEED_REFERENCE(dir);
  const std::vector<std::string> files = corpus_files();
  std::string list;
  for (const std::string& f : files) list += " " + f;
  // llama3-tiny: BOS before each document, ids past 65,535: uint32 shards; gpt2: <|endoftext|>, uint16
  for (const auto& [name, format] :
       {std::pair<std::string, data::ShardFormat>{"llama3-tiny", data::ShardFormat::u32},
        {"gpt2", data::ShardFormat::u16}}) {
    const fs::path work = ndt::testing::fresh_dir("tokenizer_ref_shards_" + name);
    const ndt::testing::ShellResult p =
        ndt::testing::run_shell(std::string(NDT_PREPARE_TEXT_BIN) + " --out " + (work / "data").string() +
                                " --tokenizer " + (dir / name).string() + " --threads 2" + list + " 2>&1");
    ASSERT_EQ(p.rc, 0) << p.out;
    const tok::Tokenizer t = tok::Tokenizer::from_file((dir / name).string());
    EXPECT_NE(p.out.find("vocabulary of " + std::to_string(t.vocab_size())), std::string::npos) << p.out;
    const ndt::testing::ShellResult r =
        reference("documents " + (dir / name).string() + " " + (work / "ref.json").string() + list);
    ASSERT_EQ(r.rc, 0) << r.out;
    const std::vector<int32_t> want = ints(json::parse(read(work / "ref.json"))["ids"]);
    std::vector<int32_t> got;
    for (const char* shard : {"train_000000.bin", "val_000000.bin"}) {
      data::Shard s((work / "data" / shard).string());
      EXPECT_EQ(s.format(), format) << name;
      std::vector<uint32_t> buf(s.size());
      s.read(0, s.size(), buf.data());
      got.insert(got.end(), buf.begin(), buf.end());
    }
    EXPECT_EQ(got, want) << name;
    EXPECT_EQ(read(work / "data" / "tokenizer.json"), read(dir / name / "tokenizer.json"));
    std::cout << name << ": " << p.out;
  }
}

// Split regexes whose meaning differs between Oniguruma and PCRE2: each translated one gives
// tokenizers' pieces and ids (a tokenizer trained on the text, so its pieces are whole tokens;
// the ids alone may agree where the pieces do not, as no merge crosses tokenizers' pieces);
// each refused one, which tokenizers loads, is refused naming the construct, offset and file.
namespace {

struct RegexCase {
  const char* name;
  const char* pattern;
  const char* text;
  const char* refusal;  // nullptr: translated, must give tokenizers' ids
};

const std::vector<RegexCase>& regex_cases() {
  static const std::vector<RegexCase> cases = {
      // Oniguruma's (?m) is PCRE2's (?s): the dot takes newlines
      {"dotall_m", R"((?m)\[.*?\]|\s+|[^\[\s]+)", "[one\ntwo] x [a\nb] y [c]\n", nullptr},
      // \v is the vertical tab alone (PCRE2: \n \r U+2028 too), also inside [...]
      {"vtab_v", R"(\v+|[^\v]+)",
       "ab\x0B"
       "cd\nef\r\ngh\xE2\x80\xA8ij\x0B\x0Bk",
       nullptr},
      // \V is the letter V (PCRE2: anything but vertical space)
      {"letter_V", R"(\V+|[a-z]+|\s+)", "aVb VV abc\nVx", nullptr},
      // \h is a hex digit (PCRE2: horizontal space), \H the rest
      {"hex_h", R"(\h+|\H+)", "cafe babe 0x1F zz\tG9", nullptr},
      // \Q and \E are the letters (PCRE2: quoting)
      {"letters_QE", R"(\Q.\E|\s+|\S)", "Q.E QxE . Q E", nullptr},
      // \O is any character, newline too
      {"anychar_O", R"(a\Ob|\s+|\S)", "a\nb axb a b", nullptr},
      // \uHHHH is the code point (PCRE2 has no \u)
      {"hex4_u", R"(\u00e9+|\s+|[^\u00e9\s]+)", "caf\xC3\xA9\xC3\xA9 \xC3\xA9t\xC3\xA9", nullptr},
      // a script is Script, not Script_Extensions (U+3001, U+30FC are Common)
      {"script_Han", R"(\p{Han}+|\P{Han}+)",
       "\xE4\xB8\xAD\xE6\x96\x87\xE3\x80\x81\xE6\x97\xA5\xE3\x83\xBC\xE8\xAA\x9E"
       "a",
       nullptr},
      // (?i) without a colon runs to the group's end, across | : a(?i)b|c is a(?i:b|c)
      {"inline_i_alternation", R"((?:a(?i)b|c)|\s+|\S)", "ab aB ac aC c C", nullptr},
      // (?i) with a character whose full folding is several: Oniguruma matches ß to ss
      {"fold_sharp_s", "(?i)\xC3\x9F|\\s+|\\S",
       "\xC3\x9F SS ss stra\xC3\x9F"
       "e",
       "(?i) on U+00DF at offset 4"},
      // (?i) with two letters that start such a folding: Oniguruma matches ss to ß
      {"fold_ss", R"((?i)ss|\s+|\S)", "\xC3\x9F SS ss \xE1\xBA\x9E", "(?i) on U+0073 U+0073 at offset 4"},
      // ... and a class holding such a character (ﬁ)
      {"fold_class", R"((?i)[a-z\x{FB01}]+|\s+)", "fi \xEF\xAC\x81 FI", "(?i) on a class holding U+FB01"},
      // the extended syntax is not translated
      {"extended_x", R"((?x) a b | \s+ | \S)", "ab a b", "the option (?x) at offset 2"},
      // a text segment boundary
      {"segment_y", R"(\y\X|\s)", "ab c", "\\y at offset 0"},
  };
  return cases;
}

// tokenizers' answers for every case, made once: the folder, or "" and the reason.
std::pair<fs::path, std::string> regex_references() {
  static std::pair<fs::path, std::string> made = [] {
    const fs::path dir = ndt::testing::fresh_dir("tokenizer_ref_regexes");
    json cases = json::array();
    for (const RegexCase& c : regex_cases())
      cases.push_back({{"name", c.name}, {"pattern", c.pattern}, {"text", c.text}});
    std::ofstream((dir / "cases.json").string()) << cases.dump();
    const ndt::testing::ShellResult r =
        reference("regexes " + (dir / "cases.json").string() + " " + (dir / "out").string());
    if (r.rc == 3) return std::pair<fs::path, std::string>{"", r.out};
    if (r.rc != 0)
      return std::pair<fs::path, std::string>{"", "FAILED: tokenizer_reference.py regexes: " + r.out};
    return std::pair<fs::path, std::string>{dir / "out", ""};
  }();
  return made;
}

// The Split's pieces (isolated: matches and the text between them, empty ones dropped) as
// ndtrain's regex cuts them.
std::vector<std::string> split_pieces(const std::string& pattern, const std::string& text) {
  const tok::Regex re(pattern, /*literal=*/false, "pattern");
  tok::Regex::Matcher m(re);
  std::vector<std::string> out;
  size_t pos = 0, a = 0, b = 0, prev = 0;
  while (m.next(text, pos, a, b)) {
    if (a > prev) out.push_back(text.substr(prev, a - prev));
    if (b > a) out.push_back(text.substr(a, b - a));
    prev = b;
  }
  if (prev < text.size()) out.push_back(text.substr(prev));
  return out;
}

class TokenizerRegexReference : public ::testing::TestWithParam<RegexCase> {};

}  // namespace

TEST_P(TokenizerRegexReference, TranslatedGivesTokenizersIdsRefusedNamesTheConstruct) {
  const auto [dir, why_not] = regex_references();
  if (why_not.rfind("FAILED", 0) == 0) FAIL() << why_not;
  if (dir.empty()) GTEST_SKIP() << why_not;
  const RegexCase& c = GetParam();
  const json ref = json::parse(read(dir / c.name / "ref.json"));
  ASSERT_FALSE(ref.contains("error")) << c.pattern << ": tokenizers refuses it: " << ref["error"];
  const std::string file = (dir / c.name / "tokenizer.json").string();
  if (c.refusal) {
    const std::string err = ndt::testing::error_of([&] { tok::Tokenizer::from_file(file); });
    EXPECT_NE(err.find(c.refusal), std::string::npos) << err;
    EXPECT_NE(err.find("tokenizer " + file + ": "), std::string::npos) << err;
    EXPECT_EQ(err.find('\n'), std::string::npos) << err;
    std::cout << c.name << ": tokenizers' pieces " << ref["pieces"].dump() << "; ndtrain: " << err << "\n";
    return;
  }
  std::vector<std::string> want;
  for (const json& piece : ref["pieces"]) want.push_back(bytes(piece));
  EXPECT_EQ(split_pieces(c.pattern, c.text), want) << c.pattern;
  const tok::Tokenizer t = tok::Tokenizer::from_file(file);
  EXPECT_EQ(t.encode(c.text), ints(ref["ids"])) << c.pattern;
  std::cout << c.name << ": " << ref["ids"].size() << " ids, " << ref["pieces"].size() << " pieces\n";
}

INSTANTIATE_TEST_SUITE_P(Constructs, TokenizerRegexReference, ::testing::ValuesIn(regex_cases()),
                         [](const auto& info) { return std::string(info.param.name); });
