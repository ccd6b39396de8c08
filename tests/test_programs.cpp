// Every program the build makes (the list comes from CMakeLists.txt: train_gpt,
// prepare_text, export_weights, the examples and, when built, the benchmarks): --help and -h
// print its usage and exit 0; a bad argument is one line on stderr, "<program>: ...error...",
// and a non-zero exit -- never "terminate called after throwing" (an uncaught exception).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "support/corpus.h"
#include "support/launch.h"
#include "support/testing.h"

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

}  // namespace

TEST(Programs, TheListHasEveryProgram) {
  const auto p = programs();
  for (const char* name : {"train_gpt", "prepare_text", "export_weights", "generate", "engine_example", "engine_demo"})
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
      {"export_weights", {"only_one_argument", "a b c"}},
      {"generate",
       {"", "--model", "--model /nonexistent", "--model /tmp --top-p 0", "--model /tmp --temperature x",
        "--model /tmp --dtype half", "--model /tmp --max-new-tokens 0", "stray"}},
      {"bench_generate", {"XL", "S x", "S 0 nodevice", "--prompt 0", "S 0 cpu extra"}},
      {"prepare_text",
       {"--out /nonexistent --vocab word file.txt", "--val_fraction x", "--out /tmp/x --vocab byte --tokenizer t.json f",
        "--out /tmp/x --tokenizer /nonexistent/tokenizer.json /etc/hostname"}},
      {"bench_tokenizer", {"--threads 0 --tokenizer t.json f", "--tokenizer /nonexistent/t.json /etc/hostname"}},
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

// generate, end to end: a tiny llama trained two steps on the tests' char corpus, then its
// checkpoint and its Hugging Face export continued through the vocabulary: exit 0, the prompt
// first, the greedy text the same from both, and a tokenizer that is not the model's refused.
TEST(Programs, GenerateWritesTextFromACheckpointAndItsExport) {
  const auto p = programs();
  const std::filesystem::path dir = ndt::testing::fresh_dir("generate");
  const int64_t V = ndt::testing::write_word_corpus(dir / "data", 3000, 5, 0.0);
  const std::string d = dir.string(), src = NDT_SOURCE_DIR;
  const Result train = run(p.at("train_gpt"), "--config " + src + "/configs/llama/fortunes_tiny.ini --data.train '" +
                                                  d + "/data/train_*.bin' --data.val '' --model.vocab_size " +
                                                  std::to_string(V) + " --train.steps 2 --sample.length 0 "
                                                  "--checkpoint.every 2 --checkpoint.dir " + d + "/ckpt "
                                                  "--log.metrics '' --log.report ''");
  ASSERT_EQ(train.rc, 0) << train.out;
  const Result exported = run(p.at("export_weights"), d + "/ckpt/step_00000002 " + d + "/hf");
  ASSERT_EQ(exported.rc, 0) << exported.out;
  const std::string opts = " --tokenizer " + d + "/data/vocab.json --prompt 'a ' --max-new-tokens 30 --temperature 0";
  auto text = [&](const std::string& model) {  // stdout alone (the summary lines go to stderr)
    return ndt::testing::run_shell("{ OMP_NUM_THREADS=1 " + p.at("generate") + " --model " + model + opts +
                                   " 2>/dev/null </dev/null; }");
  };
  const Result a = text(d + "/ckpt"), b = text(d + "/hf");
  ASSERT_EQ(a.rc, 0) << a.out;
  ASSERT_EQ(b.rc, 0) << b.out;
  EXPECT_EQ(a.out.rfind("a ", 0), 0u) << a.out;
  EXPECT_GT(a.out.size(), 2u + 30u) << "30 characters after the prompt: " << a.out;
  EXPECT_EQ(a.out, b.out) << "the checkpoint and its export continue alike";
  // a byte vocabulary (256 tokens) for a model of fewer characters: refused before any text
  ASSERT_EQ(ndt::testing::run_shell("echo '{\"type\": \"byte\"}' > " + d + "/bytes.json").rc, 0);
  const Result wrong = run(p.at("generate"), "--model " + d + "/ckpt --tokenizer " + d + "/bytes.json");
  EXPECT_EQ(wrong.rc, 2) << wrong.out;
  EXPECT_NE(wrong.out.find("has 256 tokens but the model only " + std::to_string(V)), std::string::npos) << wrong.out;
  std::filesystem::remove_all(dir);
}
