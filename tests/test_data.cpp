// Token shards, the loader's order (sequential and shuffled), vocabularies, and the errors
// for bad data.
#include <gtest/gtest.h>

#include "support/testing.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <numeric>

#include "tokenizer/tokenizer.h"
#include "train/data/data.h"
#include "train/data/preparation.h"
#include "train/data/text.h"
#include "train/data/vocab.h"

using namespace ndt;
using ndt::testing::error_of;
namespace fs = std::filesystem;

namespace {

std::vector<uint16_t> iota_tokens(int64_t n, int mod) {
  std::vector<uint16_t> t(n);
  for (int64_t i = 0; i < n; ++i) t[i] = static_cast<uint16_t>(i % mod);
  return t;
}

// A preparation as prepare_text leaves it: shards of `sizes` tokens (train_NNNNNN.bin, the
// last val_000000.bin), vocab.json, and preparation.json naming them.
void write_preparation(const fs::path& d, const std::vector<int64_t>& sizes, const std::string& id) {
  data::Preparation p{d.string(), id, "vocab.json", {}};
  for (size_t i = 0; i < sizes.size(); ++i) {
    char name[32];
    std::snprintf(name, sizeof(name), i + 1 < sizes.size() ? "train_%06zu.bin" : "val_000000.bin", i);
    data::write_shard((d / name).string(), iota_tokens(sizes[i], 50));
    p.shards.emplace_back(name, sizes[i]);
  }
  data::Vocab::byte_level().save((d / "vocab.json").string());
  data::write_preparation(p);
}

}  // namespace

TEST(Data, SequentialBatchesFollowTheStreamAcrossShards) {
  fs::path d = ndt::testing::fresh_dir("data_seq");
  // two shards: 50 and 30 tokens, values = global index, so positions are visible
  std::vector<uint16_t> all(80);
  std::iota(all.begin(), all.end(), 0);
  data::write_shard((d / "train_000.bin").string(), {all.begin(), all.begin() + 50});
  data::write_shard((d / "train_001.bin").string(), {all.begin() + 50, all.end()});
  const int64_t B = 2, T = 5;  // 10 tokens a batch, 11 read
  data::DataLoader dl((d / "train_*.bin").string(), B, T, 0, 1, false, 0, 1000);
  // shard 0: windows at 0, 10, 20, 30 (40+11 > 50); shard 1: 0, 10 (20+11 > 30)
  EXPECT_EQ(dl.windows_per_epoch(), 6);
  const std::vector<int> starts = {0, 10, 20, 30, 50, 60, 0, 10};
  for (size_t k = 0; k < starts.size(); ++k) {
    data::Batch b = dl.next();
    std::vector<int32_t> x = b.inputs.to_vector<int32_t>(), y = b.targets.to_vector<int32_t>();
    ASSERT_EQ(b.inputs.shape(), (Shape{B, T}));
    for (int64_t i = 0; i < B * T; ++i) {
      EXPECT_EQ(x[i], starts[k] + i) << "batch " << k;
      EXPECT_EQ(y[i], starts[k] + i + 1) << "batch " << k;
    }
  }
  EXPECT_EQ(dl.state().epoch, 1);
}

TEST(Data, RanksTakeConsecutiveWindows) {
  fs::path d = ndt::testing::fresh_dir("data_ranks");
  std::vector<uint16_t> all(100);
  std::iota(all.begin(), all.end(), 0);
  data::write_shard((d / "s.bin").string(), all);
  data::DataLoader r0((d / "s.bin").string(), 1, 4, 0, 2, false, 0, 1000),
      r1((d / "s.bin").string(), 1, 4, 1, 2, false, 0, 1000);
  for (int k = 0; k < 3; ++k) {
    EXPECT_EQ(r0.next().inputs.to_vector<int32_t>()[0], 8 * k);
    EXPECT_EQ(r1.next().inputs.to_vector<int32_t>()[0], 8 * k + 4);
  }
}

