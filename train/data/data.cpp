#include "train/data/data.h"

#include "train/io/files.h"

#include <fcntl.h>
#include <glob.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <numeric>

#include "tensor/checked.h"
#include "train/data/preparation.h"

namespace ndt::data {

Shard::Shard(const std::string& path) : path_(path) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused just below.
  fd_ = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  NDT_CHECK(fd_ >= 0, "data shard ", path, ": cannot open (", std::strerror(errno), ")");
  struct stat st {};
  std::string err;
  if (::fstat(fd_, &st) != 0)
    err = std::string("cannot stat (") + std::strerror(errno) + ")";
  else if (!S_ISREG(st.st_mode))
    err = S_ISDIR(st.st_mode) ? "is a directory" : "is not a regular file (a FIFO or device?)";
  else if (st.st_size < kHeaderInts * 4)
    err = std::to_string(st.st_size) + " bytes is too short for the 1024-byte header; is it a token shard?";
  int32_t h[kHeaderInts] = {};
  if (err.empty() && ::pread(fd_, h, sizeof(h), 0) != static_cast<ssize_t>(sizeof(h)))
    err = std::string("cannot read the header (") + std::strerror(errno) + ")";
  bytes_ = st.st_size;
  mtime_ns_ = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  ntok_ = h[2];
  width_ = h[0] == kShardMagic32 ? 4 : 2;
  const int32_t version = h[0] == kShardMagic32 ? kShardVersion32 : kShardVersion;
  if (!err.empty()) {
  } else if (h[0] != kShardMagic && h[0] != kShardMagic32) {
    err = "bad magic " + std::to_string(h[0]) + " (expected " + std::to_string(kShardMagic) +
          ", uint16 tokens, or " + std::to_string(kShardMagic32) +
          ", uint32 tokens); make shards with prepare_text or llm.c's scripts";
  } else if (h[1] != version) {
    err = "unsupported version " + std::to_string(h[1]) + " for magic " + std::to_string(h[0]) +
          " (expected " + std::to_string(version) + ")";
  } else if (ntok_ < 0 || bytes_ != kHeaderInts * 4 + width_ * ntok_) {
    err = "header says " + std::to_string(ntok_) + " tokens (" +
          std::to_string(kHeaderInts * 4 + width_ * ntok_) + " bytes) but the file has " +
          std::to_string(bytes_) + " bytes; the file is truncated or corrupt";
  }
  if (!err.empty()) {
    ::close(fd_);
    fd_ = -1;
    NDT_FAIL("data shard ", path, ": ", err);
  }
}

Shard::~Shard() {
  if (fd_ >= 0) ::close(fd_);
}

void Shard::read(int64_t pos, int64_t n, uint32_t* out) const {
  NDT_CHECK(pos >= 0 && n >= 0 && n <= ntok_ - pos, "data shard ", path_, ": tokens [", pos, ", ", pos + n,
            ") outside its ", ntok_, " tokens");
  struct stat st {};
  NDT_CHECK(::fstat(fd_, &st) == 0 && st.st_size == bytes_, "data shard ", path_,
            " changed size during the run (", bytes_, " bytes at open, now ", st.st_size,
            "); shards must not change while train_gpt reads them");
  // rewritten in place at the same size: its modification time moved (a shard replaced by
  // a rename is not seen, nor harmful: this open file keeps the old tokens)
  NDT_CHECK(static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec == mtime_ns_,
            "data shard ", path_,
            " was rewritten during the run (same size, but modified after train_gpt opened it); shards "
            "must not change while train_gpt reads them: write new data under another name");
  // the file's tokens land at the end of `out` (2 or 4 bytes each) and are widened in place
  char* dst = reinterpret_cast<char*>(out) + (4 - width_) * n;
  const int64_t want = width_ * n;
  int64_t done = 0;
  while (done < want) {
    const ssize_t r =
        ::pread(fd_, dst + done, static_cast<size_t>(want - done), kHeaderInts * 4 + width_ * pos + done);
    if (r < 0 && errno == EINTR) continue;
    NDT_CHECK(r > 0, "data shard ", path_, ": read failed at token ", pos + done / width_, " (",
              r == 0 ? "end of file: the shard shrank during the run" : std::strerror(errno), ")");
    done += r;
  }
  if (width_ == 2) {
    for (int64_t i = 0; i < n; ++i) {  // token i's bytes lie at or after out[i]: read before written
      uint16_t t;
      std::memcpy(&t, dst + 2 * i, 2);
      out[i] = t;
    }
  }
}

