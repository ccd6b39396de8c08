// Encoding and decoding, in tokenizers' order: added tokens are split off the raw text
// (those not normalized), the rest is normalized and split by the normalized added tokens,
// each remaining piece goes through the pre-tokenizer's splits, and each pre-token through
// BPE; the post-processor's template adds BOS where asked.
#include <omp.h>

#include <algorithm>

#include "tensor/error.h"
#include "tokenizer/impl.h"

namespace ndt::tok {

namespace {

using Ranges = std::vector<std::pair<size_t, size_t>>;

// tokenizers' NormalizedString::split: the (range, is_match) list made by a regex, turned into
// pieces by the behavior (empty pieces dropped later)
void split_pieces(const SplitStep& step, Regex::Matcher& m, std::string_view s, Ranges& out) {
  out.clear();
  thread_local std::vector<std::pair<std::pair<size_t, size_t>, bool>> parts;
  parts.clear();
  m.reset();
  size_t pos = 0, prev = 0, a, b;
  while (m.next(s, pos, a, b)) {
    if (prev != a) parts.push_back({{prev, a}, step.invert});
    parts.push_back({{a, b}, !step.invert});
    prev = b;
  }
  if (prev != s.size()) parts.push_back({{prev, s.size()}, step.invert});
  switch (step.behavior) {
    case Behavior::isolated:
      for (const auto& [r, is_match] : parts) out.push_back(r);
      break;
    case Behavior::removed:
      for (const auto& [r, is_match] : parts)
        if (!is_match) out.push_back(r);
      break;
    case Behavior::contiguous: {
      bool previous = false;
      for (const auto& [r, is_match] : parts) {
        if (is_match == previous && !out.empty())
          out.back().second = r.second;
        else
          out.push_back(r);
        previous = is_match;
      }
      break;
    }
    case Behavior::merged_with_previous: {
      bool previous = false;
      for (const auto& [r, is_match] : parts) {
        if (is_match && !previous && !out.empty())
          out.back().second = r.second;
        else
          out.push_back(r);
        previous = is_match;
      }
      break;
    }
    case Behavior::merged_with_next: {
      bool previous = false;
      for (size_t i = parts.size(); i-- > 0;) {
        const auto& [r, is_match] = parts[i];
        if (is_match && !previous && !out.empty())
          out.back().first = r.first;
        else
          out.push_back(r);
        previous = is_match;
      }
      std::reverse(out.begin(), out.end());
      break;
    }
  }
}

}  // namespace

std::unique_ptr<Scratch> Tokenizer::Impl::take_scratch() const {
  {
    std::lock_guard<std::mutex> lock(pool_mutex);
    if (!pool.empty()) {
      std::unique_ptr<Scratch> s = std::move(pool.back());
      pool.pop_back();
      return s;
    }
  }
  auto s = std::make_unique<Scratch>();
  for (const SplitStep& step : splits) s->matchers.push_back(std::make_unique<Regex::Matcher>(*step.re));
  s->pieces.resize(splits.size());
  return s;
}

void Tokenizer::Impl::give_back(std::unique_ptr<Scratch> s) const {
  std::lock_guard<std::mutex> lock(pool_mutex);
  pool.push_back(std::move(s));
}

namespace {

struct Encoder {
  const Tokenizer::Impl& t;
  Scratch& s;
  std::vector<int32_t>& out;

  // the pre-tokenizer's split `level` on one piece, then BPE
  void pre_tokenize(std::string_view piece, size_t level) {
    if (piece.empty()) return;
    if (level == t.prefix_space_at && piece[0] != ' ') {
      // ByteLevel's add_prefix_space: " " before each piece that does not start with one
      s.prefixed.assign(1, ' ');
      s.prefixed.append(piece);
      const std::string_view p = s.prefixed;
      return pre_tokenize_from(p, level);  // s.prefixed is not touched again below this level
    }
    pre_tokenize_from(piece, level);
  }
  void pre_tokenize_from(std::string_view piece, size_t level) {
    if (level == t.splits.size()) return t.bpe.encode(piece, s.cache, out);
    Ranges& pieces = s.pieces[level];
    split_pieces(t.splits[level], *s.matchers[level], piece, pieces);
    for (size_t i = 0; i < pieces.size(); ++i) {  // (index: `pieces` is reused at this level only)
      const auto [a, b] = pieces[i];
      pre_tokenize(piece.substr(a, b - a), level + 1);
    }
  }

