// ndtrain tokenizer: a pre-tokenizer's regex, written for Oniguruma (the engine of Hugging Face's
// tokenizers, through onig's Regex::new: the default syntax, ONIG_SYNTAX_ONIGURUMA), rewritten
// for PCRE2 with the same meaning, or refused naming the construct and its offset.
//   \s \w \h (\S \W \H)  Oniguruma's classes written out (White_Space; letters, marks, numbers,
//                        connectors; hex digits); a negated one inside [...] is refused
//   \v                   the vertical tab alone (PCRE2: any vertical space), inside [...] too
//   \O                   any character, newline too; inside [...] the letter O
//   \uHHHH               the code point (PCRE2 has no \u)
//   \E \F \I \J \L \Q \T \U \V \i \j \l \m \q   the letter itself, as Oniguruma reads them
//                        (PCRE2 quotes, negates or refuses them); so are \g \k not followed by
//                        < or ', \o not followed by {, \p \P not followed by {, and inside [...]
//                        every letter Oniguruma gives no meaning there (\A \G \K \N \R \X \Z ...)
//   [\b]                 the backspace, as in both
//   \p{Script}           the Script property (PCRE2's \p{Han} reads Script_Extensions)
//   (?m) (?-m)           Oniguruma's m is dot-matches-newline: PCRE2's s
//   (?i) in a group      runs to the group's end across | (a(?i)b|c is a(?i:b|c)): written so
// Refused: \b \B (word boundaries), \y \Y (text segments), \C-x \M-x, a bare \x, \u without four
// hex digits, the options x W D S P y I L C a and PCRE2's own (s n U J ^), POSIX classes, nested
// classes, &&, and under (?i) a character whose full case folding is several characters (ß, ﬁ,
// ...), a class holding one, or two literal characters that start such a folding (ss, fi, ...):
// Oniguruma matches those across lengths (ß to "ss"), PCRE2 folds one character to one.
//
//   oniguruma_to_pcre2(R"((?m)a.b|\v)", "field")   // "(?s:a.b|\x{B})"
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <vector>

#include "tensor/error.h"
#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"

namespace ndt::tok {

namespace {

// Oniguruma's classes as members of a PCRE2 class (to use inside [...] or wrapped in one)
constexpr const char* kSpace = R"(\t-\r\x{85}\p{Z})";  // White_Space
constexpr const char* kWord = R"(\p{L}\p{M}\p{N}\p{Pc})";
constexpr const char* kHex = "0-9a-fA-F";

// Unicode's CaseFolding.txt (14.0), status F: the characters that fold to several characters,
// and the first two characters of each of those foldings.
constexpr uint32_t kMultiFoldRanges[][2] = {
    {0xDF, 0xDF},     {0x130, 0x130},   {0x149, 0x149},   {0x1F0, 0x1F0},   {0x390, 0x390},
    {0x3B0, 0x3B0},   {0x587, 0x587},   {0x1E96, 0x1E9A}, {0x1E9E, 0x1E9E}, {0x1F50, 0x1F50},
    {0x1F52, 0x1F52}, {0x1F54, 0x1F54}, {0x1F56, 0x1F56}, {0x1F80, 0x1FAF}, {0x1FB2, 0x1FB4},
    {0x1FB6, 0x1FB7}, {0x1FBC, 0x1FBC}, {0x1FC2, 0x1FC4}, {0x1FC6, 0x1FC7}, {0x1FCC, 0x1FCC},
    {0x1FD2, 0x1FD3}, {0x1FD6, 0x1FD7}, {0x1FE2, 0x1FE4}, {0x1FE6, 0x1FE7}, {0x1FF2, 0x1FF4},
    {0x1FF6, 0x1FF7}, {0x1FFC, 0x1FFC}, {0xFB00, 0xFB06}, {0xFB13, 0xFB17}};
constexpr uint32_t kMultiFoldStarts[][2] = {
    {0x61, 0x2BE},   {0x66, 0x66},    {0x66, 0x69},    {0x66, 0x6C},    {0x68, 0x331},   {0x69, 0x307},
    {0x6A, 0x30C},   {0x73, 0x73},    {0x73, 0x74},    {0x74, 0x308},   {0x77, 0x30A},   {0x79, 0x30A},
    {0x2BC, 0x6E},   {0x3AC, 0x3B9},  {0x3AE, 0x3B9},  {0x3B1, 0x342},  {0x3B1, 0x3B9},  {0x3B7, 0x342},
    {0x3B7, 0x3B9},  {0x3B9, 0x308},  {0x3B9, 0x342},  {0x3C1, 0x313},  {0x3C5, 0x308},  {0x3C5, 0x313},
    {0x3C5, 0x342},  {0x3C9, 0x342},  {0x3C9, 0x3B9},  {0x3CE, 0x3B9},  {0x565, 0x582},  {0x574, 0x565},
    {0x574, 0x56B},  {0x574, 0x56D},  {0x574, 0x576},  {0x57E, 0x576},  {0x1F00, 0x3B9}, {0x1F01, 0x3B9},
    {0x1F02, 0x3B9}, {0x1F03, 0x3B9}, {0x1F04, 0x3B9}, {0x1F05, 0x3B9}, {0x1F06, 0x3B9}, {0x1F07, 0x3B9},
    {0x1F20, 0x3B9}, {0x1F21, 0x3B9}, {0x1F22, 0x3B9}, {0x1F23, 0x3B9}, {0x1F24, 0x3B9}, {0x1F25, 0x3B9},
    {0x1F26, 0x3B9}, {0x1F27, 0x3B9}, {0x1F60, 0x3B9}, {0x1F61, 0x3B9}, {0x1F62, 0x3B9}, {0x1F63, 0x3B9},
    {0x1F64, 0x3B9}, {0x1F65, 0x3B9}, {0x1F66, 0x3B9}, {0x1F67, 0x3B9}, {0x1F70, 0x3B9}, {0x1F74, 0x3B9},
    {0x1F7C, 0x3B9}};

std::string hex_atom(uint32_t cp) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "\\x{%X}", cp);
  return buf;
}