void Shard::check_tokens(int64_t vocab_size) const {
  std::vector<uint32_t> buf;
  for (int64_t pos = 0; pos < ntok_; pos += 1 << 20) {
    const int64_t n = std::min<int64_t>(1 << 20, ntok_ - pos);
    buf.resize(static_cast<size_t>(n));
    read(pos, n, buf.data());
    for (int64_t i = 0; i < n; ++i)
      NDT_CHECK(buf[i] < vocab_size, "data shard ", path_, ": token ", buf[i], " at position ", pos + i,
                " is >= model.vocab_size ", vocab_size, "; the data was made for a larger vocabulary");
  }
}

namespace {
void write_shard_bytes(const std::string& path, int32_t magic, int32_t version, int64_t ntok,
                       const void* tokens, int64_t width) {
  NDT_CHECK(ntok < (int64_t(1) << 31), "write_shard: ", ntok, " tokens do not fit in one shard");
  int32_t header[kHeaderInts] = {};
  header[0] = magic;
  header[1] = version;
  header[2] = static_cast<int32_t>(ntok);
  io::write_file_atomic(path, {{reinterpret_cast<const char*>(header), sizeof(header)},
                               {static_cast<const char*>(tokens), static_cast<size_t>(ntok * width)}});
}
}  // namespace

void write_shard(const std::string& path, const std::vector<uint16_t>& tokens) {
  write_shard_bytes(path, kShardMagic, kShardVersion, static_cast<int64_t>(tokens.size()), tokens.data(), 2);
}

void write_shard(const std::string& path, const std::vector<uint32_t>& tokens, ShardFormat format) {
  if (format == ShardFormat::u32) {
    write_shard_bytes(path, kShardMagic32, kShardVersion32, static_cast<int64_t>(tokens.size()),
                      tokens.data(), 4);
    return;
  }
  std::vector<uint16_t> narrow(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    NDT_CHECK(tokens[i] <= 0xFFFF, "write_shard ", path, ": token ", tokens[i], " at position ", i,
              " does not fit a uint16 shard; write it as uint32 (Llama 3's format)");
    narrow[i] = static_cast<uint16_t>(tokens[i]);
  }
  write_shard(path, narrow);
}

ShardFormat shard_format_for(const std::vector<uint32_t>& tokens) {
  for (uint32_t t : tokens)
    if (t > 0xFFFF) return ShardFormat::u32;
  return ShardFormat::u16;
}

