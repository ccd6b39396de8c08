// ndtrain tokenizer: the pre-tokenizers' regexes through PCRE2 (JIT-compiled).
//
// Hugging Face's tokenizers run them with Oniguruma (onig's default syntax, ONIG_SYNTAX_ONIGURUMA);
// oniguruma_to_pcre2 (oniguruma.cpp, which lists each case) rewrites what PCRE2 reads otherwise
// (\s \w \h \v \V \O \uHHHH, (?m), (?i) up to its group's end, scripts in \p{...}, letters
// Oniguruma reads as themselves) and refuses what it cannot give Oniguruma's meaning exactly
// (\b, \y, (?x), (?i) where a character folds to several, ...) in one line naming the construct,
// its offset and `what`. ^ and $ match at line ends (\n), as in Oniguruma.
//
//   Regex re(R"( ?\p{L}+|\s+)", /*literal=*/false, "pre_tokenizer.pattern");
//   Regex::Matcher m(re);
//   size_t pos = 0, s, e;
//   while (m.next(text, pos, s, e)) { ... text.substr(s, e - s) ... }
//
// A Regex is shared by threads; each thread matches with its own Matcher.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

struct pcre2_real_code_8;
struct pcre2_real_match_data_8;
struct pcre2_real_match_context_8;
struct pcre2_real_jit_stack_8;

namespace ndt::tok {

class Regex {
 public:
  // `what` names the pattern in errors (the tokenizer.json field).
  Regex(std::string_view pattern, bool literal, const std::string& what);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  const std::string& pattern() const { return pattern_; }
  bool can_match_empty() const { return min_length_ == 0; }

  class Matcher {
   public:
    explicit Matcher(const Regex& re);
    ~Matcher();
    Matcher(const Matcher&) = delete;
    Matcher& operator=(const Matcher&) = delete;
    // The next match in subject at or after pos, as Oniguruma's find_iter gives it: an empty
    // match where the previous match ended is skipped. Sets [start, end), moves pos; false
    // when there is none. subject must be valid UTF-8; reset() before a new subject.
    bool next(std::string_view subject, size_t& pos, size_t& start, size_t& end);
    void reset() { last_end_ = std::string_view::npos; }

   private:
    const Regex& re_;
    pcre2_real_match_data_8* data_;
    pcre2_real_match_context_8* context_;
    pcre2_real_jit_stack_8* stack_;
    size_t last_end_ = std::string_view::npos;
  };

 private:
  std::string pattern_, what_;
  pcre2_real_code_8* code_ = nullptr;
  bool jit_ = false;
  size_t min_length_ = 0;
};

// The pattern with Oniguruma's meaning written for PCRE2 (exposed for the tests); throws ndt::Error
// naming the construct and its offset where it has none.
std::string oniguruma_to_pcre2(std::string_view pattern, const std::string& what);

}  // namespace ndt::tok
