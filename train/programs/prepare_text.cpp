// prepare_text: turn text files into token shards (llm.c's formats) plus what decodes them.
//
//   prepare_text --out data/fortunes --vocab char --val_fraction 0.05 FILE...
//   prepare_text --out data/mytext --tokenizer models/llama3 FILE...
//
// Files holding NUL bytes are skipped as binary. The last val_fraction of the tokens become
// val_000000.bin, the rest train_NNNNNN.bin shards of at most --shard_tokens tokens.
// --vocab char: one token per distinct character; byte: 256 tokens; the files are joined
// with newlines and vocab.json is written beside the shards.
// --tokenizer: a model's own tokenizer.json (or the folder holding it); each file is one
// document, starting with the tokenizer's BOS where its post-processor adds one (Llama 3) and
// with its end-of-text token otherwise (GPT-2, Qwen2), as llm.c's shards do; special tokens in
// the text are plain text unless --parse_special. The shards are uint16 (GPT-2's format) when
// every id fits and uint32 (Llama 3's) otherwise; tokenizer.json is copied beside them.
#include <boost/program_options.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "tokenizer/tokenizer.h"
#include "train/command_line.h"
#include "train/data/data.h"
#include "train/data/vocab.h"
#include "train/io/files.h"

namespace po = boost::program_options;
namespace fs = std::filesystem;
using namespace ndt;