std::vector<std::string> glob_paths(const std::string& pattern) {
  glob_t g{};
  const int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
  std::vector<std::string> out;
  if (rc == 0)
    for (size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
  globfree(&g);
  NDT_CHECK(!out.empty(), "no data files match '", pattern,
            "'; check the path (prepare shards with prepare_text)");
  std::sort(out.begin(), out.end());
  return out;
}

// A sidecar file, read with pread like the shards: exactly one byte per token of its shard.
struct DataLoader::ByteFile {
  std::string path;
  int fd = -1;
  int64_t bytes = 0;
  ByteFile(const std::string& p, int64_t want) : path(p) {
    fd = ::open(p.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    NDT_CHECK(fd >= 0, "data file ", p, ": cannot open (", std::strerror(errno),
              "); its preparation lists it: prepare the folder again with prepare_text --overwrite");
    struct stat st {};
    if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) bytes = st.st_size;
    if (bytes != want) ::close(fd);
    NDT_CHECK(bytes == want, "data file ", p, " has ", bytes, " bytes but its shard has ", want,
              " tokens (one byte each): it was replaced or truncated; prepare the folder again with "
              "prepare_text --overwrite");
  }
  ~ByteFile() { ::close(fd); }
  void read(int64_t pos, int64_t n, uint8_t* out) const {
    for (int64_t done = 0; done < n;) {
      const ssize_t r = ::pread(fd, out + done, static_cast<size_t>(n - done), pos + done);
      if (r < 0 && errno == EINTR) continue;
      NDT_CHECK(r > 0, "data file ", path, ": read failed at byte ", pos + done, " (",
                r == 0 ? "end of file: it shrank during the run" : std::strerror(errno), ")");
      done += r;
    }
  }
};

DataLoader::~DataLoader() = default;

void DataLoader::open_sidecars(const Preparation& prep, const std::string& shard_path, int64_t tokens) {
  const std::string name = std::filesystem::path(shard_path).filename().string();
  const ShardSidecars* sc = prep.sidecars_of(name);
  if (!sc) return;
  NDT_CHECK(sc->bytes == tokens, "data shard ", shard_path, ": its sidecars list ", sc->bytes, " bytes for ",
            tokens, " tokens");
  const std::filesystem::path dir = std::filesystem::path(shard_path).parent_path();
  sidecars_.push_back(std::make_unique<ByteFile>((dir / sc->mask).string(), tokens));
  sidecars_.push_back(std::make_unique<ByteFile>((dir / sc->docs).string(), tokens));
}

namespace {
uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
}  // namespace

DataLoader::DataLoader(const std::string& pattern, int64_t B, int64_t T, int rank, int world, bool shuffle,
                       uint64_t seed, int64_t vocab_size)
    : pattern_(pattern),
      B_(B),
      T_(T),
      rank_(rank),
      world_(world),
      shuffle_(shuffle),
      seed_(seed),
      vocab_size_(vocab_size) {
  NDT_CHECK(B >= 1 && T >= 1, "data loader: batch size ", B, " and sequence length ", T, " must be >= 1");
  NDT_CHECK(world >= 1 && rank >= 0 && rank < world, "data loader: rank ", rank, " outside world ", world);
  // tokens consumed by one step of all ranks
  const int64_t span =
      checked_mul(checked_mul(B, T, "data loader B x T"), world, "data loader B x T x ranks");
  NDT_CHECK(span < (int64_t(1) << 40), "data loader: ", span,
            " tokens per step is more than any shard holds");
  const std::vector<std::string> paths = glob_paths(pattern);
  const std::optional<Preparation> prep = preparation_of(paths);  // one preparation's shards
  for (const std::string& p : paths) {
    shards_.push_back(std::make_unique<Shard>(p));
    const Shard& s = *shards_.back();
    const int64_t listed = prep ? prep->tokens_of(std::filesystem::path(p).filename().string()) : s.size();
    NDT_CHECK(listed == s.size(), "data shard ", p, " holds ", s.size(), " tokens but ", prep->dir, "/",
              kPreparationFile, " lists ", listed,
              ": it was replaced after prepare_text wrote it; prepare the folder again with prepare_text "
              "--overwrite");
    s.check_tokens(vocab_size);  // now, not when an evaluation reaches it hours later
    if (prep) open_sidecars(*prep, p, s.size());
    for (int64_t pos = 0; span < s.size() - pos; pos += span)
      windows_.push_back({static_cast<int32_t>(shards_.size() - 1), pos});
  }
  NDT_CHECK(sidecars_.empty() || sidecars_.size() == 2 * shards_.size(), "data '", pattern,
            "': some shards have loss masks and documents (.mask, .docs) and some not; read one "
            "preparation's shards (prepare_text makes them all alike)");
  if (has_documents()) {
    for (int32_t i = 0; i < static_cast<int32_t>(shards_.size()); ++i) scan_documents(i);
    pack_epoch();  // epoch 0's rows: every epoch packs to as many (only equal lengths trade places)
    stats_.rows = rows_.rows();
    stats_.efficiency =
        stats_.rows ? static_cast<double>(stats_.real_tokens) / static_cast<double>(stats_.rows * T) : 1.0;
    NDT_CHECK(stats_.rows >= B * world, "data '", pattern, "': its documents pack into ", stats_.rows,
              " rows of ", T, " tokens but one micro-step takes ", B * world,
              " (micro_batch_size x data-parallel ranks); lower train.micro_batch_size or use more data");
    return;
  }
  NDT_CHECK(
      !windows_.empty(), "data '", pattern, "': no shard holds one batch: ", span + 1,
      " tokens are needed (micro_batch_size x seq_len x data-parallel ranks + 1); the largest shard has ",
      [&] {
        int64_t m = 0;
        for (auto& s : shards_) m = std::max(m, s->size());
        return m;
      }(),
      "; lower train.micro_batch_size or train.seq_len, or use more data");
  build_order();
}

int64_t DataLoader::total_tokens() const {
  int64_t n = 0;
  for (auto& s : shards_) n += s->size();
  return n;
}

namespace {
// 0 .. n-1, permuted by Fisher-Yates with a counter-based generator keyed by `key` when
// `shuffle`: the same on every platform and rank.
std::vector<int64_t> seeded_order(size_t n, bool shuffle, uint64_t key) {
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  if (!shuffle) return order;
  uint64_t x = key;
  for (int64_t i = static_cast<int64_t>(n) - 1; i > 0; --i) {
    const int64_t j = static_cast<int64_t>(splitmix64(x) % static_cast<uint64_t>(i + 1));
    std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(j)]);
  }
  return order;
}
}  // namespace

