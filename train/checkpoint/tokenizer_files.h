// ndtrain: the tokenizer a run trains with, carried by its checkpoints into the Hugging Face
// folders export_weights writes, so that an export is a whole model folder.
//
// A checkpoint's step folder holds, beside its weights, copies of
//   tokenizer.json or vocab.json    the vocabulary the run trains with (data::vocabulary_path:
//                                   a model's tokenizer.json, or prepare_text's char or byte
//                                   vocab.json)
//   tokenizer_config.json, special_tokens_map.json, generation_config.json, chat_template.jinja
//                                   those beside the run's tokenizer.json (a model folder's, or
//                                   the copies prepare_text keeps with its shards), and those of
//                                   the Hugging Face folder the run started from
//                                   (model.init_from), when the run trains with that folder's
//                                   own tokenizer (its tokenizer.json, byte for byte)
// and checkpoint.json's "tokenizer" object says what they are:
//   {"vocabulary": "tokenizer.json",
//    "files": {"tokenizer.json": {"bytes": 2104, "xxh64": "..."}, ...},
//    "bos_token_id": 1, "eos_token_id": [2], "pad_token_id": 0}     <- each only when known
// The ids are those of model.init_from's config.json (or of the checkpoint it started from).
// Every file is checked against its size and checksum before it is used; a checkpoint
// without the object (written by an older ndtrain) carries nothing.
//
//   ckpt::TokenizerFiles t = ckpt::run_tokenizer(codec.source(), &init_from, &note);  // rank 0
//   state.tokenizer = t;                                    // save_checkpoint / save_sharded write it
//   ckpt::TokenizerFiles back = ckpt::read_tokenizer_files(step_dir);           // checked
//   ckpt::export_tokenizer(back, writer, hf_config, std::cerr);                // into an export
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace ndt::io {
struct HfConfig;
class HfFolderWriter;
}  // namespace ndt::io

namespace ndt::ckpt {

struct WeightSource;  // train/checkpoint/load.h

struct TokenizerFiles {
  std::map<std::string, std::string> files;  // file name in the step folder -> its bytes
  std::string vocabulary;                    // which of them is the vocabulary ("" when none)
  std::optional<int64_t> bos_token_id, pad_token_id;
  std::vector<int64_t> eos_token_id;  // one id or several; empty when none is known
  bool empty() const { return files.empty(); }
  bool operator==(const TokenizerFiles&) const = default;
};

// What a run carries: the vocabulary at `vocab_file` ("" when the run has none), and, when
// the run trains with the tokenizer of model.init_from (`init`, may be null), that source's
// tokenizer files and special ids. Why a source's files are not carried goes to *note.
TokenizerFiles run_tokenizer(const std::string& vocab_file, const WeightSource* init, std::string* note);
// Adds to `run` what `source` (a resumed checkpoint's) has and run lacks: everything when run
// has no vocabulary, else only when both have the same vocabulary (the same bytes).
void carry_tokenizer(TokenizerFiles& run, const TokenizerFiles& source);

// Writes the files into `dir` (each atomically) and returns checkpoint.json's "tokenizer"
// object for them.
nlohmann::json write_tokenizer_files(const TokenizerFiles& t, const std::string& dir);
// The files checkpoint `dir`'s checkpoint.json lists under "tokenizer" (none: empty), each
// verified. Throws ndt::Error naming the field or file that is wrong.
TokenizerFiles read_tokenizer_files(const std::string& dir);

// Into an export: tokenizer.json (a char or byte vocab.json converted to Hugging Face's form,
// data/vocab.h), tokenizer_config.json, special_tokens_map.json, generation_config.json, and
// the special ids into `config`. What the folder lacks, and why, is one line on `note`.
void export_tokenizer(const TokenizerFiles& t, io::HfFolderWriter& w, io::HfConfig& config,
                      std::ostream& note);

}  // namespace ndt::ckpt
