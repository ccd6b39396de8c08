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
// Last comes preparation.json, the preparation's identity, naming its shards and vocabulary
// (train/data/preparation.h): train_gpt reads one preparation's shards, with its vocabulary.
// A folder that holds a preparation's files already is refused, unless --overwrite: then
// they are removed (once the text is tokenized) before the new ones are written.
//
// Fine-tuning data: .jsonl and .parquet files (with --tokenizer; a folder stands for those under
// it, a quoted pattern for those it matches), one row a document, in TRL's and
// Axolotl's formats (train/data/jsonl.h: text, prompt + completion, messages through the
// model folder's chat template). Beside each shard go NAME.mask (1 byte a token: trained or
// not) and NAME.docs (1 where a document starts), listed in preparation.json; the validation
// split falls on a document's start. Text files given with them are documents as text rows.
//   prepare_text --out data/chat --tokenizer models/qwen3 chats.jsonl [--skip_bad_rows]
// A bad row fails the preparation with one line (file:line: why) and nothing written, unless
// --skip_bad_rows, which leaves it out and counts it.
#include <algorithm>
#include <boost/program_options.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tokenizer/tokenizer.h"
#include "train/command_line.h"
#include "train/data/data.h"
#include "train/data/jsonl.h"
#include "train/data/parquet.h"
#include "train/data/preparation.h"
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

bool is_jsonl(const std::string& f) { return fs::path(f).extension() == ".jsonl"; }
bool is_parquet(const std::string& f) { return fs::path(f).extension() == ".parquet"; }
bool is_rows(const std::string& f) { return is_jsonl(f) || is_parquet(f); }

// The input files: a folder stands for the .jsonl and .parquet files under it (a dataset
// downloaded from the Hub: data/train-00000-of-00002.parquet, ...), a pattern with * ? [ for
// the files it matches (quoted, so that the shell leaves it), each in sorted order.
std::vector<std::string> expand_inputs(const std::vector<std::string>& given) {
  std::vector<std::string> files;
  for (const std::string& g : given) {
    std::vector<std::string> found;
    std::error_code ec;
    if (fs::is_directory(g, ec)) {
      for (const auto& e : fs::recursive_directory_iterator(g, ec))
        if (e.is_regular_file() && is_rows(e.path().string())) found.push_back(e.path().string());
      NDT_CHECK(!found.empty(), g, " is a folder without .jsonl or .parquet files");
    } else if (g.find_first_of("*?[") != std::string::npos && !fs::exists(g, ec)) {
      found = data::glob_paths(g);
      NDT_CHECK(!found.empty(), "no file matches ", g);
    } else {
      found.push_back(g);
    }
    std::sort(found.begin(), found.end());
    files.insert(files.end(), found.begin(), found.end());
  }
  return files;
}

// A shard's sidecar names: train_000000.bin -> train_000000.mask, train_000000.docs.
std::string sidecar_name(const std::string& shard, const char* ext) {
  return fs::path(shard).replace_extension(ext).string();
}

// A shard to write: its name and its tokens [begin, end) of the stream.
struct ShardSpan {
  std::string name;
  int64_t begin, end;
};

// train_NNNNNN.bin of at most shard_tokens each up to n_train, then val_000000.bin to the end.
std::vector<ShardSpan> shard_plan(int64_t n_tokens, int64_t n_train, int64_t shard_tokens) {
  std::vector<ShardSpan> plan;
  for (int64_t s = 0; s < n_train; s += shard_tokens) {
    char name[64];
    std::snprintf(name, sizeof(name), "train_%06zu.bin", plan.size());
    plan.push_back({name, s, std::min(n_train, s + shard_tokens)});
  }
  plan.push_back({"val_000000.bin", n_train, n_tokens});
  return plan;
}

// The preparation's identity: XXH64 over each shard's name and tokens, and the vocabulary's.
// With documents, each shard's mask and document starts too.
std::string preparation_id(const std::vector<uint32_t>& tokens, const std::vector<uint8_t>& mask,
                           const std::vector<uint8_t>& first, const std::vector<ShardSpan>& plan,
                           const std::string& vocab_name, const std::string& vocab_bytes) {
  std::string digest;
  for (const ShardSpan& s : plan) {
    const size_t n = static_cast<size_t>(s.end - s.begin);
    digest += s.name + ":" + io::hex64(io::xxh64(tokens.data() + s.begin, n * 4)) + ";";
    if (!mask.empty())
      digest +=
          io::hex64(io::xxh64(mask.data() + s.begin, n)) + io::hex64(io::xxh64(first.data() + s.begin, n));
  }
  digest += vocab_name + ":" + io::hex64(io::xxh64(vocab_bytes.data(), vocab_bytes.size()));
  return io::hex64(io::xxh64(digest.data(), digest.size()));
}