std::string u_plus(uint32_t cp) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "U+%04X", cp);
  return buf;
}

// Whether PCRE2 finds `pattern` (caseless, simple folding) in subject.
bool pcre2_finds(const std::string& pattern, const std::string& subject) {
  int err = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_CASELESS, &err, &offset, nullptr);
  if (!code) return false;
  pcre2_match_data* data = pcre2_match_data_create_from_pattern(code, nullptr);
  const int rc =
      pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(subject.data()), subject.size(), 0, 0, data, nullptr);
  pcre2_match_data_free(data);
  pcre2_code_free(code);
  return rc >= 0;
}

// Whether some character in [lo, hi], or one of its case variants, folds to several characters.
bool has_multi_fold(uint32_t lo, uint32_t hi) {
  std::string chars;
  for (const auto& r : kMultiFoldRanges)
    for (uint32_t c = r[0]; c <= r[1]; ++c) append_utf8(chars, c);
  std::string range = "[";
  range += hex_atom(lo);
  range += '-';
  range += hex_atom(hi);
  range += ']';
  return pcre2_finds(range, chars);
}

// Whether a then b (or their case variants) start a multi-character folding.
bool starts_multi_fold(uint32_t a, uint32_t b) {
  std::string pairs;
  for (const auto& s : kMultiFoldStarts) {
    append_utf8(pairs, s[0]);
    append_utf8(pairs, s[1]);
    pairs += '\n';
  }
  return pcre2_finds(hex_atom(a) + hex_atom(b), pairs);
}

bool is_hex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

// One escape read: the PCRE2 text for it and the literal code point it stands for (-1: none).
struct Escape {
  size_t len = 2;
  std::string text;
  long cp = -1;
};

class Translator {
 public:
  Translator(std::string_view p, const std::string& what) : p_(p), what_(what) {}
  std::string run();

 private:
  [[noreturn]] void refuse(size_t at, const std::string& construct, const std::string& why) const {
    NDT_FAIL(what_, ": the regex \"", std::string(p_), "\" uses ", construct, " at offset ", at, " (", why,
             "); ndtrain reads it with PCRE2 and refuses what it cannot give Oniguruma's meaning (the "
             "engine of Hugging Face's tokenizers)");
  }
  bool caseless() const { return groups_.back().caseless; }
  void literal(uint32_t cp, size_t at);
  Escape escape(size_t at, bool in_class);
  Escape letter_escape(size_t at, bool in_class);
  Escape property(size_t at);
  Escape code_escape(size_t at);
  size_t char_class(size_t at);
  size_t group_open(size_t at);
  size_t options(size_t at, size_t end);

  struct Group {
    bool caseless = false;
    int wraps = 0;  // (?flags: opened for a (?flags) inside this group, closed at its end
  };
  std::string_view p_;
  const std::string& what_;
  std::string out_;
  std::vector<Group> groups_{Group{}};
  long last_literal_ = -1;  // the previous literal character under (?i), -1: none, and its offset
  size_t last_literal_at_ = 0;
};