namespace {

// The files' text: each a document (binary files skipped, with a note).
std::vector<std::string> read_documents(const std::vector<std::string>& files) {
  std::vector<std::string> docs;
  for (const std::string& f : files) {
    std::ifstream in(f, std::ios::binary);
    NDT_CHECK(in.good(), "cannot read ", f);
    std::stringstream ss;
    ss << in.rdbuf();
    std::string s = ss.str();
    if (s.find('\0') != std::string::npos) {
      std::cerr << "prepare_text: skipping " << f << " (binary)\n";
      continue;
    }
    docs.push_back(std::move(s));
  }
  return docs;
}

// The token that starts each document: BOS where the tokenizer adds one, else end-of-text.
int32_t document_separator(const tok::Tokenizer& t) {
  if (t.bos_id()) return *t.bos_id();
  if (auto eot = t.id_of("<|endoftext|>"); eot && t.is_special(*eot)) return *eot;
  NDT_CHECK(t.eos_id(), "tokenizer ", t.source(),
            ": neither a BOS (its post_processor adds none) nor an end-of-text token (<|endoftext|>, "
            "<|end_of_text|>, </s>, or tokenizer_config.json's eos_token) to separate the documents");
  return *t.eos_id();
}

// Writes the train and val shards; returns the number of train shards.
int write_shards(const std::string& out_dir, const std::vector<uint32_t>& tokens, int64_t n_train,
                 int64_t shard_tokens, data::ShardFormat format) {
  int shard = 0;
  for (int64_t s = 0; s < n_train; s += shard_tokens, ++shard) {
    char name[64];
    std::snprintf(name, sizeof(name), "train_%06d.bin", shard);
    const int64_t e = std::min(n_train, s + shard_tokens);
    data::write_shard((fs::path(out_dir) / name).string(),
                      std::vector<uint32_t>(tokens.begin() + s, tokens.begin() + e), format);
  }
  data::write_shard((fs::path(out_dir) / "val_000000.bin").string(),
                    std::vector<uint32_t>(tokens.begin() + n_train, tokens.end()), format);
  return shard;
}

// The command line's settings.
struct Options {
  std::string out_dir, kind = "char", tokenizer;
  double val_fraction = 0.05;
  int64_t shard_tokens = 100'000'000;
  int threads = 0;
  bool parse_special = false;
  std::vector<std::string> files;
};

// The command line into `o`; false when the program ends here, with `status` its exit code
// (0 after --help, 2 for an error, printed).
bool parse_options(int argc, char** argv, Options& o, int& status) {
  po::options_description opts(
      "prepare_text: text files -> token shards + what decodes them\n\nUsage: prepare_text --out DIR "
      "[options] "
      "FILE...\n\nOptions");
  opts.add_options()("help,h", "print this help")("out", po::value(&o.out_dir)->required(),
                                                  "output directory")(
      "vocab", po::value(&o.kind)->default_value(o.kind), "char or byte (a vocabulary built here)")(
      "tokenizer", po::value(&o.tokenizer),
      "a model's tokenizer.json, or the folder holding it (instead of --vocab)")(
      "parse_special", po::bool_switch(&o.parse_special),
      "with --tokenizer: special tokens written in the text are special tokens (default: plain text)")(
      "threads", po::value(&o.threads)->default_value(o.threads), "with --tokenizer: threads (0: all cores)")(
      "val_fraction", po::value(&o.val_fraction)->default_value(o.val_fraction),
      "fraction of tokens for validation (at the end)")(
      "shard_tokens", po::value(&o.shard_tokens)->default_value(o.shard_tokens), "tokens per training shard")(
      "files", po::value(&o.files), "input text files");
  po::positional_options_description pos;
  pos.add("files", -1);
  status = 0;
  try {
    po::variables_map vm;
    if (!train::parse_command_line(argc, argv, opts, pos, {}, vm)) return false;  // --help
    if (!o.tokenizer.empty() && !vm["vocab"].defaulted())
      throw po::error("--tokenizer and --vocab exclude each other: give one");
    if (o.kind != "char" && o.kind != "byte")
      throw po::error("--vocab must be char or byte, got '" + o.kind + "'");
    if (o.files.empty()) throw po::error("no input files");
    if (!(o.val_fraction > 0 && o.val_fraction < 1)) throw po::error("--val_fraction must be in (0, 1)");
    if (o.shard_tokens < 1 || o.shard_tokens >= (int64_t(1) << 31))
      throw po::error("--shard_tokens must be in [1, 2^31)");
    if (o.threads < 0) throw po::error("--threads must be >= 0");
  } catch (const std::exception& e) {  // the command line's errors and the checks above
    std::cerr << "prepare_text: error: " << e.what() << " (see --help)\n";
    status = 2;
    return false;
  }
  return true;
}

// The corpus as one stream of tokens, and a line saying what made them.
struct Tokens {
  std::vector<uint32_t> ids;
  std::string what;
};

// --tokenizer: each document after its separator; tokenizer.json is copied into the output.
Tokens tokenize_with_model(const Options& o, const std::vector<std::string>& docs) {
  Tokens tokens;
  const tok::Tokenizer t = tok::Tokenizer::from_file(o.tokenizer);
  const int32_t sep = document_separator(t);
  tok::EncodeOptions opt;
  opt.parse_special = o.parse_special;
  opt.threads = o.threads;
  const std::vector<std::vector<int32_t>> ids =
      t.encode_batch(std::vector<std::string_view>(docs.begin(), docs.end()), opt);
  for (const auto& d : ids) {
    tokens.ids.push_back(static_cast<uint32_t>(sep));
    tokens.ids.insert(tokens.ids.end(), d.begin(), d.end());
  }
  tokens.what = "tokenizer " + t.source() + ": vocabulary of " + std::to_string(t.vocab_size()) +
                " (model.vocab_size at least that); each document starts with " + t.token_bytes(sep) +
                " (id " + std::to_string(sep) + ")";
  fs::create_directories(o.out_dir);
  std::ifstream in(t.source(), std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  io::write_file_atomic((fs::path(o.out_dir) / "tokenizer.json").string(), ss.str());
  return tokens;
}

// --vocab: the documents joined with newlines, one token per character or byte; vocab.json
// is written into the output.
Tokens tokenize_with_vocab(const Options& o, const std::vector<std::string>& docs) {
  Tokens tokens;
  std::string text;
  for (const std::string& d : docs) {
    if (!text.empty() && text.back() != '\n') text += '\n';
    text += d;
  }
  data::Vocab vocab = o.kind == "char" ? data::Vocab::build_char(text) : data::Vocab::byte_level();
  for (uint16_t id : vocab.encode(text)) tokens.ids.push_back(id);
  fs::create_directories(o.out_dir);
  vocab.save((fs::path(o.out_dir) / "vocab.json").string());
  tokens.what = o.kind + " vocab of " + std::to_string(vocab.size());
  return tokens;
}

// What prepare did, for the report.
struct Summary {
  size_t files = 0, bytes = 0;
  int64_t tokens = 0, n_train = 0, n_val = 0;
  int shards = 0;
  data::ShardFormat format = data::ShardFormat::u16;
  std::string what;
};

// Reads, tokenizes and writes the shards.
Summary prepare(const Options& o) {
  std::vector<std::string> docs = read_documents(o.files);
  size_t bytes = 0;
  for (const std::string& d : docs) bytes += d.size();
  NDT_CHECK(bytes > 0, "the input files hold no text");
  const Tokens tokens = o.tokenizer.empty() ? tokenize_with_vocab(o, docs) : tokenize_with_model(o, docs);
  const int64_t n_val =
      std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(tokens.ids.size()) * o.val_fraction));
  const int64_t n_train = static_cast<int64_t>(tokens.ids.size()) - n_val;
  NDT_CHECK(n_train > 0, "too little text for a train/val split");
  const data::ShardFormat format = data::shard_format_for(tokens.ids);
  const int shards = write_shards(o.out_dir, tokens.ids, n_train, o.shard_tokens, format);
  return {docs.size(), bytes,      static_cast<int64_t>(tokens.ids.size()), n_train, n_val, shards,
          format,      tokens.what};
}

void report(const Options& o, const Summary& s) {
  std::cout << "prepare_text: " << s.what << "\n"
            << "prepare_text: " << s.files << " files, " << s.bytes << " bytes -> " << s.tokens
            << " tokens: " << s.n_train << " train in " << s.shards << " shard(s), " << s.n_val << " val, "
            << (s.format == data::ShardFormat::u16 ? "uint16 (GPT-2's format)" : "uint32 (Llama 3's format)")
            << ", in " << o.out_dir << "\n";
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  int status = 0;
  if (!parse_options(argc, argv, o, status)) return status;
  try {
    report(o, prepare(o));
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "prepare_text: error: " << e.what() << "\n";
    return 1;
  }
}