// The command line's settings.
struct Options {
  std::string out_dir, kind = "char", tokenizer;
  double val_fraction = 0.05;
  int64_t shard_tokens = 100'000'000;
  int threads = 0;
  bool parse_special = false, overwrite = false, skip_bad_rows = false;
  data::JsonlOptions jsonl;
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
      "text_field", po::value(&o.jsonl.text_field)->default_value(o.jsonl.text_field),
      "rows: the field of a document, all trained")(
      "prompt_field", po::value(&o.jsonl.prompt_field)->default_value(o.jsonl.prompt_field),
      "rows: the field of a prompt (not trained)")(
      "completion_field", po::value(&o.jsonl.completion_field)->default_value(o.jsonl.completion_field),
      "rows: the field of a prompt's completion (trained, then the eos)")(
      "messages_field", po::value(&o.jsonl.messages_field)->default_value(o.jsonl.messages_field),
      "rows: the field of a conversation [{role, content}] (the assistant's turns trained)")(
      "train_on_all", po::bool_switch(&o.jsonl.train_on_all),
      "rows: train on every token (prompts and the chat template's text too)")(
      "skip_bad_rows", po::bool_switch(&o.skip_bad_rows),
      "rows: leave out bad rows and count them (default: a bad row fails the preparation)")(
      "overwrite", po::bool_switch(&o.overwrite),
      "replace the preparation the output directory holds (its shards, vocab.json, tokenizer.json, "
      "preparation.json); without it such a directory is refused")("files", po::value(&o.files),
                                                                   "input text files");
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
    o.files = expand_inputs(o.files);
    for (const std::string& f : o.files)
      if (is_rows(f) && o.tokenizer.empty())
        throw po::error(f + " holds rows (" + fs::path(f).extension().string() +
                        "): they need a model's tokenizer: give --tokenizer DIR");
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
  std::vector<uint8_t> mask, first;  // with documents: per token trained, starts a document
  std::string what;
  std::string vocab_name, vocab_bytes;        // the vocabulary file to write beside the shards
  std::map<std::string, std::string> beside;  // a tokenizer.json's companions (chat template, ...)
};

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  NDT_CHECK(in.good() || in.eof(), "cannot read ", path.string());
  return ss.str();
}

// The tokenizer.json the shards were made with, to be written beside them, with the files its
// folder holds beside it (tokenizer_config.json and its chat template, ...): the shards' own,
// which a run's checkpoints carry on into generate --chat and the exports.
void keep_tokenizer_file(const tok::Tokenizer& t, Tokens& tokens) {
  tokens.vocab_name = "tokenizer.json";
  tokens.vocab_bytes = read_file(t.source());
  const fs::path dir = fs::path(t.source()).parent_path();
  std::error_code ec;
  for (const char* name : data::kBesideTokenizer)
    if (fs::is_regular_file(dir / name, ec)) tokens.beside[name] = read_file(dir / name);
}

// --tokenizer: each document after its separator; tokenizer.json goes into the output.
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
  keep_tokenizer_file(t, tokens);
  return tokens;
}

// --vocab: the documents joined with newlines, one token per character or byte; vocab.json
// goes into the output.
Tokens tokenize_with_vocab(const Options& o, const std::vector<std::string>& docs) {
  Tokens tokens;
  std::string text;
  for (const std::string& d : docs) {
    if (!text.empty() && text.back() != '\n') text += '\n';
    text += d;
  }
  data::Vocab vocab = o.kind == "char" ? data::Vocab::build_char(text) : data::Vocab::byte_level();
  for (uint16_t id : vocab.encode(text)) tokens.ids.push_back(id);
  tokens.vocab_name = "vocab.json";
  tokens.vocab_bytes = vocab.to_json();
  tokens.what = o.kind + " vocab of " + std::to_string(vocab.size());
  return tokens;
}

// A document's tokens after the stream's: it starts there, its tokens trained as it says.
void append_document(const data::Document& d, Tokens& t) {
  for (size_t i = 0; i < d.ids.size(); ++i) {
    t.ids.push_back(static_cast<uint32_t>(d.ids[i]));
    t.mask.push_back(d.trained[i]);
    t.first.push_back(i == 0 ? 1 : 0);
  }
}

