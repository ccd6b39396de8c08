// Fine-tuning data end to end: prepare_text on .jsonl rows of each format (text, prompt +
// completion, messages through a chat template) gives the tokens, loss masks and document
// starts the tokenizer and template call for; every kind of bad row is one line and writes
// nothing (--skip_bad_rows counts them); the loader turns masks and documents into -1
// targets and per-row document ids; and train_gpt trains on them: its first loss is the
// masked, document-separated loss computed here directly, and the loss falls.
#include <gtest/gtest.h>

#include "support/hf_fixture.h"
#include "support/launch.h"
#include "support/testing.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "models/gpt.h"
#include "nn/flat.h"
#include "tokenizer/tokenizer.h"
#include "train/checkpoint/checkpoint.h"
#include "train/checkpoint/load.h"
#include "train/checkpoint/tokenizer_files.h"
#include "train/data/data.h"
#include "train/data/parquet.h"
#include "train/data/preparation.h"

using namespace ndt;
using namespace ndt::testing;
namespace fs = std::filesystem;

namespace {

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<uint32_t> shard_tokens(const fs::path& p) {
  data::Shard s(p.string());
  std::vector<uint32_t> t(static_cast<size_t>(s.size()));
  s.read(0, s.size(), t.data());
  return t;
}

class FinetuneData : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fresh_dir("finetune");
    write_tiny_hf_folder(dir_ / "model");
    write_tiny_chat_template(dir_ / "model");
  }
  static ShellResult prepare(const std::string& out, const std::string& files,
                             const std::string& extra = "") {
    return run_shell(std::string(NDT_PREPARE_TEXT_BIN) + " --out " + (dir_ / out).string() + " --tokenizer " +
                     (dir_ / "model").string() + " " + extra + " " + files + " 2>&1");
  }
  static fs::path write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name) << text;
    return dir_ / name;
  }
  // The whole stream of a preparation (train shards then val) and its mask and document starts.
  static void stream(const fs::path& out, std::vector<uint32_t>& ids, std::string& mask, std::string& first) {
    const auto p = data::read_preparation(out.string());
    ASSERT_TRUE(p.has_value());
    for (const auto& [file, n] : p->shards) {
      const std::vector<uint32_t> t = shard_tokens(out / file);
      ASSERT_EQ(static_cast<int64_t>(t.size()), n);
      ids.insert(ids.end(), t.begin(), t.end());
      const data::ShardSidecars* sc = p->sidecars_of(file);
      ASSERT_NE(sc, nullptr) << file;
      mask += read_bytes(out / sc->mask);
      first += read_bytes(out / sc->docs);
    }
  }
  static fs::path dir_;
};
fs::path FinetuneData::dir_;

TEST_F(FinetuneData, EachRowFormatGivesItsTokensMasksAndDocumentStarts) {
  const tok::Tokenizer t = tok::Tokenizer::from_file((dir_ / "model").string());
  const fs::path rows =
      write("formats.jsonl",
            R"({"text": "the cat", "id": 7})"
            "\n"
            R"({"prompt": "the ", "completion": "hat", "source": "x"})"
            "\n\n"  // a blank line is no row
            R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]})"
            "\n"
            R"({"text": "the end of the data"})"
            "\n");
  const ShellResult r = prepare("formats", rows.string(), "--val_fraction 0.1");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("4 documents"), std::string::npos) << r.out;
  // what each row must be: its tokens, trained (1) or not (0)
  std::vector<uint32_t> want_ids;
  std::string want_mask, want_first;
  auto add = [&](const std::vector<int32_t>& ids, char trained) {
    for (int32_t id : ids) want_ids.push_back(static_cast<uint32_t>(id)), want_mask += trained;
  };
  auto doc = [&](auto&& body) {
    const size_t from = want_ids.size();
    body();
    want_first += std::string(1, '\1') + std::string(want_ids.size() - from - 1, '\0');
  };
  const int32_t eos = static_cast<int32_t>(TinyHfIds::eos);
  doc([&] { add(t.encode("the cat", true), 1), add({eos}, 1); });
  doc([&] {
    const std::vector<int32_t> prompt = t.encode("the ", true), all = t.encode("the hat", true);
    add(std::vector<int32_t>(all.begin(), all.begin() + static_cast<long>(prompt.size())), 0);
    add(std::vector<int32_t>(all.begin() + static_cast<long>(prompt.size()), all.end()), 1), add({eos}, 1);
  });
  doc([&] {  // <s><pad>user\nhi</s>\n<pad>assistant\n | yo</s> | \n
    add(t.encode("<s><pad>user\nhi</s>\n<pad>assistant\n"), 0), add(t.encode("yo"), 1), add({eos}, 1);
    add(t.encode("\n"), 0);
  });
  doc([&] { add(t.encode("the end of the data", true), 1), add({eos}, 1); });
  std::vector<uint32_t> ids;
  std::string mask, first;
  stream(dir_ / "formats", ids, mask, first);
  EXPECT_EQ(ids, want_ids);
  EXPECT_EQ(mask, want_mask);
  EXPECT_EQ(first, want_first);
  // the validation shard starts a document: the last row's
  const std::string val_first = read_bytes(dir_ / "formats" / "val_000000.docs");
  ASSERT_FALSE(val_first.empty());
  EXPECT_EQ(val_first[0], 1);
  EXPECT_EQ(val_first.size(), t.encode("the end of the data", true).size() + 1);
  // shards of 10 tokens: each with its own mask and document starts, the same stream
  ASSERT_EQ(prepare("formats_10", rows.string(), "--val_fraction 0.1 --shard_tokens 10").rc, 0);
  EXPECT_TRUE(fs::exists(dir_ / "formats_10" / "train_000003.docs"));
  std::vector<uint32_t> ids10;
  std::string mask10, first10;
  stream(dir_ / "formats_10", ids10, mask10, first10);
  EXPECT_EQ(ids10, want_ids);
  EXPECT_EQ(mask10, want_mask);
  EXPECT_EQ(first10, want_first);
  // --train_on_all trains every token
  ASSERT_EQ(prepare("formats_all", rows.string(), "--val_fraction 0.1 --train_on_all").rc, 0);
  std::vector<uint32_t> ids_all;
  std::string mask_all, first_all;
  stream(dir_ / "formats_all", ids_all, mask_all, first_all);
  EXPECT_EQ(ids_all, want_ids);
  EXPECT_EQ(mask_all, std::string(want_ids.size(), '\1'));
}