// A literal character outside [...]: under (?i), refused where Oniguruma folds across lengths.
void Translator::literal(uint32_t cp, size_t at) {
  if (!caseless()) {
    last_literal_ = -1;
    return;
  }
  if (has_multi_fold(cp, cp))
    refuse(at, "(?i) on " + u_plus(cp), "its full case folding is several characters, as ß is ss");
  if (last_literal_ >= 0 && starts_multi_fold(static_cast<uint32_t>(last_literal_), cp))
    refuse(last_literal_at_, "(?i) on " + u_plus(static_cast<uint32_t>(last_literal_)) + " " + u_plus(cp),
           "Oniguruma also matches them to one character that folds to several, as ss to ß");
  last_literal_ = cp;
  last_literal_at_ = at;
}

// \p{Name} or \P{Name}: a script is read as Script, as Oniguruma reads it.
Escape Translator::property(size_t at) {
  const size_t close = p_.find('}', at + 3);
  if (close == std::string_view::npos) return Escape{2, std::string(p_.substr(at, 2))};
  std::string name(p_.substr(at + 3, close - at - 3));
  const std::string caret = !name.empty() && name[0] == '^' ? "^" : "";
  name = name.substr(caret.size());
  Escape e{close - at + 1, std::string(p_.substr(at, close - at + 1))};
  // PCRE2's \p{Han} is Script_Extensions; \p{sc:Han} is Script. Is the name a script?
  int err = 0;
  PCRE2_SIZE offset = 0;
  const std::string probe = "\\p{sc:" + name + "}";
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(probe.data()), probe.size(), PCRE2_UTF, &err,
                                   &offset, nullptr);
  if (code) {
    e.text = std::string(p_.substr(at, 2));
    e.text += '{';
    e.text += caret;
    e.text += "sc:";
    e.text += name;
    e.text += '}';
  }
  pcre2_code_free(code);
  return e;
}

// \xHH, \x{H...} or \o{O...}: the code point.
Escape Translator::code_escape(size_t at) {
  const bool octal = p_[at + 1] == 'o';
  const auto digit = [&](size_t k) {
    return k < p_.size() && (octal ? p_[k] >= '0' && p_[k] <= '7' : is_hex(p_[k]));
  };
  const bool braced = at + 2 < p_.size() && p_[at + 2] == '{';
  const size_t begin = at + (braced ? 3 : 2);
  size_t end = begin;
  while (digit(end) && (braced || end < begin + 2)) ++end;
  if (braced && (end == begin || end >= p_.size() || p_[end] != '}' || end - begin > 8))
    refuse(at, std::string(p_.substr(at, 2)) + "{", "expected digits and a closing }");
  if (end == begin) refuse(at, "\\x", "without hex digits Oniguruma reads it as x, and as NUL inside [...]");
  const long cp = std::stol(std::string(p_.substr(begin, end - begin)), nullptr, octal ? 8 : 16);
  return Escape{end - at + (braced ? 1 : 0), hex_atom(static_cast<uint32_t>(cp)), cp};
}

Escape Translator::letter_escape(size_t at, bool in_class) {
  const char d = p_[at + 1];
  const char next = at + 2 < p_.size() ? p_[at + 2] : '\0';
  const std::string plain(1, d);
  const Escape letter{2, plain, d};
  // letters Oniguruma reads as themselves, here and inside [...]
  if (std::string_view("EFIJLQTUVijlmq").find(d) != std::string_view::npos) return letter;
  if (d == 'C' || d == 'M') refuse(at, std::string("\\") + d, "a control or meta escape, \\C-x or \\M-x");
  if (d == 'v') return Escape{2, "\\x{B}", 0x0B};
  const size_t control = std::string_view("aefnrt").find(d);
  if (control != std::string_view::npos) return Escape{2, "\\" + plain, "\x07\x1B\f\n\r\t"[control]};
  if (d == 'u') {
    for (size_t k = 2; k < 6; ++k)
      if (at + k >= p_.size() || !is_hex(p_[at + k]))
        refuse(at, "\\u", "Oniguruma reads \\uHHHH, four hex digits");
    const long cp = std::stol(std::string(p_.substr(at + 2, 4)), nullptr, 16);
    return Escape{6, hex_atom(static_cast<uint32_t>(cp)), cp};
  }
  if (d == 'x' || (d == 'o' && next == '{')) return code_escape(at);
  if ((d == 'p' || d == 'P') && next == '{') return property(at);
  if (d == 'p' || d == 'P' || (d == 'o' && next != '{')) return letter;
  if (in_class) {
    // inside [...] Oniguruma reads as itself every letter but these
    if (std::string_view("abcdDefhHnoprsStuvwWx").find(d) == std::string_view::npos) return letter;
    if (d == 'b') return Escape{2, "\\x{8}", 8};
    return Escape{2, "\\" + plain};
  }
  if (d == 'g' || d == 'k') return next == '<' || next == '\'' ? Escape{2, "\\" + plain} : letter;
  if (d == 'b' || d == 'B') refuse(at, "\\" + plain, "word boundaries differ between the engines");
  if (d == 'y' || d == 'Y') refuse(at, "\\" + plain, "a text segment boundary, which PCRE2 does not have");
  if (d == 'O') return Escape{2, "(?s:.)"};
  return Escape{2, "\\" + plain};
}

