// ndtrain: token shards and the data loader.
//
// A shard is one of llm.c's two formats, so shards prepared for llm.c work as they are:
//   int32 header[256]: header[0] = magic, header[1] = version, header[2] = number of tokens,
//   then that many tokens, little-endian:
//     GPT-2's   magic 20240520, version 1: uint16 tokens (vocabularies up to 65,536)
//     Llama 3's magic 20240801, version 7: uint32 tokens (Llama 3's 128,256, Qwen2's 151,936)
// Shards are read with pread (no memory map: a shard truncated under a running job is an
// error, not a SIGBUS) and validated on open: a regular file, magic, version, exact file
// size, and, by the loader, every token < vocab_size. A shard that changes size during a
// run is an error at the next read.
//
// The loader cuts the token stream into windows of B*T+1 tokens (inputs are the first B*T,
// targets the same shifted by one). With shuffle off, micro-batch k of a single-process run
// starts at token k*B*T; when the next batch does not fit in a shard it moves to the next
// shard, and after the last one back to the first (a new epoch). With `world` data-parallel
// ranks, the ranks take consecutive windows: rank r reads at pos + r*B*T and the position
// advances by world*B*T. With shuffle on, the order of the windows is a seeded permutation,
// new every epoch. The position (epoch, window) is saved in checkpoints.
//
// Documents and loss masks: when the preparation lists a shard's .mask and .docs files
// (train/data/preparation.h; prepare_text writes them for .jsonl input), a window's target is
// -1 (not trained: cross_entropy's ignore_index) where the target token is not trained and
// where it is the first token of the next document (a document's last token does not predict
// the next one's first), and Batch::docs numbers the documents within each row from 0 (a
// window cuts documents at its edges: each piece is a document). Without them docs is
// undefined and every target is trained, as for llm.c's shards.
//
//   data::DataLoader train("data/train_*.bin", /*B=*/8, /*T=*/128, /*rank=*/0, /*world=*/1,
//                          /*shuffle=*/false, /*seed=*/0, /*vocab_size=*/256);
//   data::Batch b = train.next();   // b.inputs, b.targets (B, T) int32 on the CPU (b.docs too,
//                                   // when the shards have documents)
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace ndt::data {

constexpr int32_t kShardMagic = 20240520;  // GPT-2's format: uint16 tokens
constexpr int32_t kShardVersion = 1;
constexpr int32_t kShardMagic32 = 20240801;  // Llama 3's format: uint32 tokens
constexpr int32_t kShardVersion32 = 7;
constexpr int64_t kHeaderInts = 256;

enum class ShardFormat { u16, u32 };
struct Preparation;  // train/data/preparation.h

// One open shard.
class Shard {
 public:
  explicit Shard(const std::string& path);  // throws ndt::Error naming the file and the problem
  ~Shard();
  Shard(const Shard&) = delete;
  Shard& operator=(const Shard&) = delete;
  const std::string& path() const { return path_; }
  int64_t size() const { return ntok_; }
  ShardFormat format() const { return width_ == 2 ? ShardFormat::u16 : ShardFormat::u32; }
  // Copies tokens [pos, pos + n) into `out`; throws if the file changed (its size or its
  // modification time) since it was opened, or a read fails.
  void read(int64_t pos, int64_t n, uint32_t* out) const;
  // Throws naming the first token >= vocab_size and its position.
  void check_tokens(int64_t vocab_size) const;

 private:
  std::string path_;
  int fd_ = -1;
  int64_t bytes_ = 0;
  int64_t mtime_ns_ = 0;  // the modification time at open
  int64_t ntok_ = 0;
  int64_t width_ = 2;  // bytes per token
};

// Writes a shard atomically (a temporary file beside it, then rename), in GPT-2's format;
// the second form in the format given (u16: throws naming a token that does not fit).
void write_shard(const std::string& path, const std::vector<uint16_t>& tokens);
void write_shard(const std::string& path, const std::vector<uint32_t>& tokens, ShardFormat format);
// u16 when every token fits 16 bits, else u32.
ShardFormat shard_format_for(const std::vector<uint32_t>& tokens);

// Sorted paths matching a glob pattern; throws if none match.
std::vector<std::string> glob_paths(const std::string& pattern);

struct Batch {
  Tensor inputs;   // (B, T) int32
  Tensor targets;  // (B, T) int32; -1: not trained
  Tensor docs;     // (B, T) int32 document ids within each row (non-decreasing); undefined: one per row
};

struct LoaderState {
  int64_t epoch = 0;
  int64_t window = 0;  // index of the next window in this epoch's order
};

// Where a run that reads window_tokens per micro-step (micro_batch_size x dp sequences of
// seq_len) continues from a position saved by a run that read saved_window_tokens (as the
// checkpoint wrote it; "": the same): the window that starts at the same token of the same
// epoch, rounded down. `note` gets a line for the user when the size changed ("" when not).
// Throws ndt::Error when the saved value is not a positive number.
LoaderState continue_position(const LoaderState& saved, const std::string& saved_window_tokens,
                              int64_t window_tokens, bool shuffle, std::string& note);

class DataLoader {
 public:
  DataLoader(const std::string& pattern, int64_t B, int64_t T, int rank, int world, bool shuffle,
             uint64_t seed, int64_t vocab_size);
  ~DataLoader();
  Batch next();
  // Whether the shards carry loss masks and document starts (then every Batch has docs).
  bool has_documents() const { return !sidecars_.empty(); }
  LoaderState state() const { return state_; }
  void restore(const LoaderState& s);
  void reset() { restore({}); }
  int64_t windows_per_epoch() const { return static_cast<int64_t>(windows_.size()); }
  int64_t total_tokens() const;
  const std::string& pattern() const { return pattern_; }

 private:
  struct Window {
    int32_t shard;
    int64_t pos;  // first token of rank 0's part
  };
  struct ByteFile;     // a sidecar: one byte per token of its shard
  void build_order();  // this epoch's window order
  void open_sidecars(const Preparation& prep, const std::string& shard_path, int64_t tokens);
  // docs and the -1 targets of a window whose tokens [start, start + B*T] come from shard `shard`
  Tensor mask_window(int32_t shard, int64_t start, std::vector<int32_t>& y) const;

  std::string pattern_;
  int64_t B_, T_;
  int rank_, world_;
  bool shuffle_;
  uint64_t seed_;
  int64_t vocab_size_;
  std::vector<std::unique_ptr<Shard>> shards_;
  std::vector<std::unique_ptr<ByteFile>> sidecars_;  // mask, docs of shard i at 2i, 2i+1; empty: none
  std::vector<Window> windows_;                      // in stream order
  std::vector<int64_t> order_;                       // this epoch's permutation of windows_
  LoaderState state_;
};

}  // namespace ndt::data