// The same rows as a Parquet file (tests/data/rows/make_parquet.py: one table, missing fields
// null, two row groups) give the same stream as their .jsonl; so do a folder holding it and a
// quoted pattern; a bad row is named by its row number. Built without Parquet: one line says
// how to build it.
TEST_F(FinetuneData, ParquetRowsGiveTheTokensOfTheirJsonl) {
  const fs::path rows = fs::path(NDT_SOURCE_DIR) / "tests/data/rows";
  const fs::path jsonl = write("formats_pq.jsonl", R"({"text": "the cat", "id": 7})"
                                                   "\n"
                                                   R"({"prompt": "the ", "completion": "hat", "source": "x"})"
                                                   "\n"
                                                   R"({"messages": [{"role": "user", "content": "hi"}, )"
                                                   R"({"role": "assistant", "content": "yo"}]})"
                                                   "\n"
                                                   R"({"text": "the end of the data"})"
                                                   "\n");
  if (!data::parquet_supported()) {
    const ShellResult r = prepare("pq_none", (rows / "formats.parquet").string());
    EXPECT_NE(r.rc, 0);
    EXPECT_NE(r.out.find("this build reads no Parquet files: run scripts/setup.sh"), std::string::npos)
        << r.out;
    GTEST_SKIP() << "built without Parquet (scripts/setup.sh installs the pyarrow wheel's Arrow libraries)";
  }
  ASSERT_EQ(prepare("pq_jsonl", jsonl.string(), "--val_fraction 0.1").rc, 0);
  std::vector<uint32_t> want_ids;
  std::string want_mask, want_first;
  stream(dir_ / "pq_jsonl", want_ids, want_mask, want_first);
  fs::create_directories(dir_ / "hub" / "data");
  fs::copy_file(rows / "formats.parquet", dir_ / "hub" / "data" / "train-00000-of-00001.parquet",
                fs::copy_options::overwrite_existing);
  for (const std::string& input : {(rows / "formats.parquet").string(), (dir_ / "hub").string(),
                                   "'" + (dir_ / "hub" / "data").string() + "/train-*.parquet'"}) {
    const std::string out = "pq_" + std::to_string(std::hash<std::string>()(input) % 100000);
    const ShellResult r = prepare(out, input, "--val_fraction 0.1");
    ASSERT_EQ(r.rc, 0) << input << "\n" << r.out;
    EXPECT_NE(r.out.find("4 documents"), std::string::npos) << r.out;
    std::vector<uint32_t> ids;
    std::string mask, first;
    stream(dir_ / out, ids, mask, first);
    EXPECT_EQ(ids, want_ids) << input;
    EXPECT_EQ(mask, want_mask) << input;
    EXPECT_EQ(first, want_first) << input;
  }
  const ShellResult bad = prepare("pq_bad", (rows / "bad_role.parquet").string());
  EXPECT_NE(bad.rc, 0);
  EXPECT_NE(bad.out.find("bad_role.parquet: row 2: bad row: "), std::string::npos) << bad.out;
  EXPECT_FALSE(fs::exists(dir_ / "pq_bad" / "preparation.json"));
  const ShellResult skipped = prepare("pq_skip", (rows / "bad_role.parquet").string(), "--skip_bad_rows");
  ASSERT_EQ(skipped.rc, 0) << skipped.out;
  EXPECT_NE(skipped.out.find("skipped 1 bad row(s); the first: "), std::string::npos) << skipped.out;
  const ShellResult none = prepare("pq_cols", (rows / "formats.parquet").string(),
                                   "--text_field body --prompt_field q "
                                   "--completion_field a --messages_field chat");
  EXPECT_NE(
      none.out.find("no column a row reads (its columns: text, id, prompt, completion, source, messages"),
      std::string::npos)
      << none.out;
  const ShellResult junk = prepare("pq_junk", write("junk.parquet", "not parquet").string());
  EXPECT_NE(junk.out.find("junk.parquet: cannot read it as Parquet"), std::string::npos) << junk.out;
}