void DataLoader::build_order() {
  if (has_documents()) return pack_epoch();
  order_ = seeded_order(windows_.size(), shuffle_,
                        seed_ * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(state_.epoch) + 1);
}

// Reads the shard's document starts and loss mask once: its documents (cut to rows) and how
// many of its targets are trained (token g's target, the token g + 1 of its document).
void DataLoader::scan_documents(int32_t shard) {
  const ByteFile &mask = *sidecars_[2 * shard], &docs = *sidecars_[2 * shard + 1];
  const int64_t size = shards_[shard]->size();
  std::vector<uint8_t> m, f;
  int64_t start = 0;               // of the document being read
  auto close = [&](int64_t end) {  // the document [start, end)
    const std::vector<int64_t> parts = split_lengths(end - start, T_);
    stats_.documents++, stats_.split += parts.size() > 1;
    for (int64_t len : parts) pieces_.push_back({shard, start, len}), start += len;
  };
  for (int64_t pos = 0; pos < size; pos += 1 << 20) {
    const int64_t n = std::min<int64_t>(1 << 20, size - pos);
    m.resize(n), f.resize(n);
    mask.read(pos, n, m.data());
    docs.read(pos, n, f.data());
    for (int64_t i = 0; i < n; ++i) {
      const int64_t g = pos + i;
      NDT_CHECK(m[i] <= 1 && f[i] <= 1, "data files ", mask.path, " / ", docs.path, ": byte ", g,
                " is neither 0 nor 1; the files are corrupt: prepare the folder again with prepare_text");
      if (g > 0 && f[i]) close(g);
      if (g > 0 && m[i] && !f[i]) stats_.trained_targets++;
    }
  }
  if (size > 0) close(size);
  stats_.real_tokens += size;
}

void DataLoader::pack_epoch() {
  const uint64_t key = seed_ * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(state_.epoch) + 1;
  // the pieces in stream order, or shuffled: the order equal lengths keep
  const std::vector<int64_t> perm = seeded_order(pieces_.size(), shuffle_, key);
  std::vector<int64_t> len(pieces_.size());
  for (size_t i = 0; i < perm.size(); ++i) len[i] = pieces_[perm[i]].len;
  const PackedRows packed = first_fit_decreasing(len, T_);
  // the rows in the order packed, or shuffled (another draw of the same key)
  const std::vector<int64_t> rows = seeded_order(static_cast<size_t>(packed.rows()), shuffle_, ~key);
  rows_ = PackedRows{};
  rows_.offsets.reserve(rows.size() + 1);
  rows_.items.reserve(packed.items.size());
  for (int64_t r : rows) {
    for (int64_t k = packed.offsets[r]; k < packed.offsets[r + 1]; ++k)
      rows_.items.push_back(perm[packed.items[k]]);
    rows_.offsets.push_back(static_cast<int64_t>(rows_.items.size()));
  }
}

// Row `row` of this epoch: its pieces one after another, each its own document (positions
// restart), then padding: input 0, target -1, one more document id.
void DataLoader::fill_row(int64_t row, int32_t* x, int32_t* y, int32_t* doc) const {
  int64_t t = 0;
  int32_t id = 0;
  std::vector<uint32_t> tok;
  std::vector<uint8_t> mask, first;
  for (int64_t k = rows_.offsets[row]; k < rows_.offsets[row + 1]; ++k, ++id) {
    const Piece& p = pieces_[rows_.items[k]];
    const Shard& s = *shards_[p.shard];
    const int64_t n = std::min(p.len + 1, s.size() - p.pos);  // its tokens and the next one, if any
    tok.resize(n), mask.resize(n), first.resize(n);
    s.read(p.pos, n, tok.data());
    sidecars_[2 * p.shard]->read(p.pos, n, mask.data());
    sidecars_[2 * p.shard + 1]->read(p.pos, n, first.data());
    for (int64_t i = 0; i < p.len; ++i, ++t) {
      NDT_CHECK(tok[i] < vocab_size_, "data shard ", s.path(), ": token ", tok[i], " at position ", p.pos + i,
                " is >= model.vocab_size ", vocab_size_, "; the data was made for a larger vocabulary");
      x[t] = static_cast<int32_t>(tok[i]);
      doc[t] = id;
      const bool trained = i + 1 < n && mask[i + 1] && !first[i + 1];
      y[t] = trained ? static_cast<int32_t>(tok[i + 1]) : -1;
    }
  }
  for (; t < T_; ++t) x[t] = 0, y[t] = -1, doc[t] = id;
}

