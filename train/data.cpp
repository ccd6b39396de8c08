#include "train/data.h"

#include "train/files.h"

#include <fcntl.h>
#include <glob.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <numeric>

namespace ndt::data {

Shard::Shard(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  NDT_CHECK(fd >= 0, "data shard ", path, ": cannot open (", std::strerror(errno), ")");
  struct stat st {};
  ::fstat(fd, &st);
  const int64_t bytes = st.st_size;
  if (bytes < kHeaderInts * 4) {
    ::close(fd);
    NDT_FAIL("data shard ", path, ": ", bytes,
             " bytes is too short for the 1024-byte header; is it a token shard?");
  }
  map_ = ::mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  NDT_CHECK(map_ != MAP_FAILED, "data shard ", path, ": mmap failed (", std::strerror(errno), ")");
  map_bytes_ = bytes;
  const int32_t* h = static_cast<const int32_t*>(map_);
  const int32_t magic = h[0], version = h[1];
  ntok_ = h[2];
  std::string err;
  if (magic != kShardMagic)
    err = "bad magic " + std::to_string(magic) + " (expected " + std::to_string(kShardMagic) +
          "); make shards with prepare_text or llm.c's scripts";
  else if (version != kShardVersion)
    err = "unsupported version " + std::to_string(version) + " (expected 1: uint16 tokens)";
  else if (ntok_ < 0 || bytes != kHeaderInts * 4 + 2 * ntok_)
    err = "header says " + std::to_string(ntok_) + " tokens (" + std::to_string(kHeaderInts * 4 + 2 * ntok_) +
          " bytes) but the file has " + std::to_string(bytes) + " bytes; the file is truncated or corrupt";
  if (!err.empty()) {
    ::munmap(map_, map_bytes_);
    map_ = nullptr;
    NDT_FAIL("data shard ", path, ": ", err);
  }
  tokens_ = reinterpret_cast<const uint16_t*>(static_cast<const char*>(map_) + kHeaderInts * 4);
}

Shard::~Shard() {
  if (map_) ::munmap(map_, map_bytes_);
}

void write_shard(const std::string& path, const std::vector<uint16_t>& tokens) {
  NDT_CHECK(tokens.size() < (1ull << 31), "write_shard: ", tokens.size(), " tokens do not fit in one shard");
  int32_t header[kHeaderInts] = {};
  header[0] = kShardMagic;
  header[1] = kShardVersion;
  header[2] = static_cast<int32_t>(tokens.size());
  io::write_file_atomic(path, {{reinterpret_cast<const char*>(header), sizeof(header)},
                               {reinterpret_cast<const char*>(tokens.data()), tokens.size() * 2}});
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
  const int64_t span = B * T * world;  // tokens consumed by one step of all ranks
  for (const std::string& p : glob_paths(pattern)) {
    shards_.push_back(std::make_unique<Shard>(p));
    const Shard& s = *shards_.back();
    for (int64_t pos = 0; pos + span + 1 <= s.size(); pos += span)
      windows_.push_back({static_cast<int32_t>(shards_.size() - 1), pos});
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

void DataLoader::build_order() {
  order_.resize(windows_.size());
  std::iota(order_.begin(), order_.end(), 0);
  if (!shuffle_) return;
  // Fisher-Yates with a counter-based generator keyed by (seed, epoch): the same on every
  // platform and rank.
  uint64_t x = seed_ * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(state_.epoch) + 1;
  for (int64_t i = static_cast<int64_t>(order_.size()) - 1; i > 0; --i) {
    const int64_t j = static_cast<int64_t>(splitmix64(x) % static_cast<uint64_t>(i + 1));
    std::swap(order_[i], order_[j]);
  }
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
  const Window& w = windows_[order_[state_.window++]];
  const Shard& s = *shards_[w.shard];
  const int64_t start = w.pos + static_cast<int64_t>(rank_) * B_ * T_;
  const uint16_t* tok = s.tokens() + start;
  std::vector<int32_t> x(B_ * T_), y(B_ * T_);
  for (int64_t i = 0; i <= B_ * T_; ++i)
    NDT_CHECK(tok[i] < vocab_size_, "data shard ", s.path(), ": token ", tok[i], " at position ", start + i,
              " is >= model.vocab_size ", vocab_size_, "; the data was made for a larger vocabulary");
  for (int64_t i = 0; i < B_ * T_; ++i) {
    x[i] = tok[i];
    y[i] = tok[i + 1];
  }
  return {Tensor::from_vector(x, {B_, T_}), Tensor::from_vector(y, {B_, T_})};
}

}  // namespace ndt::data
