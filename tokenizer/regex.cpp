#include "tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "tensor/error.h"

namespace ndt::tok {

namespace {

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof(buf));
  return reinterpret_cast<const char*>(buf);
}

}  // namespace

Regex::Regex(std::string_view pattern, bool literal, const std::string& what)
    : pattern_(pattern), what_(what) {
  const std::string translated = literal ? std::string(pattern) : oniguruma_to_pcre2(pattern, what);
  int err = 0;
  PCRE2_SIZE offset = 0;
  // UTF and UCP: code points and Unicode properties; MULTILINE: Oniguruma's ^ and $ (line anchors).
  // Oniguruma's line end is \n alone and its \R any Unicode line break, whatever PCRE2's build chose.
  const uint32_t options = literal ? PCRE2_UTF | PCRE2_LITERAL : PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE;
  pcre2_compile_context* context = pcre2_compile_context_create(nullptr);
  NDT_CHECK(context != nullptr, "tokenizer: out of memory for the regex's compile context");
  pcre2_set_newline(context, PCRE2_NEWLINE_LF);
  pcre2_set_bsr(context, PCRE2_BSR_UNICODE);
  code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(), options, &err,
                        &offset, context);
  pcre2_compile_context_free(context);
  NDT_CHECK(code_ != nullptr, what, ": the regex \"", pattern_, "\" does not compile (", pcre2_message(err),
            " at offset ", offset, ")");
  jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;
  uint32_t min_length = 0;
  pcre2_pattern_info(code_, PCRE2_INFO_MINLENGTH, &min_length);
  min_length_ = min_length;
}

Regex::~Regex() { pcre2_code_free(code_); }

Regex::Matcher::Matcher(const Regex& re) : re_(re) {
  data_ = pcre2_match_data_create_from_pattern(re.code_, nullptr);
  context_ = pcre2_match_context_create(nullptr);
  // the JIT's own stack: long runs (a megabyte of spaces) need more than its 32 KiB default
  stack_ = re.jit_ ? pcre2_jit_stack_create(64 * 1024, 64 * 1024 * 1024, nullptr) : nullptr;
  NDT_CHECK(data_ && context_ && (!re.jit_ || stack_), "tokenizer: out of memory for the regex's match data");
  if (stack_) pcre2_jit_stack_assign(context_, nullptr, stack_);
}

Regex::Matcher::~Matcher() {
  if (stack_) pcre2_jit_stack_free(stack_);
  pcre2_match_context_free(context_);
  pcre2_match_data_free(data_);
}

bool Regex::Matcher::next(std::string_view subject, size_t& pos, size_t& start, size_t& end) {
  while (pos <= subject.size()) {
    const auto* s = reinterpret_cast<PCRE2_SPTR>(subject.data());
    const int rc = re_.jit_
                       ? pcre2_jit_match(re_.code_, s, subject.size(), pos, 0, data_, context_)
                       : pcre2_match(re_.code_, s, subject.size(), pos, PCRE2_NO_UTF_CHECK, data_, context_);
    if (rc == PCRE2_ERROR_NOMATCH) return false;
    NDT_CHECK(rc >= 0, re_.what_, ": the regex \"", re_.pattern_, "\" failed while matching (",
              pcre2_message(rc), ")");
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(data_);
    start = ov[0];
    end = ov[1];
    if (start == end && last_end_ == end) {
      // Oniguruma's find_iter: no empty match right after the previous match; one character on
      if (pos >= subject.size()) return false;
      const unsigned char b = static_cast<unsigned char>(subject[pos]);
      pos += b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
      continue;
    }
    pos = end;
    last_end_ = end;
    return true;
  }
  return false;
}

}  // namespace ndt::tok