Batch DataLoader::next_packed() {
  const int64_t first_row = state_.window++ * B_ * world_ + static_cast<int64_t>(rank_) * B_;
  std::vector<int32_t> x(B_ * T_), y(B_ * T_), doc(B_ * T_);
  for (int64_t b = 0; b < B_; ++b) fill_row(first_row + b, &x[b * T_], &y[b * T_], &doc[b * T_]);
  return {Tensor::from_vector(x, {B_, T_}), Tensor::from_vector(y, {B_, T_}),
          Tensor::from_vector(doc, {B_, T_})};
}

void DataLoader::set_grad_accum(int64_t accum) {
  NDT_CHECK(accum >= 1, "data loader: ", accum, " micro-steps per step; must be >= 1");
  if (!has_documents()) return;
  NDT_CHECK(stats_.rows >= B_ * world_ * accum, "data '", pattern_, "': its documents pack into ",
            stats_.rows, " rows of ", T_, " tokens but one step takes ", B_ * world_ * accum,
            " (micro_batch_size x grad_accum_steps x data-parallel ranks); lower them or use more data");
  accum_ = accum;
}

std::string DataLoader::packing_key() const {
  return "seq_len " + std::to_string(T_) +
         (shuffle_ ? ", seed " + std::to_string(seed_) + ", shuffled" : ", stream order");
}

void DataLoader::restore(const LoaderState& s) {
  NDT_CHECK(s.window >= 0 && s.window <= windows_per_epoch() && s.epoch >= 0,
            "data loader: saved position (epoch ", s.epoch, ", window ", s.window,
            ") does not fit the data (", windows_per_epoch(),
            " windows per epoch); was the data or batch size changed?");
  state_ = s;
  build_order();
}

Batch DataLoader::next() {
  if (state_.window >= windows_per_epoch()) {
    state_.epoch++;
    state_.window = 0;
    build_order();
  }
  if (has_documents()) return next_packed();
  const Window& w = windows_[order_[state_.window++]];
  const Shard& s = *shards_[w.shard];
  const int64_t start = w.pos + static_cast<int64_t>(rank_) * B_ * T_;
  std::vector<uint32_t> tok(static_cast<size_t>(B_ * T_ + 1));
  s.read(start, B_ * T_ + 1, tok.data());
  std::vector<int32_t> x(B_ * T_), y(B_ * T_);
  for (int64_t i = 0; i <= B_ * T_; ++i)
    NDT_CHECK(tok[i] < vocab_size_, "data shard ", s.path(), ": token ", tok[i], " at position ", start + i,
              " is >= model.vocab_size ", vocab_size_, "; the data was made for a larger vocabulary");
  for (int64_t i = 0; i < B_ * T_; ++i) {
    x[i] = static_cast<int32_t>(tok[i]);
    y[i] = static_cast<int32_t>(tok[i + 1]);
  }
  return {Tensor::from_vector(x, {B_, T_}), Tensor::from_vector(y, {B_, T_}), Tensor()};
}

LoaderState continue_position(const LoaderState& saved, const std::string& saved_window_tokens,
                              int64_t window_tokens, bool shuffle, std::string& note) {
  note.clear();
  int64_t old_window_tokens = window_tokens;
  if (!saved_window_tokens.empty()) {
    char* end = nullptr;
    old_window_tokens = std::strtoll(saved_window_tokens.c_str(), &end, 10);
    NDT_CHECK(*end == '\0' && old_window_tokens >= 1, "its window_tokens '", saved_window_tokens,
              "' is not a positive number; the checkpoint is damaged: resume from an earlier one");
  }
  if (old_window_tokens == window_tokens) return saved;
  const int64_t pos = checked_mul(saved.window, old_window_tokens, "the checkpoint's data position");
  LoaderState s = saved;
  s.window = pos / window_tokens;
  note = "the checkpoint read " + std::to_string(old_window_tokens) +
         " tokens per micro-step, this run reads " + std::to_string(window_tokens) +
         "; the data continues at token " + std::to_string(s.window * window_tokens) + " of epoch " +
         std::to_string(s.epoch) + (pos % window_tokens ? " (rounded down)" : "") +
         (shuffle ? ", but data.shuffle orders windows of the new size differently" : "");
  return s;
}

