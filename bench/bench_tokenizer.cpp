// bench_tokenizer: ndtrain's tokenizer encoding documents, in MB/s. bench/bench_tokenizer.py
// runs it beside Hugging Face's tokenizers and tiktoken on the same text and threads.
//
//   bench_tokenizer --tokenizer PATH [--threads N] [--repeat R] [--one_text] FILE...
//
// Each file is one document (encode_batch over them; --one_text: the files joined into one text,
// which encode splits across the threads). Each repeat loads the tokenizer afresh (so its cache
// starts empty, as a new process's would) and times the encoding alone; the best repeat is
// printed as one JSON line: MB/s, bytes, tokens, and an FNV-1a hash of all the ids in order
// (the Python side hashes the references' ids the same way, to check they agree).
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace {

void usage(std::ostream& os) {
  os << "bench_tokenizer: encoding speed of ndtrain's tokenizer (see bench/bench_tokenizer.py)\n\n"
        "Usage: bench_tokenizer --tokenizer PATH [--threads N] [--repeat R] [--one_text] FILE...\n\n"
        "  --tokenizer PATH  a tokenizer.json or a folder holding one\n"
        "  --threads N       OpenMP threads (default 1)\n"
        "  --repeat R        timed repeats, the best is printed (default 3)\n"
        "  --one_text        the files as one text (default: each file a document)\n";
}

uint64_t fnv1a(uint64_t h, int32_t id) {
  for (int k = 0; k < 4; ++k) {
    h ^= static_cast<uint8_t>(static_cast<uint32_t>(id) >> (8 * k));
    h *= 0x100000001B3ull;
  }
  return h;
}

}  // namespace

int main(int argc, char** argv) {
  std::string path;
  int threads = 1, repeat = 3;
  bool one_text = false;
  std::vector<std::string> files;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      const auto value = [&]() -> std::string {
        if (i + 1 >= argc) throw std::runtime_error(a + " needs a value");
        return argv[++i];
      };
      if (a == "-h" || a == "--help") {
        usage(std::cout);
        return 0;
      } else if (a == "--tokenizer") {
        path = value();
      } else if (a == "--threads") {
        threads = std::stoi(value());
      } else if (a == "--repeat") {
        repeat = std::stoi(value());
      } else if (a == "--one_text") {
        one_text = true;
      } else if (a.rfind("--", 0) == 0) {
        throw std::runtime_error("unknown option " + a);
      } else {
        files.push_back(a);
      }
    }
    if (path.empty()) throw std::runtime_error("--tokenizer is required");
    if (files.empty()) throw std::runtime_error("no input files");
    if (threads < 1 || repeat < 1) throw std::runtime_error("--threads and --repeat must be >= 1");
  } catch (const std::exception& e) {
    std::cerr << "bench_tokenizer: error: " << e.what() << " (see --help)\n";
    return 2;
  }
  try {
    std::vector<std::string> docs;
    size_t bytes = 0;
    for (const std::string& f : files) {
      std::ifstream in(f, std::ios::binary);
      if (!in.good()) throw std::runtime_error("cannot read " + f);
      std::stringstream ss;
      ss << in.rdbuf();
      docs.push_back(ss.str());
      bytes += docs.back().size();
    }
    if (one_text) {
      std::string all;
      for (const std::string& d : docs) all += d;
      docs = {all};
    }
    const std::vector<std::string_view> views(docs.begin(), docs.end());
    double best = 1e30;
    std::vector<std::vector<int32_t>> ids;
    for (int r = 0; r < repeat; ++r) {
      const ndt::tok::Tokenizer tok = ndt::tok::Tokenizer::from_file(path);
      ndt::tok::EncodeOptions opt;
      opt.threads = threads;
      const auto t0 = std::chrono::steady_clock::now();
      if (one_text)
        ids = {tok.encode(views[0], opt)};
      else
        ids = tok.encode_batch(views, opt);
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    uint64_t h = 0xCBF29CE484222325ull;
    size_t tokens = 0;
    for (const auto& d : ids) {
      tokens += d.size();
      for (int32_t id : d) h = fnv1a(h, id);
    }
    std::printf(
        "{\"library\": \"ndtrain\", \"threads\": %d, \"mb_per_s\": %.3f, \"bytes\": %zu, \"tokens\": %zu, "
        "\"hash\": \"%016llx\"}\n",
        threads, static_cast<double>(bytes) / best / 1e6, bytes, tokens, static_cast<unsigned long long>(h));
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "bench_tokenizer: error: " << e.what() << "\n";
    return 1;
  }
}