TEST(Data, ShuffleIsASeededPermutationPerEpochAndRestores) {
  fs::path d = ndt::testing::fresh_dir("data_shuf");
  std::vector<uint16_t> all(401);
  std::iota(all.begin(), all.end(), 0);
  data::write_shard((d / "s.bin").string(), all);
  auto epoch_starts = [&](data::DataLoader& dl) {
    std::vector<int32_t> s;
    for (int64_t i = 0; i < dl.windows_per_epoch(); ++i)
      s.push_back(dl.next().inputs.to_vector<int32_t>()[0]);
    return s;
  };
  data::DataLoader a((d / "s.bin").string(), 1, 10, 0, 1, true, 7, 1000),
      b((d / "s.bin").string(), 1, 10, 0, 1, true, 7, 1000);
  std::vector<int32_t> e0 = epoch_starts(a), e1 = epoch_starts(a);
  EXPECT_EQ(e0, epoch_starts(b));  // same seed, same order
  std::vector<int32_t> sorted = e0;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i) EXPECT_EQ(sorted[i], 10 * static_cast<int>(i));  // a permutation
  EXPECT_NE(e0, e1);  // a new order each epoch
  std::vector<int32_t> seq(e0.size());
  for (size_t i = 0; i < seq.size(); ++i) seq[i] = 10 * static_cast<int>(i);
  EXPECT_NE(e0, seq);
  // restore mid-epoch
  data::DataLoader c((d / "s.bin").string(), 1, 10, 0, 1, true, 7, 1000);
  c.restore({1, 5});
  EXPECT_EQ(c.next().inputs.to_vector<int32_t>()[0], e1[5]);
}

// Golden: shards without documents are read in windows, as they always were: these orders
// are those of the loader before documents were packed (seed 7, two ranks, two epochs).
TEST(Data, ShuffledWindowsOfTwoRanksAreTheGoldenOrder) {
  fs::path d = ndt::testing::fresh_dir("data_golden");
  std::vector<uint16_t> all(203);
  std::iota(all.begin(), all.end(), 0);
  data::write_shard((d / "s.bin").string(), all);
  data::DataLoader r0((d / "s.bin").string(), 2, 5, 0, 2, true, 7, 1000),
      r1((d / "s.bin").string(), 2, 5, 1, 2, true, 7, 1000);
  ASSERT_EQ(r0.windows_per_epoch(), 10);
  const std::vector<int32_t> golden = {160, 180, 140, 40,  100, 80, 20, 120, 0,  60,    // epoch 0
                                       120, 160, 180, 140, 40,  20, 0,  80,  60, 100};  // epoch 1
  for (size_t k = 0; k < golden.size(); ++k) {
    for (auto [dl, offset] : {std::pair{&r0, 0}, std::pair{&r1, 10}}) {
      const data::Batch b = dl->next();
      EXPECT_FALSE(b.docs.defined());
      std::vector<int32_t> x(10), y(10);
      for (int32_t i = 0; i < 10; ++i) x[i] = golden[k] + offset + i, y[i] = x[i] + 1;
      EXPECT_EQ(b.inputs.to_vector<int32_t>(), x) << "batch " << k << " offset " << offset;
      EXPECT_EQ(b.targets.to_vector<int32_t>(), y) << "batch " << k << " offset " << offset;
    }
  }
}