  // tokenizers' AddedVocabulary::find_matches: each match of `tokens` in text, with
  // single_word, lstrip and rstrip; `piece` gets the text between them
  template <class Piece>
  void split_added(std::string_view text, const Trie& tokens, bool parse_special, Piece&& piece) {
    if (tokens.empty()) return piece(text);
    size_t from = 0, done = 0, start, len;
    int32_t index;
    while (tokens.find(text, from, start, len, index)) {
      from = start + len;
      const AddedToken& a = t.added[index];
      size_t stop = start + len;
      if (a.special && !parse_special) continue;
      if (a.single_word && !is_single_word(text, start, stop)) continue;
      if (a.lstrip) {  // the whitespace before it, not taken by the previous match
        size_t k = start;
        while (k > 0) {
          size_t b = k - 1;
          while (b > 0 && (static_cast<unsigned char>(text[b]) & 0xC0) == 0x80) --b;
          size_t q = b;
          if (!is_white_space(next_code_point(text, q))) break;
          k = b;
        }
        start = std::max(k, done);
      }
      if (a.rstrip) {
        size_t q = stop;
        while (q < text.size()) {
          size_t n = q;
          if (!is_white_space(next_code_point(text, n))) break;
          q = n;
        }
        stop = q;
      }
      if (done < start) piece(text.substr(done, start - done));
      out.push_back(a.id);
      done = stop;
    }
    if (done < text.size()) piece(text.substr(done));
  }
  // single_word: the characters on either side of [start, stop) are not word characters
  // (the regex crate's \w, as tokenizers' ends_with_word / starts_with_word test)
  bool is_single_word(std::string_view text, size_t start, size_t stop) {
    if (!s.word_char) s.word_char = std::make_unique<Regex::Matcher>(*t.word_char);
    Regex::Matcher& m = *s.word_char;
    const auto is_word = [&](size_t a) {
      size_t b = a, pos = 0, x, y;
      next_code_point(text, b);
      m.reset();
      return m.next(text.substr(a, b - a), pos, x, y);
    };
    size_t before = start;
    if (before > 0) {
      --before;
      while (before > 0 && (static_cast<unsigned char>(text[before]) & 0xC0) == 0x80) --before;
    }
    return !(start > 0 && is_word(before)) && !(stop < text.size() && is_word(stop));
  }

  void encode(std::string_view text, bool parse_special, int threads) {
    const auto piece = [&](std::string_view p) {
      if (threads > 1 && p.size() >= 2 * kChunk && can_split_in_parallel())
        pre_tokenize_parallel(p, threads);
      else
        pre_tokenize(p, 0);
    };
    split_added(text, t.raw_tokens, parse_special, [&](std::string_view raw) {
      if (t.normalizers.empty()) return split_added(raw, t.normalized_tokens, parse_special, piece);
      std::string norm(raw);
      for (NormalForm f : t.normalizers)
        if (!normalize_is_noop(f, norm)) norm = normalize(f, norm);
      split_added(norm, t.normalized_tokens, parse_special, piece);
    });
  }

  // One long piece over threads. The first split is a regex whose matches are kept (Isolated,
  // not inverted, never empty): each thread finds the matches from its own start on (the
  // whole piece as the subject, so lookaheads see past its part) until one ends past the next
  // part's start. A sequential search that has reached position `at` in part k finds what part
  // k's thread found from its first match starting at or after `at`, when the thread's search
  // had not passed `at` before that match (the match at a position does not depend on where the
  // search began); where no match qualifies, the search from `at` is done again. Then each
  // thread takes the pieces (matches and the text between them) of its part through the rest.
  static constexpr size_t kChunk = 256 * 1024;
  bool can_split_in_parallel() const {
    if (t.splits.empty() || t.prefix_space_at == 0) return false;
    const SplitStep& first = t.splits[0];
    return first.behavior == Behavior::isolated && !first.invert && !first.re->can_match_empty();
  }
  void pre_tokenize_parallel(std::string_view piece, int threads) {
    const size_t n = piece.size();
    const int T = static_cast<int>(std::min<size_t>(threads, n / kChunk));
    std::vector<size_t> begin(T + 1);
    for (int k = 0; k <= T; ++k) {
      size_t b = n * k / T;
      while (b < n && (static_cast<unsigned char>(piece[b]) & 0xC0) == 0x80) ++b;  // a character's start
      begin[k] = b;
    }
    std::vector<std::unique_ptr<Scratch>> scratch(T);
    for (int k = 0; k < T; ++k) scratch[k] = t.take_scratch();
    // each part's matches, from its start until one ends in the next part
    const auto scan = [&](int k, size_t from) {
      Regex::Matcher& m = *scratch[k]->matchers[0];
      m.reset();
      Ranges found;  // the thread's own vector (neighbours in one array would share cache lines)
      found.reserve((begin[k + 1] - begin[k]) / 4 + 16);
      size_t pos = from, a, b;
      while (m.next(piece, pos, a, b)) {
        found.emplace_back(a, b);
        if (k + 1 < T && b >= begin[k + 1]) break;
      }
      return found;
    };
    std::vector<Ranges> found(T);
#pragma omp parallel for num_threads(T) schedule(static, 1)
    for (int k = 0; k < T; ++k) found[k] = scan(k, begin[k]);
    // where the sequential search joins each part: skip[k] matches of part k are not its own,
    // and its pieces start at from[k] (the end of the last match before them)
    std::vector<size_t> skip(T, 0), from(T, 0);
    size_t at = 0;
    for (int k = 0; k < T; ++k) {
      from[k] = at;
      Ranges& f = found[k];
      size_t j = 0;
      if (k > 0)
        while (j < f.size() && !((j == 0 ? begin[k] : f[j - 1].second) <= at && at <= f[j].first)) ++j;
      if (j == f.size() && !f.empty()) {  // `at` fell inside one of this part's matches, or past them
        f = scan(k, at);
        j = 0;
      }
      skip[k] = j;
      if (!f.empty()) at = f.back().second;
    }
    // the pieces of each part through the rest of the pre-tokenizer and BPE
    std::vector<std::vector<int32_t>> ids(T);
#pragma omp parallel for num_threads(T) schedule(static, 1)
    for (int k = 0; k < T; ++k) {
      std::vector<int32_t> mine;
      mine.reserve((begin[k + 1] - begin[k]) / 3 + 16);
      Encoder e{t, *scratch[k], mine};
      size_t prev = from[k];
      for (size_t i = skip[k]; i < found[k].size(); ++i) {
        const auto [a, b] = found[k][i];
        if (prev < a) e.pre_tokenize(piece.substr(prev, a - prev), 1);
        e.pre_tokenize(piece.substr(a, b - a), 1);
        prev = b;
      }
      ids[k] = std::move(mine);
    }
    for (int k = 0; k < T; ++k) {
      out.insert(out.end(), ids[k].begin(), ids[k].end());
      t.give_back(std::move(scratch[k]));
    }
    if (at < n) pre_tokenize(piece.substr(at), 1);  // the text after the last match
  }
};

}  // namespace

std::vector<int32_t> Tokenizer::encode(std::string_view text, const EncodeOptions& opt) const {
  const Impl& t = *impl_;
  std::string fixed;
  if (!utf8_valid(text)) {
    fixed = utf8_replace_invalid(text);
    text = fixed;
  }
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 8);
  if (opt.add_special) out.insert(out.end(), t.before.begin(), t.before.end());
  std::unique_ptr<Scratch> s = t.take_scratch();
  try {
    Encoder{t, *s, out}.encode(text, opt.parse_special,
                               opt.threads > 0 ? opt.threads : omp_get_max_threads());
  } catch (...) {
    t.give_back(std::move(s));
    throw;
  }
  t.give_back(std::move(s));
  if (opt.add_special) out.insert(out.end(), t.after.begin(), t.after.end());
  return out;
}

