#include "tokenizer/unicode.h"

#include <uninorm.h>

#include <array>
#include <cstdlib>
#include <memory>

#include "tensor/error.h"

namespace ndt::tok {

int utf8_step(std::string_view s, size_t i, bool* cut) {
  if (cut) *cut = false;
  const auto at = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char b = at(i);
  if (b < 0x80) return 1;
  // Unicode's table of well-formed sequences: the second byte's range depends on the first
  int need;
  unsigned char lo = 0x80, hi = 0xBF;
  if (b >= 0xC2 && b <= 0xDF) {
    need = 1;
  } else if (b >= 0xE0 && b <= 0xEF) {
    need = 2;
    if (b == 0xE0) lo = 0xA0;
    if (b == 0xED) hi = 0x9F;
  } else if (b >= 0xF0 && b <= 0xF4) {
    need = 3;
    if (b == 0xF0) lo = 0x90;
    if (b == 0xF4) hi = 0x8F;
  } else {
    return -1;
  }
  for (int k = 1; k <= need; ++k) {
    if (i + k >= s.size()) {
      if (cut) *cut = true;
      return -k;
    }
    const unsigned char c = at(i + k);
    if (c < lo || c > hi) return -k;
    lo = 0x80;
    hi = 0xBF;
  }
  return need + 1;
}

bool utf8_valid(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    // ASCII eight bytes at a time
    while (i + 8 <= s.size()) {
      uint64_t w;
      __builtin_memcpy(&w, s.data() + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= s.size()) break;
    const int n = utf8_step(s, i);
    if (n < 0) return false;
    i += static_cast<size_t>(n);
  }
  return true;
}

std::string utf8_replace_invalid(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 16);
  for (size_t i = 0; i < s.size();) {
    const int n = utf8_step(s, i);
    if (n > 0) {
      out.append(s.data() + i, static_cast<size_t>(n));
      i += static_cast<size_t>(n);
    } else {
      out += "\xEF\xBF\xBD";
      i += static_cast<size_t>(-n);
    }
  }
  return out;
}

size_t utf8_complete_prefix(std::string_view s) {
  // only the last three bytes can start a character still to be completed
  const size_t from = s.size() > 3 ? s.size() - 3 : 0;
  for (size_t i = from; i < s.size(); ++i) {
    const unsigned char b = static_cast<unsigned char>(s[i]);
    if ((b & 0xC0) == 0x80) continue;  // a continuation byte: not a start
    bool cut = false;
    const int n = utf8_step(s, i, &cut);
    if (n < 0 && cut) return i;
    if (n < 0)
      i += static_cast<size_t>(-n) - 1;
    else
      i += static_cast<size_t>(n) - 1;
  }
  return s.size();
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

uint32_t next_code_point(std::string_view s, size_t& i) {
  const auto at = [&](size_t k) { return static_cast<uint32_t>(static_cast<unsigned char>(s[k])); };
  const uint32_t b = at(i);
  if (b < 0x80) {
    i += 1;
    return b;
  }
  if (b < 0xE0) {
    const uint32_t cp = ((b & 0x1F) << 6) | (at(i + 1) & 0x3F);
    i += 2;
    return cp;
  }
  if (b < 0xF0) {
    const uint32_t cp = ((b & 0x0F) << 12) | ((at(i + 1) & 0x3F) << 6) | (at(i + 2) & 0x3F);
    i += 3;
    return cp;
  }
  const uint32_t cp =
      ((b & 0x07) << 18) | ((at(i + 1) & 0x3F) << 12) | ((at(i + 2) & 0x3F) << 6) | (at(i + 3) & 0x3F);
  i += 4;
  return cp;
}

bool is_white_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
         cp == 0x3000;
}

namespace {
// GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the other 68 bytes
// for U+0100.. in byte order.
struct ByteAlphabet {
  std::array<uint32_t, 256> to_char{};
  std::array<int16_t, 512> to_byte{};
  ByteAlphabet() {
    to_byte.fill(-1);
    uint32_t n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      to_char[b] = printable ? static_cast<uint32_t>(b) : 256 + n++;
      to_byte[to_char[b]] = static_cast<int16_t>(b);
    }
  }
};
const ByteAlphabet& alphabet() {
  static const ByteAlphabet a;
  return a;
}
}  // namespace

uint32_t byte_to_char(uint8_t b) { return alphabet().to_char[b]; }

int char_to_byte(uint32_t cp) { return cp < 512 ? alphabet().to_byte[cp] : -1; }

bool byte_level_decode(std::string_view token, std::string& bytes) {
  bytes.clear();
  for (size_t i = 0; i < token.size();) {
    const int b = char_to_byte(next_code_point(token, i));
    if (b < 0) return false;
    bytes += static_cast<char>(b);
  }
  return true;
}

bool normalize_is_noop(NormalForm form, std::string_view s) {
  // NFC: every code point below U+0300 is a starter that nothing before it composes with, and
  // only U+0300 and above (lead bytes from 0xCC) can compose with what precedes them
  const unsigned char limit = form == NormalForm::nfc ? 0xCC : 0x80;
  for (unsigned char c : s)
    if (c >= limit) return false;
  return true;
}

std::string normalize(NormalForm form, std::string_view s) {
  if (normalize_is_noop(form, s)) return std::string(s);
  const uninorm_t nf = form == NormalForm::nfc    ? UNINORM_NFC
                       : form == NormalForm::nfd  ? UNINORM_NFD
                       : form == NormalForm::nfkc ? UNINORM_NFKC
                                                  : UNINORM_NFKD;
  size_t n = 0;
  uint8_t* r = u8_normalize(nf, reinterpret_cast<const uint8_t*>(s.data()), s.size(), nullptr, &n);
  NDT_CHECK(r != nullptr, "tokenizer: Unicode normalization failed on ", s.size(), " bytes of text");
  std::unique_ptr<uint8_t, void (*)(void*)> owned(r, std::free);
  return std::string(reinterpret_cast<const char*>(r), n);
}

}  // namespace ndt::tok