TEST_F(FinetuneData, FieldNamesCanBeSet) {
  const fs::path rows = write("named.jsonl", R"({"q": "the ", "a": "hat"})"
                                             "\n"
                                             R"({"body": "the cat sat"})"
                                             "\n");
  ASSERT_EQ(prepare("named", rows.string(), "--prompt_field q --completion_field a --text_field body").rc, 0);
  std::vector<uint32_t> ids;
  std::string mask, first;
  stream(dir_ / "named", ids, mask, first);
  EXPECT_EQ(std::count(first.begin(), first.end(), '\1'), 2);
  EXPECT_EQ(mask[0], 0);  // the prompt's first token
  const ShellResult bad = prepare("named_bad", rows.string());
  EXPECT_NE(bad.out.find("named.jsonl:1: bad row: no field \"messages\""), std::string::npos) << bad.out;
}

TEST_F(FinetuneData, OverwriteReplacesTheMaskAndDocumentFilesToo) {
  const fs::path rows = write("over.jsonl", R"({"text": "the cat sat"})"
                                            "\n"
                                            R"({"text": "the hat sat"})"
                                            "\n");
  ASSERT_EQ(prepare("over", rows.string()).rc, 0);
  ASSERT_TRUE(fs::exists(dir_ / "over" / "train_000000.mask"));
  const ShellResult refused = prepare("over", write("over.txt", "the cat sat on the mat").string());
  EXPECT_NE(refused.out.find("mask and document files (.mask, .docs)"), std::string::npos) << refused.out;
  const ShellResult r = prepare("over", (dir_ / "over.txt").string(), "--overwrite");
  ASSERT_EQ(r.rc, 0) << r.out;
  for (const char* f : {"train_000000.mask", "train_000000.docs", "val_000000.mask", "val_000000.docs"})
    EXPECT_FALSE(fs::exists(dir_ / "over" / f)) << f;
  data::DataLoader loader((dir_ / "over" / "train_*.bin").string(), 1, 4, 0, 1, false, 0, 264);
  EXPECT_FALSE(loader.has_documents());
}

TEST_F(FinetuneData, EachBadRowIsOneLineAndWritesNothing) {
  const std::string good = R"({"text": "the cat sat on the mat"})";
  struct Case {
    std::string row, expect;
  };
  const std::vector<Case> cases = {
      {R"({"text": "the)", "malformed JSON"},
      {R"(["text"])", "not a JSON object"},
      {R"({"text": 5})", "field \"text\" is not a string"},
      {R"({"prompt": "the "})", "missing field \"completion\""},
      {R"({"messages": [{"role": "bot", "content": "x"}]})", "message 1: unknown role \"bot\""},
      {R"({"messages": [{"role": "user"}]})", "message 1: missing field \"content\""},
      {R"({"messages": []})", "empty conversation"},
      {R"({"messages": [{"role": "tool", "content": "x"}]})", "chat template error"},
      {R"({"other": "x"})", "no field \"messages\""},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].row);
    const fs::path f =
        write("bad" + std::to_string(i) + ".jsonl", good + "\n" + cases[i].row + "\n" + good + "\n");
    const std::string out = "bad_out" + std::to_string(i);
    const ShellResult r = prepare(out, f.string());
    EXPECT_EQ(r.rc, 1) << r.out;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
    EXPECT_NE(r.out.find(f.string() + ":2: bad row: " + cases[i].expect), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("--skip_bad_rows"), std::string::npos) << r.out;
    EXPECT_FALSE(fs::exists(dir_ / out)) << "nothing may be written";
  }
  // --skip_bad_rows leaves them out and counts them
  std::string all = good + "\n";
  for (const Case& c : cases) all += c.row + "\n" + good + "\n";
  const fs::path f = write("bad_all.jsonl", all);
  const ShellResult r = prepare("skipped", f.string(), "--skip_bad_rows");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("skipped " + std::to_string(cases.size()) + " bad row(s); the first: " + f.string() +
                       ":2: bad row: malformed JSON"),
            std::string::npos)
      << r.out;
  std::vector<uint32_t> ids;
  std::string mask, first;
  stream(dir_ / "skipped", ids, mask, first);
  EXPECT_EQ(std::count(first.begin(), first.end(), '\1'), static_cast<long>(cases.size() + 1));
}