// The rows of a .jsonl or .parquet file (a text file: one text row) after the stream's. A bad
// row throws one line naming the file, line (or row) and reason; with --skip_bad_rows it is
// counted in `skipped` (and the first one's line kept in `first_bad`) instead.
void read_rows(const Options& o, const data::JsonlReader& reader, const std::string& file, Tokens& t,
               int64_t& skipped, std::string& first_bad) {
  auto take = [&](const std::string& where, const auto& read) {
    data::Document d;
    try {
      d = read();
    } catch (const data::BadRow& e) {
      const std::string line = file + where + ": bad row: " + e.what();
      NDT_CHECK(o.skip_bad_rows, line, " (fix the row, or leave bad rows out with --skip_bad_rows)");
      if (skipped++ == 0) first_bad = line;
      return;
    }
    append_document(d, t);
  };
  if (is_parquet(file)) {
    const data::JsonlOptions& f = o.jsonl;
    data::for_each_parquet_row(file, {f.messages_field, f.prompt_field, f.completion_field, f.text_field},
                               [&](int64_t n, const nlohmann::json& row) {
                                 take(": row " + std::to_string(n), [&] { return reader.row(row); });
                               });
    return;
  }
  std::ifstream in(file, std::ios::binary);
  NDT_CHECK(in.good(), "cannot read ", file);
  if (!is_jsonl(file)) {
    std::stringstream ss;
    ss << in.rdbuf();
    append_document(reader.text_row(ss.str()), t);
    return;
  }
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n)
    take(":" + std::to_string(n), [&] { return reader.row(std::string_view(line)); });
}

// --tokenizer with .jsonl or .parquet files: documents with their loss masks; tokenizer.json goes into
// the output.
Tokens tokenize_documents(const Options& o, std::string& skipped_note) {
  Tokens tokens;
  const tok::Tokenizer t = tok::Tokenizer::from_file(o.tokenizer);
  const data::JsonlReader reader(t, o.tokenizer, o.jsonl);
  int64_t skipped = 0;
  std::string first_bad;
  for (const std::string& f : o.files) read_rows(o, reader, f, tokens, skipped, first_bad);
  if (skipped)
    skipped_note =
        "--skip_bad_rows: skipped " + std::to_string(skipped) + " bad row(s); the first: " + first_bad;
  int64_t docs = 0, trained = 0;
  for (size_t i = 0; i < tokens.ids.size(); ++i) docs += tokens.first[i], trained += tokens.mask[i];
  tokens.what = "tokenizer " + t.source() + ": vocabulary of " + std::to_string(t.vocab_size()) +
                " (model.vocab_size at least that); " + std::to_string(docs) + " documents, " +
                std::to_string(trained) + " of their " + std::to_string(tokens.ids.size()) +
                " tokens trained" + (o.jsonl.train_on_all ? " (--train_on_all)" : "");
  keep_tokenizer_file(t, tokens);
  return tokens;
}

// Where the validation tokens start: at n_train, or with documents at the start of the
// document holding it (the next document's, when that is the first).
int64_t split_point(const Tokens& t, int64_t n_train) {
  if (t.first.empty()) return n_train;
  const int64_t n = static_cast<int64_t>(t.ids.size());
  int64_t s = n_train;
  while (s > 0 && !t.first[static_cast<size_t>(s)]) --s;
  if (s == 0)
    for (s = n_train; s < n && !t.first[static_cast<size_t>(s)];) ++s;
  NDT_CHECK(s > 0 && s < n, "too little data for a train/val split between documents: ", n,
            " tokens in one document; give more rows");
  return s;
}

// What prepare did, for the report.
struct Summary {
  size_t files = 0, bytes = 0;
  int64_t tokens = 0, n_train = 0, n_val = 0;
  int shards = 0;
  data::ShardFormat format = data::ShardFormat::u16;
  std::string what, id, replaced;  // replaced: what --overwrite removed
  std::string skipped;             // what --skip_bad_rows left out ("": nothing)
};

// The output folder is this preparation's alone: refused when it holds another's files,
// unless --overwrite.
void check_out_dir(const Options& o) {
  const std::vector<std::string> there = data::preparation_files(o.out_dir);
  NDT_CHECK(there.empty() || o.overwrite, "--out ", o.out_dir, " already holds a preparation (",
            data::describe_files(there),
            "), whose files a run would read beside the new ones: give another --out, or add --overwrite "
            "to replace it");
}

