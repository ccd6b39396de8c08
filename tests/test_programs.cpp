// Every program the build makes (the list comes from CMakeLists.txt: train_gpt,
// prepare_text, export_weights, the examples and, when built, the benchmarks): --help and -h
// print its usage and exit 0; a bad argument is one line on stderr, "<program>: ...error...",
// and a non-zero exit -- never "terminate called after throwing" (an uncaught exception).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "support/corpus.h"
#include "support/launch.h"
#include "support/testing.h"
#include "tensor/error.h"
#include "tokenizer/bpe_json.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"
#include "train/command_line.h"

namespace {

using Result = ndt::testing::ShellResult;

// name -> path, from NDT_PROGRAMS ("name=path|name=path|...")
std::map<std::string, std::string> programs() {
  std::map<std::string, std::string> m;
  const std::string all = NDT_PROGRAMS;
  for (size_t at = 0; at <= all.size();) {
    const size_t end = std::min(all.find('|', at), all.size());
    const std::string item = all.substr(at, end - at);
    const size_t eq = item.find('=');
    if (eq != std::string::npos) m[item.substr(0, eq)] = item.substr(eq + 1);
    at = end + 1;
  }
  return m;
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Run without the BLAS re-exec (tensor/threads.h) and on one thread: only the arguments matter.
Result run(const std::string& path, const std::string& args) {
  return ndt::testing::run_shell("NDT_NO_BLAS_REEXEC=1 OMP_NUM_THREADS=1 " + path + " " + args +
                                 " </dev/null");
}

// A byte-level BPE tokenizer.json without merges: GPT-2's byte alphabet and <|endoftext|>
// (257 tokens), the smallest model tokenizer prepare_text --tokenizer takes.
std::string byte_tokenizer_json() {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0, extra = 0; b < 256; ++b) {  // GPT-2's bytes_to_unicode
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
    const int cp = printable ? b : 256 + extra++;
    std::string u =
        cp < 0x80 ? std::string(1, static_cast<char>(cp))
                  : std::string{static_cast<char>(0xC0 | (cp >> 6)), static_cast<char>(0x80 | (cp & 0x3F))};
    vocab[u] = b;
  }
  const nlohmann::json level = {
      {"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  nlohmann::json j = {{"version", "1.0"},      {"truncation", nullptr},  {"padding", nullptr},
                      {"normalizer", nullptr}, {"pre_tokenizer", level}, {"post_processor", nullptr},
                      {"decoder", level}};
  j["added_tokens"] = nlohmann::json::array({{{"id", 256},
                                              {"content", "<|endoftext|>"},
                                              {"single_word", false},
                                              {"lstrip", false},
                                              {"rstrip", false},
                                              {"normalized", false},
                                              {"special", true}}});
  j["model"] = ndt::tok::bpe_model_json(vocab, nlohmann::json::array());
  return j.dump();
}

// The files of a folder, sorted, with their sizes: "name:bytes ...".
std::string listing(const std::filesystem::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    names.push_back(e.path().filename().string() + ":" + std::to_string(e.file_size()));
  std::sort(names.begin(), names.end());
  std::string s;
  for (const std::string& n : names) s += n + " ";
  return s;
}

}  // namespace

TEST(Programs, TheListHasEveryProgram) {
  const auto p = programs();
  for (const char* name :
       {"train_gpt", "prepare_text", "export_weights", "generate", "engine_example", "engine_demo"})
    EXPECT_EQ(p.count(name), 1u) << name << " missing from NDT_PROGRAMS: " << NDT_PROGRAMS;
}

TEST(Programs, HelpPrintsTheUsageAndExitsZero) {
  for (const auto& [name, path] : programs())
    for (const char* flag : {"--help", "-h"}) {
      const Result r = run(path, flag);
      EXPECT_EQ(r.rc, 0) << name << " " << flag << "\n" << r.out;
      EXPECT_NE(lower(r.out).find("usage"), std::string::npos) << name << " " << flag << "\n" << r.out;
      EXPECT_EQ(r.out.find("terminate called"), std::string::npos) << name << "\n" << r.out;
    }
}

TEST(Programs, ABadArgumentIsOneLineAndANonZeroExit) {
  std::map<std::string, std::vector<std::string>> bad;
  for (const auto& [name, path] : programs()) bad[name] = {"--no-such-option"};
  // the arguments each program parses itself
  const std::map<std::string, std::vector<std::string>> more = {
      {"bench_gpt_train",
       {"--batch x", "--steps", "XL", "S 2x", "S 0 nodevice", "S 0 cpu half", "S 0 cpu none extra"}},
      {"engine_demo", {"--steps x", "--lr", "--batch 0"}},
      {"export_weights", {"only_one_argument", "a b c", "--dtype half a b"}},
      {"generate",
       {"", "--model", "--model /nonexistent", "--model /tmp --top_p 0", "--model /tmp --temperature x",
        "--model /tmp --dtype half", "--model /tmp --max_new_tokens 0", "stray", "--model /tmp --seed 1.5",
        "--model /tmp --seed 9223372036854775808", "--model /tmp --seed -1", "--model /tmp --top_k x"}},
      {"bench_generate", {"XL", "S x", "S 0 nodevice", "--prompt 0", "S 0 cpu extra"}},
      {"bench_packing", {"--steps x", "--batch", "--seq_len 8", "stray"}},
      {"prepare_text",
       {"--out /nonexistent --vocab word file.txt", "--val_fraction x", "--shard_tokens 1e6",
        "--out /tmp/x --vocab byte --tokenizer t.json f",
        "--out /tmp/x --tokenizer /nonexistent/tokenizer.json /etc/hostname"}},
      {"bench_tokenizer",
       {"--threads 0 --tokenizer t.json f", "--tokenizer /nonexistent/t.json /etc/hostname"}},
      {"train_gpt", {"--train.steps x", "stray.ini"}},
      {"engine_example", {"extra"}},
      {"bench_cpu_ops", {"extra"}},
      {"bench_gpu_ops", {"extra"}},
  };
  for (const auto& [name, args] : more)
    if (bad.count(name)) bad[name].insert(bad[name].end(), args.begin(), args.end());
  for (const auto& [name, path] : programs())
    for (const std::string& args : bad[name]) {
      const Result r = run(path, args);
      const std::string what = name + " " + args + "\n" + r.out;
      EXPECT_NE(r.rc, 0) << what;
      EXPECT_LT(r.rc, 128) << "killed by a signal: " << what;
      EXPECT_EQ(r.out.find("terminate called"), std::string::npos) << what;
      EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << "one line: " << what;
      EXPECT_EQ(r.out.rfind(name + ": ", 0), 0u) << "starts with the program's name: " << what;
      EXPECT_NE(r.out.find("error"), std::string::npos) << what;
    }
}

// The programs beside train_gpt read their options as train_gpt does (train/command_line.h):
// --lower_snake_case, integers as integers, the last release's spellings with a note.
TEST(Programs, TheCommandLineReadsIntegersWholeAndOldSpellingsWithANote) {
  namespace po = boost::program_options;
  int64_t seed = 0, n = 0;
  bool flag = false;
  std::vector<std::string> files;
  po::options_description opts("Usage: test [options] FILE...\n\nOptions");
  opts.add_options()("help,h", "help")("seed", po::value(&seed))("max_new_tokens", po::value(&n))(
      "ignore_eos", po::bool_switch(&flag))("files", po::value(&files));
  po::positional_options_description pos;
  pos.add("files", -1);
  const std::vector<ndt::train::Renamed> renamed = {{"max-new-tokens", "max_new_tokens"},
                                                    {"ignore-eos", "ignore_eos"}};
  auto parse = [&](std::vector<const char*> args, std::string* notes = nullptr, bool with_files = true) {
    args.insert(args.begin(), "test");
    seed = n = 0;
    flag = false;
    files.clear();
    po::variables_map vm;
    std::ostringstream out, err;
    const bool go = ndt::train::parse_command_line(static_cast<int>(args.size()), args.data(), opts,
                                                   with_files ? pos : po::positional_options_description(),
                                                   renamed, vm, out, err);
    if (notes) *notes = err.str();
    return go ? std::string() : out.str();
  };
  // every bit of an int64: 2^53 + 1 is not a double, 2^63 - 1 the largest
  parse({"--seed", "9007199254740993"});
  EXPECT_EQ(seed, int64_t(9007199254740993));
  parse({"--seed=9223372036854775807"});
  EXPECT_EQ(seed, std::numeric_limits<int64_t>::max());
  // the new spellings, and the old ones with one note each
  std::string notes;
  parse({"--max_new_tokens", "7", "--ignore_eos", "a.txt"}, &notes);
  EXPECT_EQ(n, 7);
  EXPECT_TRUE(flag);
  EXPECT_EQ(files, std::vector<std::string>{"a.txt"});
  EXPECT_EQ(notes, "");
  parse({"--max-new-tokens=9", "--ignore-eos"}, &notes);
  EXPECT_EQ(n, 9);
  EXPECT_TRUE(flag);
  EXPECT_EQ(notes,
            "note: --max-new-tokens is now --max_new_tokens; the old spelling goes in the next release\n"
            "note: --ignore-eos is now --ignore_eos; the old spelling goes in the next release\n");
  // --help prints the options; errors are one line naming the option
  EXPECT_NE(parse({"a.txt", "--help"}).find("Usage: test"), std::string::npos);
  auto error = [&](std::vector<const char*> args, bool with_files = true) {
    try {
      parse(std::move(args), nullptr, with_files);
    } catch (const ndt::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  for (const char* bad : {"1.5", "9223372036854775808", "x", "1e3", "0x10", ""}) {
    const std::string e = error({"--seed", bad});
    EXPECT_NE(e.find("'--seed'"), std::string::npos) << bad << ": " << e;
    EXPECT_NE(e.find("an integer from -9223372036854775808 to 9223372036854775807"), std::string::npos) << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  }
  EXPECT_NE(error({"--max-new-tokens", "x"}).find("'--max_new_tokens'"), std::string::npos);
  EXPECT_NE(error({"--seed"}).find("'--seed'"), std::string::npos);
  EXPECT_NE(error({"--no_such_option"}).find("--no_such_option"), std::string::npos);
  EXPECT_EQ(error({"--seed", "3", "stray"}, false), "unexpected argument 'stray'");
  // in the programs: exit code 2 and the option named
  const auto p = programs();
  for (const auto& [name, args, option] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"generate", "--model /tmp --seed 1.5", "'--seed'"},
           {"generate", "--model /tmp --top_k 9223372036854775808", "'--top_k'"},
           {"prepare_text", "--out /tmp/x --threads 99999999999 f.txt", "'--threads'"}}) {
    const Result r = run(p.at(name), args);
    EXPECT_EQ(r.rc, 2) << name << " " << args << "\n" << r.out;
    EXPECT_NE(r.out.find(option), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("it takes an integer from"), std::string::npos) << r.out;
  }
}

// generate, end to end: a tiny llama trained two steps on the tests' char corpus, then its
// checkpoint and its Hugging Face export continued through the vocabulary: exit 0, the prompt
// first, the greedy text the same from both, and a tokenizer that is not the model's refused.
TEST(Programs, GenerateWritesTextFromACheckpointAndItsExport) {
  const auto p = programs();
  const std::filesystem::path dir = ndt::testing::fresh_dir("generate");
  const int64_t V = ndt::testing::write_word_corpus(dir / "data", 3000, 5, 0.0);
  const std::string d = dir.string(), src = NDT_SOURCE_DIR;
  const Result train =
      run(p.at("train_gpt"), "--config " + src + "/configs/llama/fortunes_tiny.ini --data.train '" + d +
                                 "/data/train_*.bin' --data.val '' --model.vocab_size " + std::to_string(V) +
                                 " --train.steps 2 --sample.length 0 "
                                 "--checkpoint.every 2 --checkpoint.dir " +
                                 d +
                                 "/ckpt "
                                 "--log.metrics '' --log.report ''");
  ASSERT_EQ(train.rc, 0) << train.out;
  const Result exported = run(p.at("export_weights"), d + "/ckpt/step_00000002 " + d + "/hf");
  ASSERT_EQ(exported.rc, 0) << exported.out;
  const std::string opts = " --tokenizer " + d + "/data/vocab.json --prompt 'a ' --max_new_tokens 30";
  // stdout alone (the summary lines go to stderr)
  auto text = [&](const std::string& model, const std::string& draw = " --temperature 0") {
    return ndt::testing::run_shell("{ OMP_NUM_THREADS=1 " + p.at("generate") + " --model " + model + opts +
                                   draw + " 2>/dev/null </dev/null; }");
  };
  const Result a = text(d + "/ckpt"), b = text(d + "/hf");
  ASSERT_EQ(a.rc, 0) << a.out;
  ASSERT_EQ(b.rc, 0) << b.out;
  EXPECT_EQ(a.out.rfind("a ", 0), 0u) << a.out;
  EXPECT_GT(a.out.size(), 2u + 30u) << "30 characters after the prompt: " << a.out;
  EXPECT_EQ(a.out, b.out) << "the checkpoint and its export continue alike";
  // without --tokenizer: the vocabulary the checkpoint carries, the export's tokenizer.json
  for (const std::string model : {d + "/ckpt", d + "/hf"}) {
    const Result bare =
        ndt::testing::run_shell("{ OMP_NUM_THREADS=1 " + p.at("generate") + " --model " + model +
                                " --prompt 'a ' --max_new_tokens 30 --temperature 0 2>&1 </dev/null; }");
    ASSERT_EQ(bare.rc, 0) << bare.out;
    EXPECT_NE(bare.out.find(a.out.substr(0, a.out.size() - 1)), std::string::npos)
        << model << ": " << bare.out;
    EXPECT_NE(bare.out.find(model == d + "/hf" ? "; tokenizer " + d + "/hf/tokenizer.json (char vocabulary, "
                                               : "/ckpt/step_00000002/vocab.json (char vocabulary, "),
              std::string::npos)
        << bare.out;
  }
  // the seed is read whole: 2^53 + 1 draws other tokens than 2^53 (as a double both are 2^53)
  const Result s53 = text(d + "/hf", " --temperature 1 --seed 9007199254740992"),
               s53_1 = text(d + "/hf", " --temperature 1 --seed 9007199254740993"),
               again = text(d + "/hf", " --temperature 1 --seed 9007199254740993");
  ASSERT_EQ(s53_1.rc, 0) << s53_1.out;
  EXPECT_EQ(s53_1.out, again.out) << "a seed draws the same tokens every time";
  EXPECT_NE(s53_1.out, s53.out) << "2^53 + 1 is not 2^53";
  // the last release's spellings still work, each with its note
  const Result old = run(p.at("generate"), "--model " + d + "/hf --tokenizer " + d +
                                               "/data/vocab.json "
                                               "--max-new-tokens 5 --top-k 3 --top-p 0.9 --ignore-eos");
  EXPECT_EQ(old.rc, 0) << old.out;
  for (const char* o : {"max-new-tokens", "top-k", "top-p", "ignore-eos"}) {
    std::string now = o;
    std::replace(now.begin(), now.end(), '-', '_');
    EXPECT_NE(old.out.find("note: --" + std::string(o) + " is now --" + now +
                           "; the old spelling goes in the next release\n"),
              std::string::npos)
        << old.out;
  }
  // a config.json that contradicts its weights is one error before the model is built or
  // allocated: sizes outside train_gpt's ranges (2^31 blocks were still being described after
  // a minute), and shapes the safetensors do not hold (8192 channels over 32-wide weights took
  // gigabytes first)
  for (const auto& [key, value, says] :
       {std::tuple<std::string, int64_t, std::string>{"num_hidden_layers", int64_t(1) << 31,
                                                      "model.n_layer = 2147483648 is outside [1, 1024]"},
        {"hidden_size", 8192, "has shape"}}) {
    const std::string bad = d + "/bad_" + key;
    std::filesystem::copy(d + "/hf", bad);
    nlohmann::json cfg;
    std::ifstream(bad + "/config.json") >> cfg;
    cfg[key] = value;
    cfg.erase("head_dim");  // (written by the export: hidden_size / num_attention_heads)
    std::ofstream(bad + "/config.json") << cfg.dump();
    // in 2 GiB of address space: the 8192-channel model would need about 6 GiB
    const Result r = run("ulimit -v 2097152; " + p.at("generate"),
                         "--model " + bad + " --tokenizer " + d + "/data/vocab.json");
    EXPECT_EQ(r.rc, 2) << r.out;
    EXPECT_NE(r.out.find(says), std::string::npos) << key << ": " << r.out;
    EXPECT_NE(r.out.find(bad), std::string::npos) << "the folder is named: " << r.out;
  }
  // a byte vocabulary (256 tokens) for a model of fewer characters: refused before any text
  ASSERT_EQ(ndt::testing::run_shell("echo '{\"type\": \"byte\"}' > " + d + "/bytes.json").rc, 0);
  const Result wrong = run(p.at("generate"), "--model " + d + "/ckpt --tokenizer " + d + "/bytes.json");
  EXPECT_EQ(wrong.rc, 2) << wrong.out;
  EXPECT_NE(wrong.out.find("has 256 tokens but the model only " + std::to_string(V)), std::string::npos)
      << wrong.out;
  std::filesystem::remove_all(dir);
}

// A byte-level tokenizer.json: the 256 bytes (GPT-2's byte-to-character map, no merges) and
// the given special tokens after them.
std::string byte_tokenizer_json(const std::vector<std::string>& specials) {
  nlohmann::ordered_json vocab = nlohmann::ordered_json::object();
  int n = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    const uint32_t cp = printable ? uint32_t(b) : uint32_t(256 + n++);
    std::string ch;
    if (cp < 0x80) {
      ch += char(cp);
    } else {
      ch += char(0xC0 | (cp >> 6)), ch += char(0x80 | (cp & 0x3F));
    }
    vocab[ch] = b;
  }
  nlohmann::ordered_json added = nlohmann::ordered_json::array();
  for (size_t i = 0; i < specials.size(); ++i)
    added.push_back({{"id", 256 + i},
                     {"content", specials[i]},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  const nlohmann::ordered_json byte_level = {
      {"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  nlohmann::ordered_json j = {{"version", "1.0"},          {"added_tokens", added},
                              {"normalizer", nullptr},     {"pre_tokenizer", byte_level},
                              {"post_processor", nullptr}, {"decoder", byte_level}};
  j["model"] = {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", nullptr},
                {"fuse_unk", false},
                {"byte_fallback", false},
                {"vocab", vocab},
                {"merges", nlohmann::json::array()}};
  return j.dump();
}

// generate --chat: a tiny llama exported with a byte-level tokenizer and SmolLM2's chat
// template; the prompt is the user message (after --system) rendered by the template with the
// assistant's turn opened and tokenized without added special tokens, exactly as the library
// renders it; the reply stops at the template's end of turn (<|im_end|>). A folder without a
// template is one line and exit code 2.
TEST(Programs, GenerateChatRendersThePromptThroughTheModelsTemplate) {
  const auto p = programs();
  const std::filesystem::path dir = ndt::testing::fresh_dir("generate_chat");
  ndt::testing::write_word_corpus(dir / "data", 3000, 5, 0.0);
  const std::string d = dir.string(), src = NDT_SOURCE_DIR;
  const Result train =
      run(p.at("train_gpt"), "--config " + src + "/configs/llama/fortunes_tiny.ini --data.train '" + d +
                                 "/data/train_*.bin' --data.val '' --model.vocab_size 264 " +
                                 "--train.steps 1 --sample.length 0 --checkpoint.every 1 " +
                                 "--checkpoint.dir " + d + "/ckpt --log.metrics '' --log.report ''");
  ASSERT_EQ(train.rc, 0) << train.out;
  const Result exported = run(p.at("export_weights"), d + "/ckpt/step_00000001 " + d + "/hf");
  ASSERT_EQ(exported.rc, 0) << exported.out;
  std::ofstream(d + "/hf/tokenizer.json") << byte_tokenizer_json({"<|im_start|>", "<|im_end|>"});
  const std::string chat_args = " --chat --system 'Be brief.' --prompt 'Grüße! 2+2?' --max_new_tokens 4";
  // no template yet: one line, exit code 2
  std::filesystem::remove(d + "/hf/tokenizer_config.json");
  const Result none = run(p.at("generate"), "--model " + d + "/hf" + chat_args);
  EXPECT_EQ(none.rc, 2) << none.out;
  EXPECT_NE(none.out.find("has a chat template"), std::string::npos) << none.out;
  std::filesystem::copy_file(src + "/tests/data/chat_templates/smollm2/tokenizer_config.json",
                             d + "/hf/tokenizer_config.json");
  const Result r = run(p.at("generate"), "--model " + d + "/hf --temperature 0" + chat_args);
  ASSERT_EQ(r.rc, 0) << r.out;
  const ndt::tok::ChatTemplate t = ndt::tok::ChatTemplate::from_folder(d + "/hf");
  const std::string text =
      t.render({{"system", "Be brief."}, {"user", "Grüße! 2+2?"}}, {.add_generation_prompt = true});
  EXPECT_EQ(text,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nGrüße! 2+2?<|im_end|>\n"
            "<|im_start|>assistant\n");
  const size_t n = ndt::tok::Tokenizer::from_file(d + "/hf").encode(text, false).size();
  EXPECT_EQ(n, text.size() - 3 * 12 - 2 * 10 + 5);  // a token a byte; 3 <|im_start|>, 2 <|im_end|> one each
  EXPECT_NE(r.out.find("generate: chat prompt of " + std::to_string(n) + " tokens through " + d +
                       "/hf/tokenizer_config.json; stops at <|im_end|> (id 257)\n" + text + "\n"),
            std::string::npos)
      << r.out;
  // --system without --chat: refused
  const Result lone = run(p.at("generate"), "--model " + d + "/hf --system x");
  EXPECT_EQ(lone.rc, 2) << lone.out;
  EXPECT_NE(lone.out.find("--system is for --chat"), std::string::npos) << lone.out;
  std::filesystem::remove_all(dir);
}

// prepare_text owns its output folder. Run twice into one folder (a model's tokenizer, five
// shards; then a char vocabulary, one shard), the second run used to leave the first one's
// shards and tokenizer.json there: train_gpt read four old shards in the new vocabulary and
// took the old tokenizer.json for the vocabulary. Now the second run is refused in one line
// naming what is there, and with --overwrite it replaces the first run's files; train_gpt
// takes the vocabulary the shards were made with and refuses shards of two preparations.
TEST(Programs, PrepareTextOwnsItsFolderAndTrainGptReadsOnePreparation) {
  const auto p = programs();
  namespace fs = std::filesystem;
  const fs::path dir = ndt::testing::fresh_dir("prepare_owns");
  const std::string d = dir.string(), src = NDT_SOURCE_DIR;
  std::ofstream(d + "/tokenizer.json") << byte_tokenizer_json();
  {
    std::ofstream a(d + "/a.txt"), b(d + "/b.txt");
    for (int i = 0; i < 400; ++i) a << "the quick brown fox jumps over the lazy dog " << i << "\n";
    for (int i = 0; i < 300; ++i) b << "ab ba abba baab\n";
  }
  const Result first = run(p.at("prepare_text"), "--out " + d + "/data --tokenizer " + d +
                                                     "/tokenizer.json --shard_tokens 4000 " + d + "/a.txt");
  ASSERT_EQ(first.rc, 0) << first.out;
  EXPECT_NE(first.out.find("5 shard(s)"), std::string::npos) << first.out;
  const std::string before = listing(dir / "data");
  // the second preparation into the same folder: refused, nothing touched
  const std::string second = "--out " + d + "/data --vocab char " + d + "/b.txt";
  const Result refused = run(p.at("prepare_text"), second);
  EXPECT_EQ(refused.rc, 1) << refused.out;
  EXPECT_EQ(std::count(refused.out.begin(), refused.out.end(), '\n'), 1) << refused.out;
  EXPECT_NE(refused.out.find("prepare_text: error: --out " + d +
                             "/data already holds a preparation "
                             "(preparation.json, tokenizer.json and 6 shards (train_000000.bin ... "
                             "val_000000.bin)), whose files a run would read beside the new ones: give "
                             "another --out, or add --overwrite to replace it"),
            std::string::npos)
      << refused.out;
  EXPECT_EQ(listing(dir / "data"), before);
  // a shard of the first preparation beside the second's (as the second run used to leave it),
  // and train and val of two preparations: train_gpt refuses before training
  const Result other = run(p.at("prepare_text"), "--out " + d + "/other --vocab char " + d + "/b.txt");
  ASSERT_EQ(other.rc, 0) << other.out;
  const std::string train = p.at("train_gpt") + " --config " + src + "/configs/llama/fortunes_tiny.ini";
  const std::string tiny =
      " --train.steps 1 --sample.length 0 --log.metrics '' --log.report '' "
      "--train.micro_batch_size 2 --train.seq_len 16 --checkpoint.dir '' --train.eval_steps 2";
  fs::copy_file(dir / "data" / "train_000001.bin", dir / "other" / "train_000001.bin");
  Result r = run(
      train, "--data.train '" + d + "/other/train_*.bin' --data.val ''" + tiny + " --model.vocab_size 300");
  EXPECT_NE(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("data shard " + d + "/other/train_000001.bin is not one of the 2 shards that " + d +
                       "/other/preparation.json lists"),
            std::string::npos)
      << r.out;
  fs::remove(dir / "other" / "train_000001.bin");
  r = run(train, "--data.train '" + d + "/data/train_*.bin' --data.val '" + d + "/other/val_*.bin'" + tiny +
                     " --model.vocab_size 300");
  EXPECT_NE(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("data shards " + d + "/data/train_000000.bin and " + d +
                       "/other/val_000000.bin come from two preparations"),
            std::string::npos)
      << r.out;
  // --overwrite: the first preparation's files are gone, the second's alone are there
  const Result replaced = run(p.at("prepare_text"), second + " --overwrite");
  ASSERT_EQ(replaced.rc, 0) << replaced.out;
  EXPECT_NE(
      replaced.out.find("prepare_text: --overwrite: removed preparation.json, tokenizer.json and 6 shards"),
      std::string::npos)
      << replaced.out;
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir / "data")) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"preparation.json", "train_000000.bin", "val_000000.bin",
                                             "vocab.json"}));
  // a tokenizer.json left beside the new vocab.json (by a tool, or an older prepare_text):
  // train_gpt takes vocab.json, the one the shards were made with (6 tokens), and trains
  fs::copy_file(dir / "tokenizer.json", dir / "data" / "tokenizer.json");
  const std::string data = " --data.train '" + d + "/data/train_*.bin' --data.val '" + d + "/data/val_*.bin'";
  r = run(train, data + tiny + " --model.vocab_size 6");
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(r.out.find("tokenizer.json"), std::string::npos) << r.out;
  std::filesystem::remove_all(dir);
}