LoaderState continue_packed(const LoaderState& saved, const std::map<std::string, std::string>& extra,
                            int64_t rows_per_micro_step, const std::string& packing_key, std::string& note) {
  note.clear();
  const auto rows_it = extra.find("loader_rows"), key_it = extra.find("loader_packing");
  if (rows_it == extra.end()) {
    note =
        "the checkpoint has no packed-rows position (a run that read windows of the token stream); "
        "this run packs whole documents and continues at micro-step " +
        std::to_string(saved.window) + " of epoch " + std::to_string(saved.epoch);
    return saved;
  }
  char* end = nullptr;
  const int64_t rows = std::strtoll(rows_it->second.c_str(), &end, 10);
  NDT_CHECK(!rows_it->second.empty() && *end == '\0' && rows >= 0, "its loader_rows '", rows_it->second,
            "' is not a number >= 0; the checkpoint is damaged: resume from an earlier one");
  LoaderState s{saved.epoch, rows / rows_per_micro_step};
  if (key_it != extra.end() && key_it->second != packing_key)
    note = "the checkpoint's rows were packed with " + key_it->second + ", this run's with " + packing_key +
           ": the data continues at row " + std::to_string(s.window * rows_per_micro_step) + " of epoch " +
           std::to_string(s.epoch) + " of other rows";
  else if (rows % rows_per_micro_step)
    note = "the checkpoint had read " + std::to_string(rows) + " rows of epoch " + std::to_string(s.epoch) +
           ", not a multiple of this run's " + std::to_string(rows_per_micro_step) +
           " per micro-step; the data continues at row " + std::to_string(s.window * rows_per_micro_step) +
           " (rounded down)";
  return s;
}

std::map<std::string, std::string> loader_extra(const DataLoader& train, const LoaderState& at,
                                                int64_t rows_per_micro_step, int64_t window_tokens) {
  std::map<std::string, std::string> extra = {{"window_tokens", std::to_string(window_tokens)}};
  if (train.has_documents()) {  // packed rows: how many of the epoch's were read, and how packed
    extra["loader_rows"] = std::to_string(at.window * rows_per_micro_step);
    extra["loader_packing"] = train.packing_key();
  }
  return extra;
}

LoaderState continue_loader(const DataLoader& train, const LoaderState& saved,
                            const std::map<std::string, std::string>& extra, int64_t rows_per_micro_step,
                            int64_t window_tokens, bool shuffle, std::string& note) {
  // the loader counts windows of micro_batch_size x dp sequences: with another global
  // micro-batch, the same tokens are at another window number (packed: rows)
  if (train.has_documents())
    return continue_packed(saved, extra, rows_per_micro_step, train.packing_key(), note);
  const auto it = extra.find("window_tokens");
  return continue_position(saved, it == extra.end() ? "" : it->second, window_tokens, shuffle, note);
}

std::string packing_line(const PackingStats& p, int64_t rows_per_step, int64_t seq_len) {
  const int64_t left = p.rows % rows_per_step;
  const double trained_per_step = static_cast<double>(p.trained_targets) / static_cast<double>(p.rows) *
                                  static_cast<double>(rows_per_step);
  char pct[32];
  std::snprintf(pct, sizeof(pct), "%.1f%%", 100.0 * p.efficiency);
  return "packing: " + std::to_string(p.documents) + " documents (" + std::to_string(p.split) +
         " longer than a row, cut into row-sized pieces) in " + std::to_string(p.rows) + " rows of " +
         std::to_string(seq_len) + " per epoch" +
         (left ? " (" + std::to_string(left) + " left out each epoch: a step takes " +
                     std::to_string(rows_per_step) + ")"
               : "") +
         ", efficiency " + pct + " (real tokens / row positions), " +
         std::to_string(std::llround(trained_per_step)) + " trained tokens per step (mean)";
}

}  // namespace ndt::data