TEST(Data, BadShardsGiveClearErrors) {
  fs::path d = ndt::testing::fresh_dir("data_bad");
  data::write_shard((d / "good.bin").string(), iota_tokens(100, 50));
  // bad magic
  {
    std::vector<char> bytes(1024 + 200, 0);
    int32_t h[3] = {12345, 1, 100};
    std::memcpy(bytes.data(), h, sizeof(h));
    std::ofstream((d / "magic.bin").string(), std::ios::binary).write(bytes.data(), bytes.size());
  }
  EXPECT_NE(error_of([&] { data::Shard s((d / "magic.bin").string()); }).find("bad magic 12345"),
            std::string::npos);
  // truncated: header says 100 tokens, file holds 60
  {
    std::ifstream in((d / "good.bin").string(), std::ios::binary);
    std::vector<char> bytes(1024 + 120);
    in.read(bytes.data(), bytes.size());
    std::ofstream((d / "trunc.bin").string(), std::ios::binary).write(bytes.data(), bytes.size());
  }
  std::string e = error_of([&] { data::Shard s((d / "trunc.bin").string()); });
  EXPECT_NE(e.find("truncated"), std::string::npos) << e;
  EXPECT_NE(e.find("trunc.bin"), std::string::npos) << e;
  // too short for a header
  std::ofstream((d / "short.bin").string()) << "hello";
  EXPECT_NE(error_of([&] { data::Shard s((d / "short.bin").string()); }).find("too short"),
            std::string::npos);
  // missing
  EXPECT_NE(error_of([&] {
              data::DataLoader l((d / "nope_*.bin").string(), 1, 4, 0, 1, false, 0, 50);
            }).find("no data files match"),
            std::string::npos);
  // token >= vocab_size
  e = error_of([&] {
    data::DataLoader l((d / "good.bin").string(), 1, 4, 0, 1, false, 0, 3);
    l.next();
  });
  EXPECT_NE(e.find("token 3 at position 3 is >= model.vocab_size 3"), std::string::npos) << e;
  // not enough tokens for one batch
  e = error_of([&] { data::DataLoader l((d / "good.bin").string(), 10, 10, 0, 1, false, 0, 50); });
  EXPECT_NE(e.find("101 tokens are needed"), std::string::npos) << e;
}

TEST(Data, Uint32ShardsAreLlama3sFormatAndReadBesideUint16Ones) {
  fs::path d = ndt::testing::fresh_dir("data_u32");
  // llm.c's Llama 3 format: magic 20240801, version 7, uint32 tokens
  std::vector<uint32_t> big(60);
  for (size_t i = 0; i < big.size(); ++i) big[i] = 128000 + static_cast<uint32_t>(i);
  EXPECT_EQ(data::shard_format_for(big), data::ShardFormat::u32);
  EXPECT_EQ(data::shard_format_for({0, 65535}), data::ShardFormat::u16);
  data::write_shard((d / "train_000.bin").string(), big, data::ShardFormat::u32);
  {
    std::ifstream in((d / "train_000.bin").string(), std::ios::binary);
    int32_t h[3];
    in.read(reinterpret_cast<char*>(h), sizeof(h));
    EXPECT_EQ(h[0], 20240801);
    EXPECT_EQ(h[1], 7);
    EXPECT_EQ(h[2], 60);
    EXPECT_EQ(fs::file_size(d / "train_000.bin"), 1024u + 4 * 60);
  }
  data::Shard s((d / "train_000.bin").string());
  EXPECT_EQ(s.format(), data::ShardFormat::u32);
  std::vector<uint32_t> got(5);
  s.read(55, 5, got.data());
  EXPECT_EQ(got, std::vector<uint32_t>(big.end() - 5, big.end()));
  // a uint16 shard after it: the loader reads both
  data::write_shard((d / "train_001.bin").string(), std::vector<uint32_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11},
                    data::ShardFormat::u16);
  EXPECT_EQ(data::Shard((d / "train_001.bin").string()).format(), data::ShardFormat::u16);
  data::DataLoader dl((d / "train_*.bin").string(), 1, 10, 0, 1, false, 0, 200000);
  EXPECT_EQ(dl.total_tokens(), 71);
  std::vector<int32_t> x;
  for (int k = 0; k < 6; ++k)
    x = dl.next().inputs.to_vector<int32_t>();  // 5 windows in shard 0, then shard 1
  EXPECT_EQ(x, std::vector<int32_t>({1, 2, 3, 4, 5, 6, 7, 8, 9, 10}));
  // a token the model's vocabulary does not hold: the file and the position
  std::string e =
      error_of([&] { data::DataLoader l((d / "train_000.bin").string(), 1, 10, 0, 1, false, 0, 128050); });
  EXPECT_NE(e.find("train_000.bin: token 128050 at position 50 is >= model.vocab_size 128050"),
            std::string::npos)
      << e;
  // a uint16 shard cannot hold it; a wrong version for the magic
  e = error_of([&] { data::write_shard((d / "x.bin").string(), big, data::ShardFormat::u16); });
  EXPECT_NE(e.find("token 128000 at position 0 does not fit a uint16 shard"), std::string::npos) << e;
  {
    std::vector<char> bytes(1024 + 40, 0);
    int32_t h[3] = {20240801, 1, 10};
    std::memcpy(bytes.data(), h, sizeof(h));
    std::ofstream((d / "version.bin").string(), std::ios::binary).write(bytes.data(), bytes.size());
  }
  e = error_of([&] { data::Shard v((d / "version.bin").string()); });
  EXPECT_NE(e.find("unsupported version 1 for magic 20240801 (expected 7)"), std::string::npos) << e;
}