// A crafted shard: tokens 0..32, documents starting at 0, 5, 11 and 20, tokens 2..4 and
// 13..15 not trained.
TEST_F(FinetuneData, TheLoaderPacksWholeDocumentsMasksUntrainedTargetsAndPadsRows) {
  const fs::path d = dir_ / "crafted";
  fs::create_directories(d);
  std::vector<uint32_t> tok(33);
  for (uint32_t i = 0; i < tok.size(); ++i) tok[i] = i;
  data::write_shard((d / "train_000000.bin").string(), tok, data::ShardFormat::u16);
  std::string mask(33, '\1'), first(33, '\0');
  for (int i : {2, 3, 4, 13, 14, 15}) mask[i] = 0;
  for (int i : {0, 5, 11, 20}) first[i] = 1;
  std::ofstream(d / "train_000000.mask", std::ios::binary) << mask;
  std::ofstream(d / "train_000000.docs", std::ios::binary) << first;
  data::Preparation p{d.string(), "0123456789abcdef", "", {{"train_000000.bin", 33}}, {}};
  p.sidecars["train_000000.bin"] = {"train_000000.mask", "train_000000.docs", 33};
  data::write_preparation(p);
  // documents of 5, 6, 9 and 13 tokens in rows of 8: the 9 and the 13 cut into 8 + 1 and 8 + 5;
  // first fit decreasing: rows [11..19), [20..28), [5..11) + [19], [0..5), [28..33)
  data::DataLoader loader((d / "train_*.bin").string(), /*B=*/2, /*T=*/8, 0, 1, false, 0, 64);
  ASSERT_TRUE(loader.has_documents());
  const data::PackingStats& st = loader.packing();
  EXPECT_EQ(st.documents, 4);
  EXPECT_EQ(st.split, 2);
  EXPECT_EQ(st.rows, 5);
  EXPECT_EQ(st.real_tokens, 33);
  EXPECT_EQ(st.trained_targets, 23);  // 32 targets, less 6 untrained, less 3 next documents' first tokens
  EXPECT_DOUBLE_EQ(st.efficiency, 33.0 / 40.0);
  EXPECT_EQ(loader.windows_per_epoch(), 2);  // the fifth row waits for no one: left out
  data::Batch b = loader.next();             // rows 0 and 1: a row-sized piece each
  ASSERT_TRUE(b.docs.defined());
  EXPECT_EQ(b.inputs.to_vector<int32_t>(),
            (std::vector<int32_t>{11, 12, 13, 14, 15, 16, 17, 18, 20, 21, 22, 23, 24, 25, 26, 27}));
  EXPECT_EQ(b.targets.to_vector<int32_t>(),  // a cut document's piece predicts its next piece's first token
            (std::vector<int32_t>{12, -1, -1, -1, 16, 17, 18, 19, 21, 22, 23, 24, 25, 26, 27, 28}));
  EXPECT_EQ(b.docs.to_vector<int32_t>(), std::vector<int32_t>(16, 0));
  b = loader.next();  // rows 2 and 3: documents, then padding (input 0, target -1, its own id)
  EXPECT_EQ(b.inputs.to_vector<int32_t>(),
            (std::vector<int32_t>{5, 6, 7, 8, 9, 10, 19, 0, 0, 1, 2, 3, 4, 0, 0, 0}));
  EXPECT_EQ(b.targets.to_vector<int32_t>(),
            (std::vector<int32_t>{6, 7, 8, 9, 10, -1, -1, -1, 1, -1, -1, -1, -1, -1, -1, -1}));
  EXPECT_EQ(b.docs.to_vector<int32_t>(),
            (std::vector<int32_t>{0, 0, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 0, 1, 1, 1}));
  EXPECT_EQ(loader.next().inputs.to_vector<int32_t>()[0], 11);  // epoch 1: the same rows again
  EXPECT_EQ(loader.state().epoch, 1);
  // an epoch is whole steps: 1 row x 2 micro-steps leaves the fifth row out too
  data::DataLoader accum((d / "train_*.bin").string(), 1, 8, 0, 1, false, 0, 64);
  EXPECT_EQ(accum.windows_per_epoch(), 5);
  accum.set_grad_accum(2);
  EXPECT_EQ(accum.windows_per_epoch(), 4);
  EXPECT_NE(
      error_of([&] { accum.set_grad_accum(6); }).find("pack into 5 rows of 8 tokens but one step takes 6"),
      std::string::npos);
  // a sidecar of the wrong size is one error naming it
  std::ofstream(d / "train_000000.docs", std::ios::binary) << first.substr(0, 30);
  const std::string err =
      error_of([&] { data::DataLoader((d / "train_*.bin").string(), 2, 8, 0, 1, false, 0, 64); });
  EXPECT_NE(err.find("train_000000.docs has 30 bytes but its shard has 33 tokens"), std::string::npos) << err;
  // the same shard without its preparation's sidecars reads as before: windows, no docs, every target trained
  fs::remove(d / data::kPreparationFile);
  data::DataLoader plain((d / "train_*.bin").string(), 2, 8, 0, 1, false, 0, 64);
  EXPECT_FALSE(plain.has_documents());
  b = plain.next();
  EXPECT_FALSE(b.docs.defined());
  std::vector<int32_t> all(16);
  for (int32_t i = 0; i < 16; ++i) all[static_cast<size_t>(i)] = i + 1;
  EXPECT_EQ(b.targets.to_vector<int32_t>(), all);
}