std::vector<std::vector<int32_t>> Tokenizer::encode_batch(const std::vector<std::string_view>& texts,
                                                          const EncodeOptions& opt) const {
  std::vector<std::vector<int32_t>> out(texts.size());
  const int threads = opt.threads > 0 ? opt.threads : omp_get_max_threads();
  if (texts.size() < static_cast<size_t>(threads)) {  // few documents: each over the threads
    for (size_t i = 0; i < texts.size(); ++i) out[i] = encode(texts[i], opt);
    return out;
  }
  EncodeOptions one = opt;
  one.threads = 1;
  std::string error;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (size_t i = 0; i < texts.size(); ++i) {
    try {
      out[i] = encode(texts[i], one);
    } catch (const std::exception& e) {
#pragma omp critical
      if (error.empty()) error = e.what();
    }
  }
  if (!error.empty()) throw Error(error);
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  const Impl& t = *impl_;
  std::string bytes;
  for (int32_t id : ids) {
    NDT_CHECK(id >= 0 && id < t.vocab_size && t.known[id], "tokenizer ", t.source, ": decode: id ", id,
              " is not in the vocabulary (", t.vocab_size, " ids)");
    if (skip_special && t.special[id]) continue;
    bytes += t.bytes[id];
  }
  return utf8_valid(bytes) ? bytes : utf8_replace_invalid(bytes);
}

const std::string& Tokenizer::token_bytes(int32_t id) const {
  const Impl& t = *impl_;
  NDT_CHECK(id >= 0 && id < t.vocab_size && t.known[id], "tokenizer ", t.source, ": id ", id,
            " is not in the vocabulary (", t.vocab_size, " ids)");
  return t.bytes[id];
}

int64_t Tokenizer::vocab_size() const { return impl_->vocab_size; }

std::optional<int32_t> Tokenizer::id_of(std::string_view token) const {
  auto it = impl_->ids.find(std::string(token));
  if (it == impl_->ids.end()) return std::nullopt;
  return it->second;
}

std::optional<int32_t> Tokenizer::bos_id() const { return impl_->bos; }
std::optional<int32_t> Tokenizer::eos_id() const { return impl_->eos; }

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < impl_->vocab_size && impl_->special[id];
}

const std::vector<AddedToken>& Tokenizer::added_tokens() const { return impl_->added; }
const std::string& Tokenizer::source() const { return impl_->source; }

std::string StreamDecoder::push(int32_t id) {
  if (skip_special_ && tok_.is_special(id)) return {};
  held_ += tok_.token_bytes(id);
  const size_t n = utf8_complete_prefix(held_);
  std::string out = utf8_replace_invalid(std::string_view(held_).substr(0, n));
  held_.erase(0, n);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out = utf8_replace_invalid(held_);
  held_.clear();
  return out;
}

}  // namespace ndt::tok
