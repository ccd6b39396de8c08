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
// (train/data/preparation.h; prepare_text writes them for .jsonl input), the rows are packed
// from whole documents instead of windows (train/data/packing.h, Axolotl's multipack): each
// epoch, the documents of all shards (a shard's start also starts one; a document longer
// than T is cut into pieces of T) go into rows of T by first fit decreasing, equal lengths in
// stream order, or with shuffle on in an order drawn from (seed, epoch), and the rows are then
// shuffled by (seed, epoch) too. Every rank packs alike; micro-step k takes rows
// [k*B*world, (k+1)*B*world), rank r the B from k*B*world + r*B (rows that do not fill a
// micro-step at the end of an epoch are left out of it). A position's target is -1 (not
// trained: cross_entropy's ignore_index) where the target token is not trained and at a
// document's last token; Batch::docs numbers the pieces of each row from 0, and the free
// positions at a row's end are padding: input 0, target -1, and a document id of their own.
// Without sidecars docs is undefined and every target is trained, as for llm.c's shards.
//
//   data::DataLoader train("data/train_*.bin", /*B=*/8, /*T=*/128, /*rank=*/0, /*world=*/1,
//                          /*shuffle=*/false, /*seed=*/0, /*vocab_size=*/256);
//   data::Batch b = train.next();   // b.inputs, b.targets (B, T) int32 on the CPU (b.docs too,
//                                   // when the shards have documents)
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tensor/tensor.h"
#include "train/data/packing.h"

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
  int64_t window = 0;  // index of the next window (packed: micro-step) in this epoch's order
};

// Packed data: what the start line says (per epoch; every epoch packs to the same row count).
struct PackingStats {
  int64_t rows = 0;             // rows of T
  int64_t documents = 0;        // in the shards (a shard's start starts one)
  int64_t split = 0;            // of them longer than a row, cut into row-sized pieces
  int64_t real_tokens = 0;      // every token of the shards, each in one row
  int64_t trained_targets = 0;  // targets not -1 over all rows
  double efficiency = 1.0;      // real_tokens / (rows x T)
};

// Where a run that reads window_tokens per micro-step (micro_batch_size x dp sequences of
// seq_len) continues from a position saved by a run that read saved_window_tokens (as the
// checkpoint wrote it; "": the same): the window that starts at the same token of the same
// epoch, rounded down. `note` gets a line for the user when the size changed ("" when not).
// Throws ndt::Error when the saved value is not a positive number.
LoaderState continue_position(const LoaderState& saved, const std::string& saved_window_tokens,
                              int64_t window_tokens, bool shuffle, std::string& note);
// The same for packed data, from the checkpoint's extra: "loader_rows" (rows of the epoch
// consumed) and "loader_packing" (the saving loader's packing_key()); `rows_per_micro_step` is
// micro_batch_size x dp. A missing key or another packing is continued at the same micro-step
// or row, with a note. Throws ndt::Error when loader_rows is not a number >= 0.
LoaderState continue_packed(const LoaderState& saved, const std::map<std::string, std::string>& extra,
                            int64_t rows_per_micro_step, const std::string& packing_key, std::string& note);

class DataLoader;

// What a checkpoint keeps of the loader beside its position: the micro-step's tokens
// ("window_tokens", micro_batch_size x dp x seq_len) and, for packed rows, the rows of the
// epoch read ("loader_rows") and how they were packed ("loader_packing").
std::map<std::string, std::string> loader_extra(const DataLoader& train, const LoaderState& at,
                                                int64_t rows_per_micro_step, int64_t window_tokens);
// Where this run's loader continues from a checkpoint's position and loader_extra
// (continue_packed or continue_position, as the data is packed or not); `note` as they say.
LoaderState continue_loader(const DataLoader& train, const LoaderState& saved,
                            const std::map<std::string, std::string>& extra, int64_t rows_per_micro_step,
                            int64_t window_tokens, bool shuffle, std::string& note);
// train_gpt's start line for packed rows: documents, rows per epoch, what a step leaves out,
// the efficiency and the trained tokens per step.
std::string packing_line(const PackingStats& p, int64_t rows_per_step, int64_t seq_len);

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
  // micro-steps per epoch
  int64_t windows_per_epoch() const {
    return has_documents() ? rows_.rows() / (B_ * world_ * accum_) * accum_
                           : static_cast<int64_t>(windows_.size());
  }
  // Packed data: the micro-steps of one optimizer step (train.grad_accum_steps), so that an
  // epoch is whole steps and ends at the same row for every split of the same global batch.
  // Throws ndt::Error when the rows do not fill one step.
  void set_grad_accum(int64_t accum);
  // Packed data (has_documents()): the packing's figures, and what decides its rows
  // ("seq_len 128, seed 3, shuffled"): a checkpoint keeps it.
  const PackingStats& packing() const { return stats_; }
  std::string packing_key() const;
  int64_t total_tokens() const;
  const std::string& pattern() const { return pattern_; }

 private:
  struct Window {
    int32_t shard;
    int64_t pos;  // first token of rank 0's part
  };
  struct ByteFile;  // a sidecar: one byte per token of its shard
  struct Piece {    // packed: a document, or a row-sized part of one: tokens [pos, pos + len) of a shard
    int32_t shard;
    int64_t pos, len;
  };
  void build_order();                  // this epoch's window order, or its packed rows
  void pack_epoch();                   // rows_ for this epoch
  void scan_documents(int32_t shard);  // its pieces into pieces_, its figures into stats_
  void fill_row(int64_t row, int32_t* x, int32_t* y, int32_t* doc) const;  // x, y, doc (T)
  Batch next_packed();
  void open_sidecars(const Preparation& prep, const std::string& shard_path, int64_t tokens);

  std::string pattern_;
  int64_t B_, T_;
  int rank_, world_;
  int64_t accum_ = 1;  // micro-steps per step (packed data's epoch: whole steps)
  bool shuffle_;
  uint64_t seed_;
  int64_t vocab_size_;
  std::vector<std::unique_ptr<Shard>> shards_;
  std::vector<std::unique_ptr<ByteFile>> sidecars_;  // mask, docs of shard i at 2i, 2i+1; empty: none
  std::vector<Window> windows_;                      // in stream order
  std::vector<int64_t> order_;                       // this epoch's permutation of windows_
  std::vector<Piece> pieces_;                        // packed: in stream order
  PackedRows rows_;                                  // packed: this epoch's rows of pieces_, in order
  PackingStats stats_;
  LoaderState state_;
};

}  // namespace ndt::data