TEST(Packing, FirstFitDecreasingPlacesTheLongestFirstEachInTheFirstRowWithRoom) {
  const std::vector<int64_t> len = {3, 7, 5, 2, 6, 1};
  const data::PackedRows p = data::first_fit_decreasing(len, 10);
  // 7 opens row 0, 6 row 1, 5 row 2; 3 fills row 0, 2 and 1 go to row 1 (first fit in the
  // given order would give {3, 7}, {5, 2, 1}, {6})
  EXPECT_EQ(p.offsets, (std::vector<int64_t>{0, 2, 5, 6}));
  EXPECT_EQ(p.items, (std::vector<int64_t>{1, 0, 4, 3, 5, 2}));
  EXPECT_DOUBLE_EQ(p.efficiency(len, 10), 24.0 / 30.0);
  // equal lengths keep their order; an item that fills a row is never joined
  const data::PackedRows q = data::first_fit_decreasing({4, 4, 8, 4}, 8);
  EXPECT_EQ(q.offsets, (std::vector<int64_t>{0, 1, 3, 4}));
  EXPECT_EQ(q.items, (std::vector<int64_t>{2, 0, 1, 3}));
  EXPECT_EQ(data::first_fit_decreasing({}, 8).rows(), 0);
  // only a document longer than a row is cut: row-sized pieces, the rest last
  EXPECT_EQ(data::split_lengths(7, 3), (std::vector<int64_t>{3, 3, 1}));
  EXPECT_EQ(data::split_lengths(6, 3), (std::vector<int64_t>{3, 3}));
  EXPECT_EQ(data::split_lengths(3, 3), (std::vector<int64_t>{3}));
  EXPECT_NE(error_of([] {
              data::first_fit_decreasing({3, 9}, 8);
            }).find("item 1 has 9 tokens, not 1 .. 8"),
            std::string::npos);
}