TEST(Vocab, CharRoundTripAndSaveLoad) {
  fs::path d = ndt::testing::fresh_dir("data_vocab");
  const std::string text = "Hello, w\xc3\xb6rld!\n\tTabs and \xe2\x82\xac.";
  data::Vocab v = data::Vocab::build_char(text);
  std::vector<uint16_t> ids = v.encode(text);
  EXPECT_EQ(ids.size(), data::utf8_chars(text).size());
  v.save((d / "vocab.json").string());
  data::Vocab w = data::Vocab::load((d / "vocab.json").string());
  EXPECT_EQ(w.size(), v.size());
  std::vector<int32_t> ids32(ids.begin(), ids.end());
  EXPECT_EQ(w.decode(ids32), text);
  EXPECT_THROW(v.encode("Q"), Error);
  data::Vocab b = data::Vocab::byte_level();
  EXPECT_EQ(b.size(), 256);
  std::vector<uint16_t> bi = b.encode(
      "\xff"
      "a");
  EXPECT_EQ(bi, (std::vector<uint16_t>{255, 97}));
  std::ofstream((d / "bad.json").string()) << "{ not json";
  EXPECT_THROW(data::Vocab::load((d / "bad.json").string()), Error);
}

// A run reads one preparation's shards: a leftover of an earlier preparation in the folder
// (prepare_text run twice into it), shards of two folders' preparations, or a preparation's
// beside shards without one are refused in one line naming two shards; shards whose folder
// has no preparation.json (llm.c's) are read as before.
// A char or byte vocabulary as a Hugging Face tokenizer.json, and back: the same ids and
// text through TextCodec (which reads that form as the vocabulary); a char vocabulary holding
// bytes that are not UTF-8 has no such form; a model's tokenizer.json is not taken for one.
TEST(Vocab, CharAndByteVocabulariesAsTokenizerJsonReadBackTheSame) {
  const fs::path d = ndt::testing::fresh_dir("vocab_tokenizer_json");
  const std::string text = "h\u00e9llo w\u00f6rld\n\t\u4e2d\U0001F600 ab\r\n";
  for (const data::Vocab& v : {data::Vocab::build_char(text), data::Vocab::byte_level()}) {
    const std::optional<std::string> j = v.to_tokenizer_json();
    ASSERT_TRUE(j);
    fs::create_directories(d / std::to_string(v.size()));
    const fs::path file = d / std::to_string(v.size()) / "tokenizer.json";
    std::ofstream(file) << *j;
    const data::TextCodec c = data::TextCodec::load(file.string());
    EXPECT_EQ(c.describe(), file.string() + " (" + (v.kind() == data::Vocab::kChar ? "char" : "byte") +
                                " vocabulary, " + std::to_string(v.size()) + " tokens)");
    const std::vector<uint16_t> ids = v.encode(text);
    EXPECT_EQ(c.encode_prompt(text), std::vector<int32_t>(ids.begin(), ids.end()));
    EXPECT_EQ(c.decode(c.encode_prompt(text)), text);
    EXPECT_EQ(data::Vocab::from_tokenizer_json(*j, "t")->to_json(), v.to_json());
    if (v.kind() == data::Vocab::kByte)  // byte-level BPE as tokenizers reads it: each byte its id
      EXPECT_EQ(tok::Tokenizer::from_json(*j).encode(text), std::vector<int32_t>(ids.begin(), ids.end()));
  }
  EXPECT_FALSE(data::Vocab::build_char("ab\xff").to_tokenizer_json());  // a raw byte is no character
  std::string changed = *data::Vocab::build_char("abc").to_tokenizer_json();
  changed.replace(changed.find("Fuse"), 4, "BPEDecoder");
  EXPECT_FALSE(data::Vocab::from_tokenizer_json(changed, "t"));
  EXPECT_FALSE(data::Vocab::from_tokenizer_json("{\"model\": {\"type\": 3}}", "t"));
  EXPECT_NE(error_of([] {
              data::Vocab::from_tokenizer_json("{", "x/tokenizer.json");
            }).find("tokenizer x/tokenizer.json: not valid JSON"),
            std::string::npos);
}

