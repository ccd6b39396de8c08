// ndtrain: a preparation's identity. prepare_text owns its output folder: it writes the
// shards, the vocabulary (vocab.json or tokenizer.json, with the files its model folder holds
// beside it: kBesideTokenizer) and, last, preparation.json, which names them:
//
//   {"preparation": "5f1c0e9a2b7d4c13",          <- XXH64 of the shards' tokens and the vocabulary
//    "vocabulary": "vocab.json",
//    "shards": [{"file": "train_000000.bin", "tokens": 961161}, {"file": "val_000000.bin", ...}]}
//
// A preparation of documents with loss masks (prepare_text's .jsonl input) lists two more
// files beside each shard, one byte per token each, so exactly `tokens` bytes:
//   {"file": "train_000000.bin", "tokens": 961161,
//    "mask": {"file": "train_000000.mask", "bytes": 961161},   <- 1: the token is trained, 0: not
//    "docs": {"file": "train_000000.docs", "bytes": 961161}}   <- 1: a document starts at the token
// Shards without them are read as before: one stream, every token trained.
//
// A run reads the shards of one preparation: the shards data.train and data.val match must
// all be listed in their folder's preparation.json, with the token counts it lists, and come
// from one folder's. Shards whose folder has no preparation.json (llm.c's, or those of an
// older prepare_text) carry no identity and are read as they always were, but never mixed
// with a preparation's.
//
//   std::optional<data::Preparation> p = data::preparation_of(data::glob_paths("data/x/train_*.bin"));
//   if (p) std::cout << p->dir << "/" << p->vocabulary;   // the vocabulary the shards were made with
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace ndt::data {

inline constexpr const char* kPreparationFile = "preparation.json";
// What a model folder holds beside its tokenizer.json and travels with it: into a preparation
// made with --tokenizer (so that its chat template is the shards' own), into a run's
// checkpoints and into their exports (train/checkpoint/tokenizer_files.h).
inline constexpr const char* kBesideTokenizer[] = {"tokenizer_config.json", "special_tokens_map.json",
                                                   "generation_config.json", "chat_template.jinja"};

// The loss mask and document starts beside a shard (file names in the preparation's folder).
struct ShardSidecars {
  std::string mask, docs;
  int64_t bytes = 0;  // each file's size: one byte per token
};

struct Preparation {
  std::string dir;                                      // the folder
  std::string id;                                       // 16 hex digits
  std::string vocabulary;                               // a file name in dir ("" when none)
  std::vector<std::pair<std::string, int64_t>> shards;  // file name in dir -> tokens
  std::map<std::string, ShardSidecars> sidecars;        // shard file name -> its sidecars, if any
  // The tokens listed for `file_name` (a file in dir), or -1 when it is not one of the shards.
  int64_t tokens_of(const std::string& file_name) const;
  // The sidecars listed for shard `file_name`, or nullptr when it has none.
  const ShardSidecars* sidecars_of(const std::string& file_name) const;
};

// dir/preparation.json, written atomically.
void write_preparation(const Preparation& p);
// The preparation.json of `dir`; nullopt when it has none. Throws ndt::Error naming the file
// when it is not a manifest that prepare_text wrote.
std::optional<Preparation> read_preparation(const std::string& dir);

// The files in `dir` that a preparation writes or that data globs would mix in: the shards
// (train_*.bin, val_*.bin) and their sidecars (.mask, .docs), vocab.json, tokenizer.json, preparation.json,
// and any of them left as NAME.tmp by an interrupted write. File names, sorted; none when dir does not exist.
std::vector<std::string> preparation_files(const std::string& dir);
// "preparation.json, vocab.json and 6 shards (train_000000.bin ... val_000000.bin)"
std::string describe_files(const std::vector<std::string>& names);

// The one preparation the shards at `paths` come from; nullopt when no shard's folder has a
// preparation.json. Throws ndt::Error (one line naming two shards) when they come from two
// folders' preparations, or mix a preparation's shards with shards of a folder without one,
// or when a shard is not one its folder's preparation.json lists (a leftover).
std::optional<Preparation> preparation_of(const std::vector<std::string>& paths);
// The same for the shards two globs match (train and validation data: "" matches none).
std::optional<Preparation> preparation_of(const std::string& train_glob, const std::string& val_glob);

}  // namespace ndt::data