// Documents of many lengths (some longer than a row) with distinct tokens 1..N: over one
// shuffled epoch every token is in exactly one row, once; a document no longer than a row is
// whole in one row; and two data-parallel ranks read, together, one process's rows.
TEST_F(FinetuneData, EveryRealTokenIsReadExactlyOncePerEpochAndRanksShareOneProcessRows) {
  const fs::path d = dir_ / "many";
  fs::create_directories(d);
  const int64_t T = 16;
  std::vector<int64_t> doc_len;
  for (int i = 0; i < 40; ++i) doc_len.push_back(1 + (i * 7919) % 23);  // 1 .. 23 tokens
  std::vector<uint32_t> tok;
  std::string first;
  for (int64_t n : doc_len) {
    first += '\1' + std::string(static_cast<size_t>(n - 1), '\0');
    for (int64_t i = 0; i < n; ++i) tok.push_back(static_cast<uint32_t>(tok.size() + 1));
  }
  const int64_t N = static_cast<int64_t>(tok.size());
  data::write_shard((d / "train_000000.bin").string(), tok, data::ShardFormat::u16);
  std::ofstream(d / "train_000000.mask", std::ios::binary) << std::string(tok.size(), '\1');
  std::ofstream(d / "train_000000.docs", std::ios::binary) << first;
  data::Preparation p{d.string(), "0123456789abcdef", "", {{"train_000000.bin", N}}, {}};
  p.sidecars["train_000000.bin"] = {"train_000000.mask", "train_000000.docs", N};
  data::write_preparation(p);
  const std::string pattern = (d / "train_*.bin").string();
  data::DataLoader one(pattern, 1, T, 0, 1, /*shuffle=*/true, /*seed=*/7, 2048);
  int64_t longer = 0;
  for (int64_t n : doc_len) longer += n > T;
  EXPECT_EQ(one.packing().split, longer);
  ASSERT_EQ(one.windows_per_epoch(), one.packing().rows);
  // where each token lies: its document's length and its offset in it
  std::vector<int64_t> len_of(static_cast<size_t>(N + 1)), offset_of(static_cast<size_t>(N + 1));
  for (int64_t i = 0, k = 1; i < static_cast<int64_t>(doc_len.size()); ++i)
    for (int64_t j = 0; j < doc_len[static_cast<size_t>(i)]; ++j, ++k)
      len_of[static_cast<size_t>(k)] = doc_len[static_cast<size_t>(i)], offset_of[static_cast<size_t>(k)] = j;
  std::vector<std::vector<int32_t>> firsts(2);  // each epoch's rows' first tokens
  for (int epoch = 0; epoch < 2; ++epoch) {
    std::vector<int> seen(static_cast<size_t>(N + 1), 0);
    for (int64_t r = 0; r < one.windows_per_epoch(); ++r) {
      const data::Batch b = one.next();
      const std::vector<int32_t> x = b.inputs.to_vector<int32_t>(), y = b.targets.to_vector<int32_t>(),
                                 doc = b.docs.to_vector<int32_t>();
      firsts[static_cast<size_t>(epoch)].push_back(x[0]);
      for (int64_t t = 0; t < T; ++t) {
        if (x[t] == 0) {  // padding, after the documents: its own id, no target
          EXPECT_TRUE(t > 0 && doc[t] == doc[t - 1] + (x[t - 1] != 0)) << "row " << r << " position " << t;
          EXPECT_EQ(y[t], -1);
          continue;
        }
        ++seen[static_cast<size_t>(x[t])];
        const int64_t len = len_of[static_cast<size_t>(x[t])], off = offset_of[static_cast<size_t>(x[t])];
        EXPECT_EQ(y[t], off + 1 < len ? x[t] + 1 : -1) << "token " << x[t];  // within its document
        if (t == 0 || doc[t] != doc[t - 1]) {  // a piece starts: a document's start, or a row's worth into it
          EXPECT_EQ(off % T, 0) << "token " << x[t];
          EXPECT_TRUE(len > T || off == 0) << "a document that fits a row is never cut: token " << x[t];
        } else {
          EXPECT_EQ(x[t], x[t - 1] + 1) << "a piece's tokens in order";
        }
      }
    }
    for (int64_t i = 1; i <= N; ++i) EXPECT_EQ(seen[static_cast<size_t>(i)], 1) << "token " << i;
    EXPECT_EQ(one.state().epoch, epoch);
  }
  EXPECT_NE(firsts[0], firsts[1]) << "data.shuffle orders each epoch's rows anew";
  // and two ranks of one row each read what one process of two rows reads
  data::DataLoader both(pattern, 2, T, 0, 1, true, 7, 2048);
  data::DataLoader r0(pattern, 1, T, 0, 2, true, 7, 2048), r1(pattern, 1, T, 1, 2, true, 7, 2048);
  ASSERT_EQ(both.windows_per_epoch(), r0.windows_per_epoch());
  for (int64_t k = 0; k < both.windows_per_epoch() + 1; ++k) {
    const std::vector<int32_t> w = both.next().inputs.to_vector<int32_t>(),
                               a = r0.next().inputs.to_vector<int32_t>(),
                               c = r1.next().inputs.to_vector<int32_t>();
    EXPECT_EQ(std::vector<int32_t>(w.begin(), w.begin() + T), a) << "micro-step " << k;
    EXPECT_EQ(std::vector<int32_t>(w.begin() + T, w.end()), c) << "micro-step " << k;
  }
}

// Chat rows whose answers follow from their questions.
std::string chat_rows(int n) {
  std::string rows;
  for (int i = 0; i < n; ++i) {
    const std::string k = std::to_string(i % 4);
    rows +=
        R"({"messages": [{"role": "system", "content": "be short"}, {"role": "user", "content": "the cat )" +
        k + R"("}, {"role": "assistant", "content": "the hat )" + k + k + R"("}]})" + "\n";
  }
  return rows;
}

double loss_of(const fs::path& metrics, int64_t step) {
  std::ifstream f(metrics);
  std::string line;
  while (std::getline(f, line)) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("loss") && j["step"].get<int64_t>() == step) return j["loss"].get<double>();
  }
  ADD_FAILURE() << "no loss of step " << step << " in " << metrics;
  return NAN;
}