TEST(Data, TheLoaderReadsTheShardsOfOnePreparation) {
  const fs::path d = ndt::testing::fresh_dir("data_prep");
  fs::create_directories(d / "a");
  fs::create_directories(d / "b");
  fs::create_directories(d / "bare");
  write_preparation(d / "a", {100, 100, 20}, "00000000000000aa");
  write_preparation(d / "b", {100, 20}, "00000000000000bb");
  data::write_shard((d / "bare" / "train_000000.bin").string(), iota_tokens(100, 50));
  auto loader = [&](const std::string& pattern) {
    data::DataLoader l((d / pattern).string(), 1, 10, 0, 1, false, 0, 256);
    return l.total_tokens();
  };
  EXPECT_EQ(loader("a/train_*.bin"), 200);
  EXPECT_EQ(loader("bare/train_*.bin"), 100);  // no preparation.json: as before
  const auto a = data::preparation_of(data::glob_paths((d / "a/*.bin").string()));
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->id, "00000000000000aa");
  EXPECT_FALSE(data::preparation_of({(d / "bare" / "train_000000.bin").string()}).has_value());
  // the earlier preparation's shard left in b (b's preparation wrote one train shard)
  fs::copy_file(d / "a" / "train_000001.bin", d / "b" / "train_000001.bin");
  std::string e = error_of([&] { loader("b/train_*.bin"); });
  EXPECT_NE(e.find("data shard " + (d / "b" / "train_000001.bin").string() +
                   " is not one of the 2 shards that " + (d / "b" / "preparation.json").string() + " lists"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("prepare_text --overwrite"), std::string::npos) << e;
  EXPECT_EQ(std::count(e.begin(), e.end(), '\n'), 0) << e;
  fs::remove(d / "b" / "train_000001.bin");
  // two folders' preparations, in one glob or as train and val
  e = error_of([&] { loader("*/train_000000.bin"); });
  EXPECT_NE(e.find("come from two preparations"), std::string::npos) << e;
  EXPECT_NE(e.find((d / "a" / "train_000000.bin").string() + " and "), std::string::npos) << e;
  e = error_of([&] {
    data::preparation_of({(d / "a" / "train_000000.bin").string(), (d / "b" / "val_000000.bin").string()});
  });
  EXPECT_NE(e.find("data shards " + (d / "a" / "train_000000.bin").string() + " and " +
                   (d / "b" / "val_000000.bin").string() + " come from two preparations (" +
                   (d / "a" / "preparation.json").string() + ": 00000000000000aa, " +
                   (d / "b" / "preparation.json").string() + ": 00000000000000bb)"),
            std::string::npos)
      << e;
  // a preparation's shards with shards made elsewhere
  e = error_of([&] {
    data::preparation_of({(d / "bare" / "train_000000.bin").string(), (d / "a" / "val_000000.bin").string()});
  });
  EXPECT_NE(e.find("has no preparation.json"), std::string::npos) << e;
  // a shard replaced after the preparation: its token count is not the one listed
  data::write_shard((d / "a" / "train_000001.bin").string(), iota_tokens(90, 50));
  e = error_of([&] { loader("a/train_*.bin"); });
  EXPECT_NE(e.find("holds 90 tokens but " + (d / "a").string() + "/preparation.json lists 100"),
            std::string::npos)
      << e;
  // a manifest that prepare_text did not write
  std::ofstream((d / "b" / "preparation.json").string()) << R"({"preparation": "x", "shards": []})";
  e = error_of([&] { loader("b/train_*.bin"); });
  EXPECT_NE(e.find((d / "b" / "preparation.json").string() + ": no \"vocabulary\" string"), std::string::npos)
      << e;
}