// The escape at p_[at] == '\\' (not the last character).
Escape Translator::escape(size_t at, bool in_class) {
  const char d = p_[at + 1];
  const char* members = d == 's' || d == 'S'   ? kSpace
                        : d == 'w' || d == 'W' ? kWord
                        : d == 'h' || d == 'H' ? kHex
                                               : nullptr;
  if (members) {
    const bool negated = d == 'S' || d == 'W' || d == 'H';
    if (in_class && negated) refuse(at, std::string("\\") + d, "a negated class inside a character class");
    if (in_class) return Escape{2, members};
    return Escape{2, std::string(negated ? "[^" : "[") + members + "]"};
  }
  if ((d >= 'a' && d <= 'z') || (d >= 'A' && d <= 'Z')) return letter_escape(at, in_class);
  if (d >= '0' && d <= '9') return Escape{2, std::string(p_.substr(at, 2))};  // back-reference or octal
  const int n = utf8_step(p_, at + 1);
  if (n <= 0) return Escape{2, std::string(p_.substr(at, 2))};
  size_t k = at + 1;
  const uint32_t cp = next_code_point(p_, k);
  return Escape{1 + static_cast<size_t>(n), std::string(p_.substr(at, 1 + n)), cp};
}

// The class starting at p_[at] == '['; returns the offset after its ']'.
size_t Translator::char_class(size_t at) {
  size_t i = at + 1;
  out_ += '[';
  if (i < p_.size() && p_[i] == '^') out_ += p_[i++];
  long prev = -1;  // the last member, for a range
  bool range = false;
  for (bool first = true; i < p_.size(); first = false) {
    const char c = p_[i];
    if (c == ']' && !first) {
      out_ += c;
      return i + 1;
    }
    long cp = -1;
    size_t start = i;
    if (c == '\\' && i + 1 < p_.size()) {
      const Escape e = escape(i, /*in_class=*/true);
      out_ += e.text;
      cp = e.cp;
      i += e.len;
    } else if (c == '[') {
      refuse(i, i + 1 < p_.size() && p_[i + 1] == ':' ? "a POSIX class [:name:]" : "a nested class [...]",
             "PCRE2 reads classes inside classes differently");
    } else if (c == '&' && i + 1 < p_.size() && p_[i + 1] == '&') {
      refuse(i, "&&", "PCRE2 has no class intersection");
    } else if (c == '-' && prev >= 0 && i + 1 < p_.size() && p_[i + 1] != ']') {
      out_ += c;
      ++i;
      range = true;
      continue;
    } else {
      const int n = utf8_step(p_, i);
      if (n > 0)
        cp = next_code_point(p_, i);
      else
        ++i;
      out_ += std::string(p_.substr(start, i - start));
    }
    if (caseless() && cp >= 0) {
      const uint32_t lo = static_cast<uint32_t>(range ? prev : cp), hi = static_cast<uint32_t>(cp);
      if (lo <= hi && has_multi_fold(lo, hi)) {
        std::string held = u_plus(lo);
        if (range) held.append(1, '-').append(u_plus(hi));
        refuse(start, "(?i) on a class holding " + held,
               "a character in it folds to several characters, as ß is ss");
      }
    }
    prev = range ? -1 : cp;
    range = false;
  }
  return i;  // no ']': PCRE2 says so
}