TEST_F(FinetuneData, TrainGptTrainsOnTheMaskedDocumentsOfChatRows) {
  ASSERT_EQ(prepare("chat", write("chat.jsonl", chat_rows(48)).string(), "--val_fraction 0.15").rc, 0);
  const fs::path d = dir_ / "chat_run";
  fs::create_directories(d);
  std::ofstream(d / "gpt.ini") << "[model]\nn_layer = 1\nn_head = 2\nn_embd = 32\nvocab_size = 264\n"
                                  "vocab_multiple = 4\nblock_size = 128\n[data]\ntrain = "
                               << (dir_ / "chat" / "train_*.bin").string()
                               << "\nval = " << (dir_ / "chat" / "val_*.bin").string()
                               << "\nshuffle = false\n[train]\nseq_len = 128\nmicro_batch_size = 2\n"
                                  "grad_accum_steps = 1\nthreads = 1\n[optim]\nlr = 0.01\nwarmup_steps = 1\n"
                                  "[sample]\nevery = -1\n[log]\nevery = 1\n";
  const std::string run = std::string(NDT_TRAIN_GPT_BIN) + " --config " + (d / "gpt.ini").string();
  // the model train_gpt builds, from a checkpoint of it; its weights drawn here and given to a run
  ShellResult r = run_shell(run + " --train.steps 1 --checkpoint.format sharded --checkpoint.dir " +
                            (d / "ck0").string() + " 2>&1");
  ASSERT_EQ(r.rc, 0) << r.out;
  models::GPT gpt(ckpt::model_config_of(ckpt::find_weights((d / "ck0").string())));
  nn::FlatParams params = nn::materialize(gpt.units(), Device::cpu(), DType::f32, 99);
  ckpt::save_weights((d / "init.safetensors").string(), gpt, params);
  r = run_shell(run + " --train.steps 1 --model.init_from " + (d / "init.safetensors").string() +
                " --log.metrics " + (d / "m1.jsonl").string() + " 2>&1");
  ASSERT_EQ(r.rc, 0) << r.out;
  const double trained = loss_of(d / "m1.jsonl", 1);
  // step 1's loss, directly: the first window, untrained targets -1, positions and attention per document
  data::DataLoader loader((dir_ / "chat" / "train_*.bin").string(), 2, 128, 0, 1, false, 0, 264);
  const data::Batch b = loader.next();
  const double masked = gpt.forward(b.inputs, b.targets, 0, b.docs).loss.item();
  const double no_docs = gpt.forward(b.inputs, b.targets).loss.item();
  std::vector<uint32_t> tok(257);
  data::Shard((dir_ / "chat" / "train_000000.bin").string()).read(0, 257, tok.data());
  std::vector<int32_t> next(tok.begin() + 1, tok.end());
  const double every_token = gpt.forward(b.inputs, Tensor::from_vector(next, {2, 128})).loss.item();
  EXPECT_NEAR(trained, masked, 1e-6 * masked) << "no docs " << no_docs << ", every token " << every_token;
  EXPECT_GT(std::abs(masked - no_docs), 1e-3) << "the test must tell documents apart";
  EXPECT_GT(std::abs(masked - every_token), 1e-2) << "the test must tell the mask apart";
  // and it learns the answers
  r = run_shell(run + " --train.steps 60 --log.metrics " + (d / "m60.jsonl").string() + " 2>&1");
  ASSERT_EQ(r.rc, 0) << r.out;
  const double first = loss_of(d / "m60.jsonl", 1), last = loss_of(d / "m60.jsonl", 60);
  EXPECT_LT(last, 0.5 * first) << r.out;
}

// The files a model folder holds beside its tokenizer.json (its tokenizer_config.json, its
// chat_template.jinja) go with the shards prepare_text makes, byte for byte, and from them
// into a run's checkpoints (so that generate --chat and an export find the template); a
// preparation with a tokenizer that has none removes the earlier ones with --overwrite.
TEST_F(FinetuneData, TheTokenizersChatTemplateTravelsWithTheShardsIntoTheCheckpoints) {
  const fs::path rows = write("travel.jsonl", chat_rows(8));
  ASSERT_EQ(prepare("travel", rows.string()).rc, 0);
  for (const char* f : {"tokenizer_config.json", "chat_template.jinja"}) {
    ASSERT_TRUE(fs::exists(dir_ / "model" / f)) << f;
    EXPECT_EQ(read_bytes(dir_ / "travel" / f), read_bytes(dir_ / "model" / f)) << f;
  }
  const fs::path d = dir_ / "travel_run";
  const ShellResult r =
      run_shell(std::string(NDT_TRAIN_GPT_BIN) +
                " --model.n_layer 1 --model.n_head 2 --model.n_embd 32 --model.vocab_size 264"
                " --model.block_size 64 --train.seq_len 64 --train.micro_batch_size 1"
                " --train.steps 1 --sample.every -1 --out '' --checkpoint.dir " +
                (d / "ck").string() + " --data.train " + (dir_ / "travel" / "train_*.bin").string() +
                " --data.val " + (dir_ / "travel" / "val_*.bin").string() + " 2>&1");
  ASSERT_EQ(r.rc, 0) << r.out;
  const ckpt::TokenizerFiles carried = ckpt::read_tokenizer_files((d / "ck" / "step_00000001").string());
  EXPECT_EQ(carried.vocabulary, "tokenizer.json");
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"}) {
    ASSERT_TRUE(carried.files.count(f)) << f;
    EXPECT_EQ(carried.files.at(f), read_bytes(dir_ / "model" / f)) << f;
  }
  // another tokenizer folder without them: --overwrite leaves none of the earlier ones behind
  fs::create_directories(dir_ / "bare");
  fs::copy_file(dir_ / "model" / "tokenizer.json", dir_ / "bare" / "tokenizer.json",
                fs::copy_options::overwrite_existing);
  const ShellResult again =
      run_shell(std::string(NDT_PREPARE_TEXT_BIN) + " --out " + (dir_ / "travel").string() +
                " --overwrite --tokenizer " + (dir_ / "bare").string() + " " +
                write("travel.txt", "the cat sat").string() + " 2>&1");
  ASSERT_EQ(again.rc, 0) << again.out;
  EXPECT_FALSE(fs::exists(dir_ / "travel" / "tokenizer_config.json"));
  EXPECT_FALSE(fs::exists(dir_ / "travel" / "chat_template.jinja"));
}

