// prepare_text: turn text files into token shards (llm.c format) plus vocab.json.
//
//   prepare_text --out data/fortunes --vocab char --val_fraction 0.05 FILE...
//
// The files are joined with newlines (files holding NUL bytes are skipped as binary); the
// last val_fraction of the tokens become val_000000.bin, the rest train_NNNNNN.bin shards of
// at most --shard_tokens tokens. char: one token per distinct character; byte: 256 tokens.
#include <boost/program_options.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "train/data/data.h"
#include "train/data/vocab.h"

namespace po = boost::program_options;
namespace fs = std::filesystem;
using namespace ndt;

int main(int argc, char** argv) {
  std::string out_dir, kind = "char";
  double val_fraction = 0.05;
  int64_t shard_tokens = 100'000'000;
  std::vector<std::string> files;
  po::options_description opts(
      "prepare_text: text files -> token shards + vocab.json\n\nUsage: prepare_text --out DIR [options] "
      "FILE...\n\nOptions");
  opts.add_options()("help,h", "print this help")("out", po::value(&out_dir)->required(), "output directory")(
      "vocab", po::value(&kind)->default_value(kind), "char or byte")(
      "val_fraction", po::value(&val_fraction)->default_value(val_fraction),
      "fraction of tokens for validation (at the end)")(
      "shard_tokens", po::value(&shard_tokens)->default_value(shard_tokens), "tokens per training shard")(
      "files", po::value(&files), "input text files");
  po::positional_options_description pos;
  pos.add("files", -1);
  try {
    po::variables_map vm;
    po::store(po::command_line_parser(argc, argv).options(opts).positional(pos).run(), vm);
    if (vm.count("help")) {
      std::cout << opts << "\n";
      return 0;
    }
    po::notify(vm);
    if (kind != "char" && kind != "byte") throw po::error("--vocab must be char or byte, got '" + kind + "'");
    if (files.empty()) throw po::error("no input files");
    if (!(val_fraction > 0 && val_fraction < 1)) throw po::error("--val_fraction must be in (0, 1)");
    if (shard_tokens < 1 || shard_tokens >= (int64_t(1) << 31))
      throw po::error("--shard_tokens must be in [1, 2^31)");
  } catch (const std::exception& e) {  // boost's po::error and its value conversions
    std::cerr << "prepare_text: error: " << e.what() << " (see --help)\n";
    return 2;
  }
  try {
    std::string text;
    int used = 0;
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
      if (!text.empty() && text.back() != '\n') text += '\n';
      text += s;
      ++used;
    }
    NDT_CHECK(!text.empty(), "the input files hold no text");
    data::Vocab vocab = kind == "char" ? data::Vocab::build_char(text) : data::Vocab::byte_level();
    std::vector<uint16_t> tokens = vocab.encode(text);
    const int64_t n_val =
        std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(tokens.size()) * val_fraction));
    const int64_t n_train = static_cast<int64_t>(tokens.size()) - n_val;
    NDT_CHECK(n_train > 0, "too little text for a train/val split");
    fs::create_directories(out_dir);
    int shard = 0;
    for (int64_t s = 0; s < n_train; s += shard_tokens, ++shard) {
      char name[64];
      std::snprintf(name, sizeof(name), "train_%06d.bin", shard);
      const int64_t e = std::min(n_train, s + shard_tokens);
      data::write_shard((fs::path(out_dir) / name).string(),
                        std::vector<uint16_t>(tokens.begin() + s, tokens.begin() + e));
    }
    data::write_shard((fs::path(out_dir) / "val_000000.bin").string(),
                      std::vector<uint16_t>(tokens.begin() + n_train, tokens.end()));
    vocab.save((fs::path(out_dir) / "vocab.json").string());
    std::cout << "prepare_text: " << used << " files, " << text.size() << " bytes -> " << tokens.size()
              << " tokens (" << kind << " vocab of " << vocab.size() << "): " << n_train << " train in "
              << shard << " shard(s), " << n_val << " val, in " << out_dir << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "prepare_text: error: " << e.what() << "\n";
    return 1;
  }
}