// Option letters p_[at, end) of (?imx-imx) or (?imx-imx:: Oniguruma's m is PCRE2's s.
size_t Translator::options(size_t at, size_t end) {
  out_ += "(?";
  bool on = true, caseless = this->caseless();
  for (size_t k = at; k < end; ++k) {
    const char c = p_[k];
    if (c == '-')
      on = false;
    else if (c == 'i')
      caseless = on;
    else if (c == 'x')
      refuse(k, "the option (?x)", "extended syntax: its comments and spaces are not translated");
    else if (c != 'm')
      refuse(k, std::string("the option (?") + c + ")",
             "Oniguruma's (?W D S P y I L C) have no PCRE2 form, PCRE2's own are not Oniguruma's");
    out_ += c == 'm' ? 's' : c;
  }
  out_ += ':';
  if (p_[end] == ':')
    groups_.push_back(Group{caseless, 0});
  else {  // (?i) runs to the end of the enclosing group, across its alternatives
    ++groups_.back().wraps;
    groups_.back().caseless = caseless;
  }
  return end + 1;
}

// The group starting at p_[at] == '('; returns the offset after what it wrote.
size_t Translator::group_open(size_t at) {
  if (at + 1 < p_.size() && p_[at + 1] == '?') {
    if (at + 2 < p_.size() && p_[at + 2] == '#') {  // a comment, to its ')'
      const size_t close = p_.find(')', at);
      const size_t end = close == std::string_view::npos ? p_.size() : close + 1;
      out_ += p_.substr(at, end - at);
      return end;
    }
    size_t k = at + 2;
    while (k < p_.size() && (std::isalpha(static_cast<unsigned char>(p_[k])) || p_[k] == '-')) ++k;
    if (k < p_.size() && k > at + 2 && (p_[k] == ')' || p_[k] == ':')) return options(at + 2, k);
    if (k > at + 2)
      refuse(at + 2, "the group (?" + std::string(p_.substr(at + 2, k - at - 2)), "not an option");
    if (k < p_.size() && (p_[k] == '^' || p_[k] == ')'))
      refuse(k, std::string("the option (?") + p_[k], "PCRE2's own, not Oniguruma's");
  }
  // the opener whole: (, (?: (?= (?! (?> (?<= (?<! or a name (?<name> (?'name'
  size_t end = at + 1;
  if (end < p_.size() && p_[end] == '?') {
    const char k = end + 1 < p_.size() ? p_[end + 1] : '\0';
    const char k2 = end + 2 < p_.size() ? p_[end + 2] : '\0';
    if (k == '<' && (k2 == '=' || k2 == '!'))
      end += 3;
    else if (k == '<' || k == '\'')
      end = std::min(p_.find(k == '<' ? '>' : '\'', end + 2), p_.size() - 1) + 1;
    else
      end += k && k != '(' ? 2 : 1;  // (?(cond)...: the condition is a group of its own
  }
  groups_.push_back(Group{caseless(), 0});
  out_ += p_.substr(at, end - at);
  return end;
}

std::string Translator::run() {
  out_.reserve(p_.size() + 32);
  size_t i = 0;
  while (i < p_.size()) {
    const char c = p_[i];
    if (c == '\\' && i + 1 < p_.size()) {
      const Escape e = escape(i, /*in_class=*/false);
      out_ += e.text;
      if (e.cp >= 0)
        literal(static_cast<uint32_t>(e.cp), i);
      else
        last_literal_ = -1;
      i += e.len;
    } else if (c == '[') {
      last_literal_ = -1;
      i = char_class(i);
    } else if (c == '(') {
      i = group_open(i);  // a literal before and after a group may still join: kept
    } else if (c == ')') {
      if (groups_.size() > 1) {
        out_ += std::string(groups_.back().wraps, ')');
        groups_.pop_back();
      }
      out_ += c;
      ++i;
    } else if (c == '|' || c == '.' || c == '^' || c == '$') {
      last_literal_ = -1;
      out_ += c;
      ++i;
    } else if (c == '*' || c == '+' || c == '?' || c == '{' || c == '}') {
      out_ += c;  // a quantifier keeps the literal before it (refusing more, never less)
      ++i;
    } else {
      const size_t start = i;
      const int n = utf8_step(p_, i);
      if (n > 0)
        literal(next_code_point(p_, i), start);
      else
        ++i;
      out_ += p_.substr(start, i - start);
    }
  }
  out_ += std::string(groups_.front().wraps, ')');
  return out_;
}

}  // namespace

std::string oniguruma_to_pcre2(std::string_view p, const std::string& what) {
  return Translator(p, what).run();
}

}  // namespace ndt::tok