// Packed rows end to end: train_gpt says its packing in one line; a run stopped and resumed
// from its checkpoint trains on the same rows as an uninterrupted one (shuffled, across an
// epoch's end), step for step, and so does one resumed with another micro-batch split.
TEST_F(FinetuneData, TrainGptOnPackedRowsResumesOnTheSameRows) {
  ASSERT_EQ(prepare("packed", write("packed.jsonl", chat_rows(40)).string(), "--val_fraction 0.1").rc, 0);
  const fs::path d = dir_ / "packed_run";
  fs::create_directories(d);
  std::ofstream(d / "gpt.ini") << "[model]\nn_layer = 1\nn_head = 2\nn_embd = 32\nvocab_size = 264\n"
                                  "vocab_multiple = 4\nblock_size = 128\n[data]\ntrain = "
                               << (dir_ / "packed" / "train_*.bin").string()
                               << "\nval = " << (dir_ / "packed" / "val_*.bin").string()
                               << "\nshuffle = true\n[train]\nseq_len = 128\nmicro_batch_size = 2\n"
                                  "grad_accum_steps = 1\nthreads = 1\nseed = 5\n[optim]\n"
                                  "lr = 0.01\nwarmup_steps = 1\n[sample]\nevery = -1\n[log]\nevery = 1\n";
  // the loader's own figures; the runs cross an epoch's end, and the resumed one starts after it
  data::DataLoader loader((dir_ / "packed" / "train_*.bin").string(), 2, 128, 0, 1, true, 5, 264);
  const data::PackingStats& p = loader.packing();
  const int64_t W = loader.windows_per_epoch(), steps = W + 4, stop = W + 1;
  ASSERT_GE(W, 3);
  const std::string run = std::string(NDT_TRAIN_GPT_BIN) + " --config " + (d / "gpt.ini").string() +
                          " --train.steps " + std::to_string(steps);
  ShellResult r = run_shell(run + " --log.metrics " + (d / "whole.jsonl").string() + " 2>&1");
  ASSERT_EQ(r.rc, 0) << r.out;
  char pct[16];
  std::snprintf(pct, sizeof(pct), "%.1f%%", 100.0 * p.efficiency);
  const std::string line = "packing: " + std::to_string(p.documents) +
                           " documents (0 longer than a row, cut into row-sized pieces) in " +
                           std::to_string(p.rows) + " rows of 128 per epoch";
  EXPECT_NE(r.out.find(line), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(std::string(", efficiency ") + pct), std::string::npos) << r.out;
  const double per_step = static_cast<double>(p.trained_targets) / static_cast<double>(p.rows) * 2;
  EXPECT_NE(r.out.find(std::to_string(std::llround(per_step)) + " trained tokens per step (mean)"),
            std::string::npos)
      << r.out;
  // stopped one step into the second epoch, then resumed: the same losses
  const std::string ck = " --checkpoint.dir " + (d / "ck").string();
  const std::string stop_after = " --train.stop_after " + std::to_string(stop);
  r = run_shell(run + ck + stop_after + " 2>&1");
  ASSERT_EQ(r.rc, 0) << r.out;
  r = run_shell(run + ck + " --checkpoint.resume true --log.metrics " + (d / "rest.jsonl").string() +
                " 2>&1");
  ASSERT_EQ(r.rc, 0) << r.out;
  for (int64_t step = stop + 1; step <= steps; ++step) {
    const double want = loss_of(d / "whole.jsonl", step);
    EXPECT_NEAR(loss_of(d / "rest.jsonl", step), want, 1e-6 * want) << "step " << step;
  }
  // resumed as 1 row x 2 accumulation steps: the same rows of each step
  fs::remove_all(d / "ck");
  r = run_shell(run + ck + stop_after + " 2>&1");
  ASSERT_EQ(r.rc, 0) << r.out;
  r = run_shell(run + ck +
                " --checkpoint.resume true --train.micro_batch_size 1 --train.grad_accum_steps 2 " +
                "--log.metrics " + (d / "split.jsonl").string() + " 2>&1");
  ASSERT_EQ(r.rc, 0) << r.out;
  for (int64_t step = stop + 1; step <= steps; ++step) {
    const double want = loss_of(d / "whole.jsonl", step);
    EXPECT_NEAR(loss_of(d / "split.jsonl", step), want, 1e-5 * want) << "step " << step;
  }
}

}  // namespace
