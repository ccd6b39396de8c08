// ndtrain tokenizer: UTF-8, the byte-level alphabet and Unicode normalization.
//
//   std::string ok = utf8_replace_invalid("a\xff" "b");   // "a\uFFFDb", as Python's errors="replace"
//   utf8_complete_prefix("\xe4\xbd")                      // 0: a character not yet complete
//   byte_to_char(' ')                                     // U+0120 'Ġ', GPT-2's byte-level alphabet
//   normalize(NormalForm::nfc, "e\u0301")                 // "\u00e9"
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace ndt::tok {

// The length of the valid character at s[i], or minus the length of the invalid bytes there
// that become one U+FFFD (Unicode's "maximal subpart", as Python and Rust replace); `cut` is set
// when those bytes are a valid start that the end of s cut short.
int utf8_step(std::string_view s, size_t i, bool* cut = nullptr);
bool utf8_valid(std::string_view s);
std::string utf8_replace_invalid(std::string_view s);
// The longest prefix of s that does not end inside a character still to be completed (what a
// stream decoder can emit now; invalid bytes count as complete).
size_t utf8_complete_prefix(std::string_view s);
void append_utf8(std::string& out, uint32_t cp);
// The code point at s[i] of valid UTF-8 s; advances i.
uint32_t next_code_point(std::string_view s, size_t& i);

// Unicode's White_Space property (Rust's char::is_whitespace, Oniguruma's \s).
bool is_white_space(uint32_t cp);

// GPT-2's byte-level alphabet: every byte as a printable character, and back (-1: none).
uint32_t byte_to_char(uint8_t b);
int char_to_byte(uint32_t cp);
// A byte-level token (e.g. "Ġhello") as the bytes it stands for; false when a character is
// not in the alphabet.
bool byte_level_decode(std::string_view token, std::string& bytes);

enum class NormalForm { nfc, nfd, nfkc, nfkd };
std::string normalize(NormalForm form, std::string_view s);
// True when normalize(form, s) == s is known without computing it (ASCII; NFC: below U+0300).
bool normalize_is_noop(NormalForm form, std::string_view s);

}  // namespace ndt::tok