// Removes the earlier preparation (its manifest first, so that no half-removed folder looks
// whole), then writes the shards, the vocabulary and, last, preparation.json.
void write_output(const Options& o, const Tokens& t, int64_t n_train, data::ShardFormat format, Summary& s) {
  const std::vector<std::string> there = data::preparation_files(o.out_dir);
  s.replaced = data::describe_files(there);
  fs::remove(fs::path(o.out_dir) / data::kPreparationFile);
  for (const std::string& name : there) fs::remove(fs::path(o.out_dir) / name);
  fs::create_directories(o.out_dir);
  const std::vector<ShardSpan> plan = shard_plan(static_cast<int64_t>(t.ids.size()), n_train, o.shard_tokens);
  data::Preparation p{o.out_dir,
                      preparation_id(t.ids, t.mask, t.first, plan, t.vocab_name, t.vocab_bytes),
                      t.vocab_name,
                      {},
                      {}};
  for (const ShardSpan& span : plan) {
    data::write_shard((fs::path(o.out_dir) / span.name).string(),
                      std::vector<uint32_t>(t.ids.begin() + span.begin, t.ids.begin() + span.end), format);
    p.shards.emplace_back(span.name, span.end - span.begin);
    if (t.mask.empty()) continue;
    const data::ShardSidecars sc{sidecar_name(span.name, ".mask"), sidecar_name(span.name, ".docs"),
                                 span.end - span.begin};
    const auto bytes = [&](const std::vector<uint8_t>& v) {
      return std::string(reinterpret_cast<const char*>(v.data()) + span.begin, static_cast<size_t>(sc.bytes));
    };
    io::write_file_atomic((fs::path(o.out_dir) / sc.mask).string(), bytes(t.mask));
    io::write_file_atomic((fs::path(o.out_dir) / sc.docs).string(), bytes(t.first));
    p.sidecars[span.name] = sc;
  }
  io::write_file_atomic((fs::path(o.out_dir) / t.vocab_name).string(), t.vocab_bytes);
  for (const auto& [name, bytes] : t.beside)
    io::write_file_atomic((fs::path(o.out_dir) / name).string(), bytes);
  data::write_preparation(p);
  s.id = p.id;
  s.shards = static_cast<int>(plan.size()) - 1;
}

// Reads, tokenizes and writes the shards.
Summary prepare(const Options& o) {
  check_out_dir(o);  // before the work
  const bool rows = std::any_of(o.files.begin(), o.files.end(), is_rows);
  std::vector<std::string> docs = rows ? std::vector<std::string>{} : read_documents(o.files);
  size_t bytes = 0;
  for (const std::string& d : docs) bytes += d.size();
  for (const std::string& f : rows ? o.files : std::vector<std::string>{}) bytes += fs::file_size(f);
  NDT_CHECK(bytes > 0, "the input files hold no text");
  std::string skipped;
  const Tokens tokens = rows                  ? tokenize_documents(o, skipped)
                        : o.tokenizer.empty() ? tokenize_with_vocab(o, docs)
                                              : tokenize_with_model(o, docs);
  NDT_CHECK(!tokens.ids.empty(), "the input files hold no rows");
  const int64_t n_val =
      std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(tokens.ids.size()) * o.val_fraction));
  const int64_t n_train = split_point(tokens, static_cast<int64_t>(tokens.ids.size()) - n_val);
  NDT_CHECK(n_train > 0, "too little text for a train/val split");
  Summary s{rows ? o.files.size() : docs.size(),
            bytes,
            static_cast<int64_t>(tokens.ids.size()),
            n_train,
            static_cast<int64_t>(tokens.ids.size()) - n_train,
            0,
            data::shard_format_for(tokens.ids),
            tokens.what};
  s.skipped = skipped;
  write_output(o, tokens, n_train, s.format, s);
  return s;
}

void report(const Options& o, const Summary& s) {
  if (!s.replaced.empty()) std::cout << "prepare_text: --overwrite: removed " << s.replaced << "\n";
  if (!s.skipped.empty()) std::cout << "prepare_text: " << s.skipped << "\n";
  std::cout << "prepare_text: " << s.what << "\n"
            << "prepare_text: " << s.files << " files, " << s.bytes << " bytes -> " << s.tokens
            << " tokens: " << s.n_train << " train in " << s.shards << " shard(s), " << s.n_val << " val, "
            << (s.format == data::ShardFormat::u16 ? "uint16 (GPT-2's format)" : "uint32 (Llama 3's format)")
            << ", in " << o.out_dir << " (preparation " << s.id << ")\n";
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