// The vocabulary beside the shards is the one their preparation wrote: a tokenizer.json left
// by an earlier preparation does not win over the new vocab.json. Without preparation.json,
// a folder holding both is refused (either may be the leftover).
TEST(Data, TheVocabularyIsTheOneThePreparationWrote) {
  const fs::path d = ndt::testing::fresh_dir("data_prep_vocab");
  write_preparation(d, {100, 20}, "00000000000000cc");
  std::ofstream((d / "tokenizer.json").string()) << "{}";  // the earlier preparation's
  const std::string pattern = (d / "train_*.bin").string();
  EXPECT_EQ(data::vocabulary_path("", pattern), (d / "vocab.json").string());
  EXPECT_EQ(data::vocabulary_path("my/vocab.json", pattern), "my/vocab.json");  // data.vocab wins
  // the one it names is gone
  fs::rename(d / "vocab.json", d / "vocab.old");
  std::string e = error_of([&] { data::vocabulary_path("", pattern); });
  EXPECT_NE(e.find("the vocabulary " + (d / "vocab.json").string() + " that " + d.string() +
                   "/preparation.json names is missing"),
            std::string::npos)
      << e;
  fs::rename(d / "vocab.old", d / "vocab.json");
  // shards without preparation.json: the folder's one vocabulary, and no guess between two
  fs::remove(d / "preparation.json");
  e = error_of([&] { data::vocabulary_path("", pattern); });
  EXPECT_NE(e.find("holds both tokenizer.json and vocab.json"), std::string::npos) << e;
  fs::remove(d / "tokenizer.json");
  EXPECT_EQ(data::vocabulary_path("", pattern), (d / "vocab.json").string());
  fs::remove(d / "vocab.json");
  EXPECT_EQ(data::vocabulary_path("", pattern), "");
}

// What prepare_text counts as a preparation's files in its output folder, and how it names them.
TEST(Data, APreparationsFilesAreItsShardsVocabularyAndManifest) {
  const fs::path d = ndt::testing::fresh_dir("data_prep_files");
  EXPECT_TRUE(data::preparation_files((d / "none").string()).empty());
  write_preparation(d, {10, 10, 10, 5}, "00000000000000dd");
  for (const char* other : {"notes.txt", "model.bin", "tokenizer.json.tmp"})
    std::ofstream((d / other).string()) << "x";
  const std::vector<std::string> files = data::preparation_files(d.string());
  EXPECT_EQ(files, (std::vector<std::string>{"preparation.json", "tokenizer.json.tmp", "train_000000.bin",
                                             "train_000001.bin", "train_000002.bin", "val_000000.bin",
                                             "vocab.json"}));
  EXPECT_EQ(
      data::describe_files(files),
      "preparation.json, tokenizer.json.tmp, vocab.json and 4 shards (train_000000.bin ... val_000000.bin)");
  EXPECT_EQ(data::describe_files({"train_000000.bin"}), "1 shard (train_000000.bin)");
}
