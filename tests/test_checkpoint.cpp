// safetensors I/O, GPT weights with Hugging Face names, and training checkpoints (full and
// sharded: a damaged or crafted manifest, shard file or value is one line naming it).
#include <gtest/gtest.h>

#include "support/corpus.h"
#include "support/hf_fixture.h"
#include "support/launch.h"
#include "support/testing.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "dist/comm/mpi.h"
#include "dist/mesh.h"
#include "dist/tensor_parallel/tensor_parallel.h"
#include "models/gpt.h"
#include "optim/adamw.h"
#include "tensor/kernels.h"
#include "train/checkpoint/checkpoint.h"
#include "train/checkpoint/hf.h"
#include "train/checkpoint/sharded.h"
#include "train/config.h"
#include "train/data/text.h"
#include "train/io/files.h"
#include "train/io/hf_folder.h"
#include "train/io/safetensors.h"

using namespace ndt;
using ndt::testing::error_of;
using ndt::testing::snapshot;  // to show that a refused export changed nothing
namespace fs = std::filesystem;

namespace {

// 2 blocks, C 8, 2 heads, 6 positions; a vocabulary of 10 padded to 16 rows in memory
// and saved with 10.
models::GPTConfig padded_vocab_gpt() {
  return {.n_layer = 2, .n_head = 2, .n_embd = 8, .vocab_size = 10, .block_size = 6, .vocab_multiple = 8};
}

// Writes a safetensors file by hand from (name, dtype, shape, raw bytes).
struct Raw {
  std::string name, dtype;
  Shape shape;
  std::string bytes;
};
void write_raw(const fs::path& path, const std::vector<Raw>& ts) {
  nlohmann::json h;
  uint64_t off = 0;
  for (const Raw& t : ts) {
    h[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {off, off + t.bytes.size()}}};
    off += t.bytes.size();
  }
  std::string hs = h.dump();
  uint64_t n = hs.size();
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(&n), 8);
  f << hs;
  for (const Raw& t : ts) f << t.bytes;
}

// Every tensor of a GPT as HF would name them, from a model's parameters.
std::vector<Raw> hf_tensors(const models::GPT& gpt, const nn::FlatParams& params, const std::string& prefix) {
  std::vector<Raw> out;
  for (const nn::ParamSpec& s : gpt.parameters()) {
    Tensor v = params.find(s.name)->value;
    if (s.name == "wte.weight") v = v.narrow(0, 0, gpt.cfg.vocab_size);
    std::vector<float> f = v.to_vector<float>();
    out.push_back({prefix + s.name, "F32", v.shape(),
                   std::string(reinterpret_cast<const char*>(f.data()), f.size() * 4)});
  }
  return out;
}

}  // namespace

TEST(SafeTensors, RoundTripKeepsDtypesShapesAndMetadata) {
  fs::path d = ndt::testing::fresh_dir("ckpt_rt");
  Tensor a = Tensor::empty({3, 5});
  kernels::fill_normal(a, 1, 1, 0, 0.0f, 1.0f);
  Tensor b = a.to(DType::bf16);
  Tensor c = Tensor::from_vector<int32_t>({1, -2, 3}, {3});
  io::SafeTensorsWriter w;
  w.add("a", a);
  w.add("b", b);
  w.add("c", c);
  w.metadata["step"] = "7";
  w.write((d / "x.safetensors").string());
  EXPECT_FALSE(fs::exists(d / "x.safetensors.tmp"));
  io::SafeTensorsReader r((d / "x.safetensors").string());
  EXPECT_EQ(r.entries().at("b").dtype, "BF16");
  EXPECT_EQ(r.metadata().at("step"), "7");
  EXPECT_EQ(r.get("a").to_vector<float>(), a.to_vector<float>());
  EXPECT_EQ(r.get("b").to_vector<float>(), b.to_vector<float>());  // bf16 widens exactly
  EXPECT_EQ(r.get("c", DType::i32).to_vector<int32_t>(), c.to_vector<int32_t>());
}

TEST(SafeTensors, ReadsHalfPrecision) {
  fs::path d = ndt::testing::fresh_dir("ckpt_f16");
  // 1.0, -2.5, 65504 (max half), 2^-24 (smallest subnormal)
  const uint16_t h[4] = {0x3C00, 0xC100, 0x7BFF, 0x0001};
  write_raw(d / "h.safetensors", {{"x", "F16", {4}, std::string(reinterpret_cast<const char*>(h), 8)}});
  io::SafeTensorsReader r((d / "h.safetensors").string());
  std::vector<float> v = r.get("x").to_vector<float>();
  EXPECT_EQ(v, (std::vector<float>{1.0f, -2.5f, 65504.0f, std::ldexp(1.0f, -24)}));
}

TEST(SafeTensors, CorruptFilesGiveClearErrors) {
  fs::path d = ndt::testing::fresh_dir("ckpt_corrupt");
  std::ofstream(d / "short.safetensors") << "abc";
  EXPECT_NE(error_of([&] {
              io::SafeTensorsReader r((d / "short.safetensors").string());
            }).find("not a safetensors file"),
            std::string::npos);
  {
    std::ofstream f(d / "hdr.safetensors", std::ios::binary);
    uint64_t n = 1000;
    f.write(reinterpret_cast<const char*>(&n), 8);
    f << "{}";
  }
  EXPECT_NE(error_of([&] {
              io::SafeTensorsReader r((d / "hdr.safetensors").string());
            }).find("exceeds the file size"),
            std::string::npos);
  write_raw(d / "range.safetensors", {{"x", "F32", {4}, std::string(8, '\0')}});  // 8 bytes for 16 needed
  EXPECT_NE(error_of([&] {
              io::SafeTensorsReader r((d / "range.safetensors").string());
            }).find("do not match its shape"),
            std::string::npos);
}

TEST(Weights, SaveLoadRoundTripWithHuggingFaceNames) {
  fs::path d = ndt::testing::fresh_dir("ckpt_weights");
  models::GPT g1(padded_vocab_gpt()), g2(padded_vocab_gpt());
  nn::FlatParams p1 = nn::materialize(g1.units(), Device::cpu(), DType::f32, 1);
  nn::FlatParams p2 = nn::materialize(g2.units(), Device::cpu(), DType::f32, 2);
  ckpt::save_weights((d / "m.safetensors").string(), g1, p1);
  io::SafeTensorsReader r((d / "m.safetensors").string());
  EXPECT_TRUE(r.has("h.1.attn.c_attn.weight"));
  EXPECT_EQ(r.entries().at("h.1.attn.c_attn.weight").shape, (Shape{8, 24}));  // Conv1D: in x out
  EXPECT_EQ(r.entries().at("h.0.mlp.c_fc.weight").shape, (Shape{8, 32}));
  EXPECT_EQ(r.entries().at("wte.weight").shape, (Shape{10, 8}));  // unpadded
  ckpt::load_weights((d / "m.safetensors").string(), g2, p2);
  for (size_t u = 0; u < p1.units.size(); ++u)
    EXPECT_EQ(p1.units[u].data.to_vector<float>(), p2.units[u].data.to_vector<float>()) << p1.units[u].name;
}

// Mixed precision (bf16 compute copies over f32 masters): the file holds the f32 masters,
// loading writes the masters (not the compute copies, which the next refresh would
// overwrite) and refreshes the copies.
TEST(Weights, MixedPrecisionSavesAndLoadsTheMasters) {
  fs::path d = ndt::testing::fresh_dir("ckpt_weights_mixed");
  models::GPT g1(padded_vocab_gpt()), g2(padded_vocab_gpt());
  nn::FlatParams p1 = nn::materialize(g1.units(), Device::cpu(), DType::f32, 1, {}, DType::bf16);
  nn::FlatParams p2 = nn::materialize(g2.units(), Device::cpu(), DType::f32, 2, {}, DType::bf16);
  ASSERT_TRUE(p1.units[0].mixed());
  ckpt::save_weights((d / "m.safetensors").string(), g1, p1);
  io::SafeTensorsReader r((d / "m.safetensors").string());
  EXPECT_EQ(r.entries().at("h.0.mlp.c_fc.weight").dtype, "F32");
  ckpt::load_weights((d / "m.safetensors").string(), g2, p2);
  for (size_t u = 0; u < p1.units.size(); ++u) {
    EXPECT_EQ(p1.units[u].data.to_vector<float>(), p2.units[u].data.to_vector<float>()) << p1.units[u].name;
    EXPECT_EQ(p1.units[u].full.to_vector<float>(), p2.units[u].full.to_vector<float>()) << p1.units[u].name;
  }
}

TEST(Weights, AcceptsTransformerPrefixTiedHeadAndMaskBuffers) {
  fs::path d = ndt::testing::fresh_dir("ckpt_hf");
  models::GPT g1(padded_vocab_gpt()), g2(padded_vocab_gpt());
  nn::FlatParams p1 = nn::materialize(g1.units(), Device::cpu(), DType::f32, 1);
  nn::FlatParams p2 = nn::materialize(g2.units(), Device::cpu(), DType::f32, 2);
  std::vector<Raw> ts = hf_tensors(g1, p1, "transformer.");
  Raw head = ts[0];  // wte
  ASSERT_EQ(head.name, "transformer.wte.weight");
  head.name = "lm_head.weight";
  ts.push_back(head);
  ts.push_back({"transformer.h.0.attn.bias", "F32", {1, 1, 6, 6}, std::string(36 * 4, '\0')});
  ts.push_back({"transformer.h.0.attn.masked_bias", "F32", {}, std::string(4, '\0')});
  write_raw(d / "hf.safetensors", ts);
  ckpt::load_weights((d / "hf.safetensors").string(), g2, p2);
  EXPECT_EQ(p1.units[1].data.to_vector<float>(), p2.units[1].data.to_vector<float>());
  // an untied head is refused
  ts[ts.size() - 3].bytes[0] ^= 1;
  write_raw(d / "untied.safetensors", ts);
  EXPECT_NE(error_of([&] {
              ckpt::load_weights((d / "untied.safetensors").string(), g2, p2);
            }).find("lm_head.weight differs"),
            std::string::npos);
}

TEST(Weights, MissingExtraAndMisshapenTensorsAreNamedAndNothingIsLoaded) {
  fs::path d = ndt::testing::fresh_dir("ckpt_bad");
  models::GPT g1(padded_vocab_gpt()), g2(padded_vocab_gpt());
  nn::FlatParams p1 = nn::materialize(g1.units(), Device::cpu(), DType::f32, 1);
  nn::FlatParams p2 = nn::materialize(g2.units(), Device::cpu(), DType::f32, 2);
  const std::vector<float> before = p2.units[0].data.to_vector<float>();
  std::vector<Raw> ts = hf_tensors(g1, p1, "");
  std::vector<Raw> missing(ts.begin(), ts.end() - 1);  // no ln_f.bias
  write_raw(d / "missing.safetensors", missing);
  std::string e = error_of([&] { ckpt::load_weights((d / "missing.safetensors").string(), g2, p2); });
  EXPECT_NE(e.find("missing tensors: ln_f.bias"), std::string::npos) << e;
  std::vector<Raw> extra = ts;
  extra.push_back({"h.7.mlp.c_fc.weight", "F32", {1}, std::string(4, '\0')});
  write_raw(d / "extra.safetensors", extra);
  e = error_of([&] { ckpt::load_weights((d / "extra.safetensors").string(), g2, p2); });
  EXPECT_NE(e.find("unexpected tensors: h.7.mlp.c_fc.weight"), std::string::npos) << e;
  std::vector<Raw> shaped = ts;
  for (Raw& r : shaped)
    if (r.name == "h.0.attn.c_proj.weight") r.shape = {4, 16};  // same bytes, wrong shape
  write_raw(d / "shape.safetensors", shaped);
  e = error_of([&] { ckpt::load_weights((d / "shape.safetensors").string(), g2, p2); });
  EXPECT_NE(e.find("h.0.attn.c_proj.weight has shape (4, 16), the model needs (8, 8)"), std::string::npos)
      << e;
  EXPECT_EQ(p2.units[0].data.to_vector<float>(), before);  // nothing was copied
}

TEST(Weights, ANameWithAndWithoutTheTransformerPrefixIsRefused) {
  // h.0.ln_1.weight and transformer.h.0.ln_1.weight are one parameter: a file holding both
  // (with different values) must not load one of them and drop the other
  fs::path d = ndt::testing::fresh_dir("ckpt_dup");
  models::GPT g1(padded_vocab_gpt()), g2(padded_vocab_gpt());
  nn::FlatParams p1 = nn::materialize(g1.units(), Device::cpu(), DType::f32, 1);
  nn::FlatParams p2 = nn::materialize(g2.units(), Device::cpu(), DType::f32, 2);
  const std::vector<float> before = p2.units[1].data.to_vector<float>();
  std::vector<Raw> ts = hf_tensors(g1, p1, "");
  Raw twin;
  for (const Raw& r : ts)
    if (r.name == "h.0.ln_1.weight") twin = r;
  ASSERT_FALSE(twin.name.empty());
  twin.name = "transformer.h.0.ln_1.weight";
  twin.bytes[0] ^= 1;
  ts.push_back(twin);
  const std::string file = (d / "dup.safetensors").string();
  write_raw(file, ts);
  for (bool local : {false, true}) {
    const std::string e =
        error_of([&] { local ? ckpt::load_weights_local(file, g2, p2) : ckpt::load_weights(file, g2, p2); });
    EXPECT_NE(e.find("weights " + file + ": holds both h.0.ln_1.weight and transformer.h.0.ln_1.weight"),
              std::string::npos)
        << e;
  }
  EXPECT_EQ(p2.units[1].data.to_vector<float>(), before);  // nothing was copied
  // the tied head too: lm_head.weight and transformer.lm_head.weight
  ts = hf_tensors(g1, p1, "transformer.");
  Raw head = ts[0];
  head.name = "lm_head.weight";
  ts.push_back(head);
  head.name = "transformer.lm_head.weight";
  ts.push_back(head);
  write_raw(file, ts);
  const std::string e = error_of([&] { ckpt::load_weights(file, g2, p2); });
  EXPECT_NE(e.find("holds both lm_head.weight and transformer.lm_head.weight"), std::string::npos) << e;
}

TEST(Checkpoint, SaveLoadRestoresWeightsMomentsAndPosition) {
  fs::path d = ndt::testing::fresh_dir("ckpt_state");
  models::GPT g1(padded_vocab_gpt()), g2(padded_vocab_gpt());
  nn::FlatParams p1 = nn::materialize(g1.units(), Device::cpu(), DType::f32, 1);
  nn::FlatParams p2 = nn::materialize(g2.units(), Device::cpu(), DType::f32, 2);
  optim::AdamW o1(p1, {}), o2(p2, {});
  // gradients on the parameters only: no gradient ever reaches padding or padded vocab rows
  for (auto& u : p1.units)
    for (auto& fp : u.params)
      kernels::fill_normal(fp.value.grad(), 4, nn::name_hash(fp.spec.name), 0, 0.0f, 1.0f);
  kernels::fill(g1.wte.weight.grad().narrow(0, 10, 6), 0.0);
  o1.step(0.01);
  o1.step(0.01);
  ckpt::TrainState st;
  st.step = 2;
  st.loader = {3, 17};
  std::string where = ckpt::save_checkpoint(d.string(), g1, p1, o1, st, 2);
  EXPECT_EQ(ckpt::latest_checkpoint(d.string()).value(), where);
  ckpt::TrainState got = ckpt::load_checkpoint(where, g2, p2, o2);
  EXPECT_EQ(got.step, 2);
  EXPECT_EQ(got.loader.epoch, 3);
  EXPECT_EQ(got.loader.window, 17);
  EXPECT_EQ(o2.steps_taken(), 2);
  for (size_t u = 0; u < p1.units.size(); ++u) {
    EXPECT_EQ(p1.units[u].data.to_vector<float>(), p2.units[u].data.to_vector<float>());
    EXPECT_EQ(o1.m()[u].to_vector<float>(), o2.m()[u].to_vector<float>());
    EXPECT_EQ(o1.v()[u].to_vector<float>(), o2.v()[u].to_vector<float>());
  }
  // keep = 2: older checkpoints are removed
  for (int s : {4, 6}) {
    st.step = s;
    ckpt::save_checkpoint(d.string(), g1, p1, o1, st, 2);
  }
  EXPECT_FALSE(fs::exists(d / "step_00000002"));
  EXPECT_TRUE(fs::exists(d / "step_00000004"));
  EXPECT_TRUE(fs::exists(d / "step_00000006"));
}

// A checkpoint.json nested 100,000 deep is one error naming it, for a whole checkpoint and a
// sharded one.
TEST(Checkpoint, ADeeplyNestedManifestIsOneErrorNamingIt) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  fs::path d = ndt::testing::fresh_dir("ckpt_deep");
  models::GPT g(padded_vocab_gpt());
  nn::FlatParams p = nn::materialize(g.units(), Device::cpu(), DType::f32, 1);
  optim::AdamW o(p, {});
  ckpt::TrainState st;
  st.step = 2;
  const std::string where = ckpt::save_checkpoint((d / "whole").string(), g, p, o, st, 2);
  std::ofstream((fs::path(where) / "checkpoint.json").string()) << deep;
  std::string e = error_of([&] { ckpt::load_checkpoint(where, g, p, o); });
  EXPECT_NE(e.find((fs::path(where) / "checkpoint.json").string() + ": JSON nested deeper than 512 levels"),
            std::string::npos)
      << e.substr(0, 300);
  EXPECT_EQ(e.find('\n'), std::string::npos);
  e = error_of([&] { ckpt::verify_checkpoint(where, {}); });
  EXPECT_NE(e.find("checkpoint.json: JSON nested deeper"), std::string::npos) << e.substr(0, 300);
}

TEST(Checkpoint, ACrashMidWriteLeavesTheLastGoodCheckpoint) {
  fs::path d = ndt::testing::fresh_dir("ckpt_crash");
  models::GPT g(padded_vocab_gpt());
  nn::FlatParams p = nn::materialize(g.units(), Device::cpu(), DType::f32, 1);
  optim::AdamW o(p, {});
  ckpt::TrainState st;
  st.step = 5;
  const std::string good = ckpt::save_checkpoint(d.string(), g, p, o, st, 0);
  // What a crash while writing step 10 leaves: a partial temporary directory and a
  // partial latest.tmp; `latest` itself is only ever replaced by rename.
  fs::create_directories(d / ".tmp_step_00000010");
  std::ofstream(d / ".tmp_step_00000010" / "model.safetensors.tmp") << "partial";
  std::ofstream(d / "latest.tmp") << "step_000";
  EXPECT_EQ(ckpt::latest_checkpoint(d.string()).value(), good);
  models::GPT g2(padded_vocab_gpt());
  nn::FlatParams p2 = nn::materialize(g2.units(), Device::cpu(), DType::f32, 9);
  optim::AdamW o2(p2, {});
  EXPECT_EQ(ckpt::load_checkpoint(good, g2, p2, o2).step, 5);
  // the next save cleans up after the crash
  st.step = 10;
  ckpt::save_checkpoint(d.string(), g, p, o, st, 0);
  EXPECT_FALSE(fs::exists(d / ".tmp_step_00000010"));
  EXPECT_TRUE(fs::exists(d / "step_00000010" / "state.safetensors"));
}

TEST(Checkpoint, StateFromADifferentModelIsRefused) {
  fs::path d = ndt::testing::fresh_dir("ckpt_mismatch");
  models::GPT g(padded_vocab_gpt());
  nn::FlatParams p = nn::materialize(g.units(), Device::cpu(), DType::f32, 1);
  optim::AdamW o(p, {});
  const std::string where = ckpt::save_checkpoint(d.string(), g, p, o, {}, 0);
  models::GPTConfig c = padded_vocab_gpt();
  c.n_embd = 12;
  models::GPT g2(c);
  nn::FlatParams p2 = nn::materialize(g2.units(), Device::cpu(), DType::f32, 1);
  optim::AdamW o2(p2, {});
  std::string e = error_of([&] { ckpt::load_checkpoint(where, g2, p2, o2); });
  EXPECT_NE(e.find("config differs"), std::string::npos) << e;
}

// ---- sharded checkpoints, written and read by one process ---------------------------------

namespace {

// A model, its parameters and AdamW, in place (the parameters' slots point into the model).
struct Model {
  explicit Model(const models::GPTConfig& c, uint64_t seed)
      : gpt(c), params(nn::materialize(gpt.units(), Device::cpu(), DType::f32, seed)), opt(params, {}) {}
  models::GPT gpt;
  nn::FlatParams params;
  optim::AdamW opt;
};

// Two AdamW steps on random gradients (none reaches the padded vocabulary rows, as in
// training: their logits are masked), then a sharded checkpoint of step 2 by one process.
std::string save_sharded_step2(const fs::path& dir, Model& r) {
  for (auto& u : r.params.units)
    for (auto& fp : u.params)
      kernels::fill_normal(fp.value.grad(), 4, nn::name_hash(fp.spec.name), 0, 0.0f, 1.0f);
  const int64_t V = r.gpt.cfg.vocab_size, Vp = r.gpt.cfg.padded_vocab();
  if (Vp > V) kernels::fill(r.gpt.wte.weight.grad().narrow(0, V, Vp - V), 0.0);
  r.opt.step(0.01);
  r.opt.step(0.01);
  ckpt::TrainState st;
  st.step = 2;
  st.loader = {3, 17};
  st.extra["window_tokens"] = "24";
  dist::DeviceMesh mesh(dist::ParallelDims{}, dist::local_communicator());
  return ckpt::save_sharded(dir.string(), st, r.params, r.opt, mesh, r.gpt.cfg, {}, 0);
}

std::string bytes_of(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}
nlohmann::json read_json(const fs::path& p) {
  std::ifstream f(p);
  return nlohmann::json::parse(f);
}
// The manifest's checksum as the docs define it: XXH64 of its compact JSON (keys sorted)
// without the checksum itself.
std::string seal_of(nlohmann::json m) {
  m.erase("manifest_xxh64");
  const std::string s = m.dump();
  return io::hex64(io::xxh64(s.data(), s.size()));
}
// Writes m as checkpoint.json with a checksum that matches it (a crafted, resealed manifest).
void write_sealed(const fs::path& ckpt, nlohmann::json m) {
  m["manifest_xxh64"] = seal_of(m);
  std::ofstream(ckpt / "checkpoint.json", std::ios::trunc) << m.dump(1) << "\n";
}
// Records a rewritten shard file's size and checksum in the manifest and reseals it.
void reseal_file(const fs::path& ckpt, const std::string& file) {
  nlohmann::json m = read_json(ckpt / "checkpoint.json");
  m["files"][file] = {{"bytes", fs::file_size(ckpt / file)},
                      {"xxh64", io::hex64(io::file_xxh64((ckpt / file).string()))}};
  write_sealed(ckpt, m);
}
// Rewrites a shard file with every tensor as it was (F32), but `change` applied to the raw
// tensors first.
void rewrite_shard(const fs::path& path, const std::function<void(std::vector<Raw>&)>& change) {
  std::vector<Raw> ts;
  {
    io::SafeTensorsReader r(path.string());
    for (auto& [name, e] : r.entries()) {
      std::vector<float> f = r.get(name).to_vector<float>();
      ts.push_back(
          {name, "F32", e.shape, std::string(reinterpret_cast<const char*>(f.data()), f.size() * 4)});
    }
  }
  change(ts);
  write_raw(path, ts);
}
Raw& raw_named(std::vector<Raw>& ts, const std::string& name) {
  for (Raw& t : ts)
    if (t.name == name) return t;
  ADD_FAILURE() << "no tensor " << name;
  return ts.front();
}
bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST(ShardedCheckpoint, RoundTripsWithASealedManifest) {
  fs::path d = ndt::testing::fresh_dir("sh_rt");
  Model a(padded_vocab_gpt(), 1), b(padded_vocab_gpt(), 2);
  const std::string where = save_sharded_step2(d, a);
  const nlohmann::json m = read_json(fs::path(where) / "checkpoint.json");
  ASSERT_TRUE(m.contains("manifest_xxh64")) << m.dump(1);
  EXPECT_EQ(m["manifest_xxh64"], seal_of(m));
  ckpt::TrainState st = ckpt::load_sharded(where, padded_vocab_gpt(), b.params, b.opt);
  EXPECT_EQ(st.step, 2);
  EXPECT_EQ(st.loader.epoch, 3);
  EXPECT_EQ(st.loader.window, 17);
  EXPECT_EQ(b.opt.steps_taken(), 2);
  for (size_t u = 0; u < a.params.units.size(); ++u) {
    EXPECT_EQ(a.params.units[u].data.to_vector<float>(), b.params.units[u].data.to_vector<float>());
    EXPECT_EQ(a.opt.m()[u].to_vector<float>(), b.opt.m()[u].to_vector<float>());
    EXPECT_EQ(a.opt.v()[u].to_vector<float>(), b.opt.v()[u].to_vector<float>());
  }
}

// The model's field table (models/gpt_config.h) drives the config keys and the checkpoint's
// model: every field, set away from its default (a llama uses them all), is a train_gpt key
// that sets it, and comes back from a sharded checkpoint. A field added to the table is
// covered here without a word more.
TEST(ShardedCheckpoint, ADeeplyNestedManifestIsOneErrorNamingIt) {
  fs::path d = ndt::testing::fresh_dir("sh_deep");
  Model a(padded_vocab_gpt(), 1), b(padded_vocab_gpt(), 2);
  const std::string where = save_sharded_step2(d, a);
  std::ofstream((fs::path(where) / "checkpoint.json").string())
      << std::string(100000, '[') + std::string(100000, ']');
  const std::string e = error_of([&] { ckpt::load_sharded(where, padded_vocab_gpt(), b.params, b.opt); });
  EXPECT_NE(e.find((fs::path(where) / "checkpoint.json").string() + ": JSON nested deeper than 512 levels"),
            std::string::npos)
      << e.substr(0, 300);
  EXPECT_EQ(e.find('\n'), std::string::npos);
}

TEST(ShardedCheckpoint, EveryModelFieldIsAConfigKeyAndRoundTrips) {
  models::GPTConfig c{.arch = "llama",
                      .n_layer = 3,
                      .n_head = 4,
                      .n_embd = 16,
                      .vocab_size = 37,
                      .block_size = 24,
                      .vocab_multiple = 8,
                      .norm_eps = 1e-6,
                      .n_kv_head = 2,
                      .intermediate_size = 40,
                      .attention_bias = true,
                      .tie_embeddings = true,
                      .head_size = 6,
                      .qk_norm = true,
                      .n_experts = 4,
                      .n_experts_per_tok = 2,
                      .moe_intermediate_size = 12,
                      .norm_topk_prob = true,
                      .moe_every = 2,  // layer 1 of 0..2
                      .dense_layers = "0",
                      .shared_expert_intermediate_size = 10,
                      .router_aux_loss_coef = 0.5,
                      .router_z_loss_coef = 0.25};
  c.rope.theta = 50000;
  const models::GPTConfig d;
  std::vector<std::string> args = {"train_gpt", "--data.train", "x.bin", "--train.seq_len", "8"};
  models::visit_fields(
      [&](const models::Field& f, const auto& v, const auto& dv) {
        EXPECT_FALSE(v == dv) << "the test's config leaves model." << f.name << " at its default";
        std::ostringstream os;
        os << std::boolalpha << v;
        args.push_back(std::string("--model.") + f.name);
        args.push_back(os.str());
      },
      c, d);
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  train::Config parsed;
  std::string help;
  ASSERT_TRUE(train::parse_config(static_cast<int>(argv.size()), argv.data(), parsed, help));
  const fs::path dir = ndt::testing::fresh_dir("field_table");
  Model m(c, 5);
  const std::string where = save_sharded_step2(dir, m);
  const models::GPTConfig back = ckpt::sharded_model_config(where);
  const models::GPTConfig& given = parsed.model;
  models::visit_fields(
      [&](const models::Field& f, const auto& want, const auto& from_config, const auto& from_checkpoint) {
        EXPECT_EQ(from_config, want) << "--model." << f.name;
        EXPECT_EQ(from_checkpoint, want) << "the checkpoint's model." << f.name;
      },
      c, given, back);
}

TEST(ShardedCheckpoint, AFlippedBitInAnyManifestValueIsCaught) {
  fs::path d = ndt::testing::fresh_dir("sh_flip");
  Model a(padded_vocab_gpt(), 1);
  const fs::path where = save_sharded_step2(d, a);
  const std::string good = bytes_of(where / "checkpoint.json");
  for (const char* key : {"\"step\": ", "\"adam_steps\": ", "\"loader_window\": ", "\"loader_epoch\": "}) {
    SCOPED_TRACE(key);
    std::string text = good;
    const size_t at = text.find(key);
    ASSERT_NE(at, std::string::npos) << text;
    const size_t last = text.find_first_not_of("0123456789", at + std::strlen(key)) - 1;
    text[last] ^= 1;  // the last digit: 2 -> 3, 17 -> 16, 3 -> 2: still valid JSON, in range
    std::ofstream(where / "checkpoint.json", std::ios::trunc) << text;
    Model b(padded_vocab_gpt(), 2);
    const std::string e =
        error_of([&] { ckpt::load_sharded(where.string(), padded_vocab_gpt(), b.params, b.opt); });
    EXPECT_TRUE(has(e, "checkpoint.json fails its checksum")) << e;
  }
}

TEST(ShardedCheckpoint, EveryManifestFieldIsCheckedNamingItAndItsValue) {
  fs::path d = ndt::testing::fresh_dir("sh_fields");
  Model a(padded_vocab_gpt(), 1);
  const fs::path where = save_sharded_step2(d, a);
  const nlohmann::json good = read_json(where / "checkpoint.json");
  struct Case {
    std::string pointer;
    nlohmann::json value;  // null: removed
    std::string expect;
  };
  const std::vector<Case> cases = {
      {"/step", -5, "\"step\" is -5; it must be >= 0"},
      {"/step", 2.5, "\"step\" is 2.5, not an integer"},
      {"/step", "2", "\"step\" is \"2\", not an integer"},
      {"/step", nullptr, "has no \"step\""},
      {"/adam_steps", 3, "\"adam_steps\" is 3 but \"step\" is 2"},
      {"/loader_window", -1, "\"loader_window\" is -1; it must be >= 0"},
      {"/loader_epoch", -1, "\"loader_epoch\" is -1; it must be >= 0"},
      {"/layout/dp_shard", 0, "\"layout.dp_shard\" is 0; it must be in [1, "},
      {"/layout/cp", -1, "\"layout.cp\" is -1; it must be in [1, "},
      {"/layout/dp_shard", 2, "\"files\" lists 1 file but \"layout\" has 2 writers"},
      {"/layout/tp", 3, "\"layout.tp\" is 3, which does not divide the model's 2 heads"},
      {"/layout/pp", 0, "\"layout.pp\" is 0; it must be in [1, 2]"},
      {"/layout/pp", 2, "\"layout.pp_blocks\" is [2]; it must be a list of one entry per pipeline stage"},
      {"/layout/pp_blocks", nlohmann::json::array({1}), "\"layout.pp_blocks\" is [1], 1 blocks in all"},
      {"/layout/pp_blocks", nlohmann::json::array({0, 2}),
       "its entry 0 is 0, not a number of blocks in [1, 2]"},
      {"/layout/pp_blocks", "2", "\"layout.pp_blocks\" is \"2\"; it must be a list"},
      {"/model/n_layer", 0, "\"model.n_layer\" is 0; it must be in [1, "},
      {"/model/n_embd", 7, "\"model.n_embd\" is 7, not a multiple of \"model.n_head\" 2"},
      {"/model/vocab_multiple", 0, "\"model.vocab_multiple\" is 0; it must be in [1, "},
      {"/format", "shardd", "checkpoint"},  // no longer sharded: not ours to read
      {"/extra/window_tokens", "x", "\"extra.window_tokens\" is \"x\", not a positive integer"},
      {"/files/shard_tp0_fsdp0.safetensors/bytes", -1, "\"files.shard_tp0_fsdp0.safetensors.bytes\" is -1"},
      {"/files/shard_tp0_fsdp0.safetensors/xxh64", "12",
       "\"files.shard_tp0_fsdp0.safetensors.xxh64\" is \"12\""},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.pointer + " = " + c.value.dump());
    nlohmann::json m = good;
    if (c.value.is_null())
      m.erase(c.pointer.substr(1));
    else
      m[nlohmann::json::json_pointer(c.pointer)] = c.value;
    write_sealed(where, m);
    Model b(padded_vocab_gpt(), 2);
    const std::vector<float> before = b.params.units[0].data.to_vector<float>();
    const std::string e =
        error_of([&] { ckpt::load_sharded(where.string(), padded_vocab_gpt(), b.params, b.opt); });
    EXPECT_TRUE(has(e, c.expect)) << e;
    if (c.pointer != "/format") EXPECT_TRUE(has(e, "checkpoint.json")) << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
    EXPECT_EQ(b.params.units[0].data.to_vector<float>(), before) << "nothing is loaded from a bad manifest";
    const std::string x =
        error_of([&] { ckpt::export_weights(where.string(), (d / "out.safetensors").string()); });
    EXPECT_TRUE(has(x, c.expect)) << x;
    EXPECT_FALSE(fs::exists(d / "out.safetensors"));
  }
}

TEST(ShardedCheckpoint, TensorParallelSizeZeroIsAnErrorNotADivisionByZero) {
  fs::path d = ndt::testing::fresh_dir("sh_tp0");
  Model a(padded_vocab_gpt(), 1);
  const fs::path where = save_sharded_step2(d, a);
  nlohmann::json m = read_json(where / "checkpoint.json");
  m["layout"]["tp"] = 0;  // "tp": 1 with its lowest bit flipped
  write_sealed(where, m);
  Model b(padded_vocab_gpt(), 2);
  std::string e = error_of([&] { ckpt::load_sharded(where.string(), padded_vocab_gpt(), b.params, b.opt); });
  EXPECT_TRUE(has(e, "checkpoint.json: \"layout.tp\" is 0")) << e;
  e = error_of([&] { ckpt::export_weights(where.string(), (d / "out.safetensors").string()); });
  EXPECT_TRUE(has(e, "checkpoint.json: \"layout.tp\" is 0")) << e;
  // and the split itself refuses a size below one
  models::GPT g(padded_vocab_gpt());
  e = error_of([&] { dist::split_tensor_parallel(g, 0, 0); });
  EXPECT_TRUE(has(e, "tp_size must be >= 1")) << e;
  e = error_of([&] { dist::check_tensor_parallel(padded_vocab_gpt(), 0); });
  EXPECT_TRUE(has(e, "tp_size must be >= 1")) << e;
}

TEST(ShardedCheckpoint, AManifestWithoutAChecksumLoadsWithAWarningButIsStillValidated) {
  // checkpoints written before manifests were sealed keep resuming
  fs::path d = ndt::testing::fresh_dir("sh_old");
  Model a(padded_vocab_gpt(), 1);
  const fs::path where = save_sharded_step2(d, a);
  nlohmann::json m = read_json(where / "checkpoint.json");
  m.erase("manifest_xxh64");
  std::ofstream(where / "checkpoint.json", std::ios::trunc) << m.dump(1) << "\n";
  Model b(padded_vocab_gpt(), 2);
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(ckpt::load_sharded(where.string(), padded_vocab_gpt(), b.params, b.opt).step, 2);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(has(err, "warning: checkpoint " + (where / "checkpoint.json").string() + " has no checksum"))
      << err;
  EXPECT_EQ(a.params.units[1].data.to_vector<float>(), b.params.units[1].data.to_vector<float>());
  m["step"] = -5;
  std::ofstream(where / "checkpoint.json", std::ios::trunc) << m.dump(1) << "\n";
  ::testing::internal::CaptureStderr();
  const std::string e =
      error_of([&] { ckpt::load_sharded(where.string(), padded_vocab_gpt(), b.params, b.opt); });
  ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(has(e, "\"step\" is -5")) << e;
}

TEST(ShardedCheckpoint, AManifestWithoutPipelineStagesIsOneStage) {
  // written before pipeline parallelism: no "pp" nor "pp_blocks" in its layout, the files
  // named shard_tp<t>_fsdp<f> -- one stage of every block
  fs::path d = ndt::testing::fresh_dir("sh_nopp");
  Model a(padded_vocab_gpt(), 1);
  const fs::path where = save_sharded_step2(d, a);
  nlohmann::json m = read_json(where / "checkpoint.json");
  EXPECT_EQ(m["layout"]["pp"], 1);
  EXPECT_EQ(m["layout"]["pp_blocks"], nlohmann::json::array({2}));
  m["layout"].erase("pp");
  m["layout"].erase("pp_blocks");
  write_sealed(where, m);
  Model b(padded_vocab_gpt(), 2);
  EXPECT_EQ(ckpt::load_sharded(where.string(), padded_vocab_gpt(), b.params, b.opt).step, 2);
  for (size_t i = 0; i < a.params.units.size(); ++i) {
    EXPECT_EQ(a.params.units[i].data.to_vector<float>(), b.params.units[i].data.to_vector<float>());
    EXPECT_EQ(a.opt.v()[i].to_vector<float>(), b.opt.v()[i].to_vector<float>());
  }
  // stages without their blocks: one line naming the file and the field
  m["layout"]["pp"] = 2;
  write_sealed(where, m);
  const std::string e =
      error_of([&] { ckpt::load_sharded(where.string(), padded_vocab_gpt(), b.params, b.opt); });
  EXPECT_TRUE(
      has(e, (where / "checkpoint.json").string() + " has no \"layout.pp_blocks\" but \"layout.pp\" is 2"))
      << e;
  // two stages listing one file: the writers the layout implies are named
  m["layout"]["pp_blocks"] = {1, 1};
  write_sealed(where, m);
  const std::string f =
      error_of([&] { ckpt::load_sharded(where.string(), padded_vocab_gpt(), b.params, b.opt); });
  EXPECT_TRUE(has(f, "\"files\" lists 1 file but \"layout\" has 2 writers (pp x tp x dp_shard x cp)")) << f;
}

TEST(ShardedCheckpoint, OnlyTheFilesTheManifestListsAreRead) {
  fs::path d = ndt::testing::fresh_dir("sh_unlisted");
  Model a(padded_vocab_gpt(), 1);
  const fs::path where = save_sharded_step2(d, a);
  const nlohmann::json good = read_json(where / "checkpoint.json");
  // a stray shard file that the manifest does not list: refused, naming it
  fs::copy_file(where / "shard_tp0_fsdp0.safetensors", where / "shard_tp1_fsdp0.safetensors");
  Model b(padded_vocab_gpt(), 2);
  std::string e = error_of([&] { ckpt::load_sharded(where.string(), padded_vocab_gpt(), b.params, b.opt); });
  EXPECT_TRUE(has(e, "shard_tp1_fsdp0.safetensors, which checkpoint.json does not list")) << e;
  e = error_of([&] { ckpt::export_weights(where.string(), (d / "out.safetensors").string()); });
  EXPECT_TRUE(has(e, "which checkpoint.json does not list")) << e;
  fs::remove(where / "shard_tp1_fsdp0.safetensors");
  // a layout of two writers whose second file is there but not listed (nor checksummed)
  fs::copy_file(where / "shard_tp0_fsdp0.safetensors", where / "shard_tp0_fsdp1.safetensors");
  nlohmann::json m = good;
  m["layout"]["dp_shard"] = 2;
  write_sealed(where, m);
  e = error_of([&] { ckpt::load_sharded(where.string(), padded_vocab_gpt(), b.params, b.opt); });
  EXPECT_TRUE(has(e, "\"files\" lists 1 file but \"layout\" has 2 writers")) << e;
  // listed under a name the layout has no writer for
  m = good;
  m["files"]["shard_tp0_fsdp1.safetensors"] = m["files"]["shard_tp0_fsdp0.safetensors"];
  m["files"].erase("shard_tp0_fsdp0.safetensors");
  write_sealed(where, m);
  e = error_of([&] { ckpt::load_sharded(where.string(), padded_vocab_gpt(), b.params, b.opt); });
  EXPECT_TRUE(has(e, "\"files\" lacks shard_tp0_fsdp0.safetensors")) << e;
  // an unlisted file that is not a shard (notes) is left alone
  fs::remove(where / "shard_tp0_fsdp1.safetensors");
  write_sealed(where, good);
  std::ofstream(where / "NOTES.txt") << "lr was 3e-4\n";
  EXPECT_EQ(ckpt::load_sharded(where.string(), padded_vocab_gpt(), b.params, b.opt).step, 2);
}

TEST(ShardedCheckpoint, ShardTensorsMustBeF32OfTheirLayoutsLength) {
  fs::path d = ndt::testing::fresh_dir("sh_dtype");
  Model a(padded_vocab_gpt(), 1);
  const fs::path where = save_sharded_step2(d, a);
  const fs::path shard = where / "shard_tp0_fsdp0.safetensors";
  const std::string good = bytes_of(shard);
  const nlohmann::json manifest = read_json(where / "checkpoint.json");
  const int64_t n = a.params.units[1].shard_numel;
  struct Case {
    std::function<void(std::vector<Raw>&)> change;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {[](std::vector<Raw>& ts) {  // the same elements as U16 (half the bytes), resealed
         Raw& t = raw_named(ts, "data.h.0");
         t.dtype = "U16";
         t.bytes.resize(t.bytes.size() / 2);
       },
       "tensor data.h.0 has dtype U16, ndtrain writes F32"},
      {[](std::vector<Raw>& ts) {
         Raw& t = raw_named(ts, "m.h.0");
         t.shape = {t.shape[0] - 1};
         t.bytes.resize(t.bytes.size() - 4);
       },
       "tensor m.h.0 has shape (" + std::to_string(n - 1) + "), the layout of checkpoint.json needs (" +
           std::to_string(n) + ")"},
      {[](std::vector<Raw>& ts) { ts.erase(ts.begin()); }, "lacks tensor"},
      {[](std::vector<Raw>& ts) {
         ts.push_back({"data.h.9", "F32", {1}, std::string(4, '\0')});
       },
       "holds tensor data.h.9, which the layout of checkpoint.json has no place for"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.expect);
    std::ofstream(shard, std::ios::binary | std::ios::trunc) << good;
    write_sealed(where, manifest);
    rewrite_shard(shard, c.change);
    reseal_file(where, "shard_tp0_fsdp0.safetensors");
    Model b(padded_vocab_gpt(), 2);
    const std::string e =
        error_of([&] { ckpt::load_sharded(where.string(), padded_vocab_gpt(), b.params, b.opt); });
    EXPECT_TRUE(has(e, "shard_tp0_fsdp0.safetensors")) << e;
    EXPECT_TRUE(has(e, c.expect)) << e;
  }
}

TEST(ShardedCheckpoint, NonFiniteValuesAreRefusedNamingTheParameterAndTheFile) {
  fs::path d = ndt::testing::fresh_dir("sh_nan");
  Model a(padded_vocab_gpt(), 1);
  const fs::path where = save_sharded_step2(d, a);
  const fs::path shard = where / "shard_tp0_fsdp0.safetensors";
  const std::string good = bytes_of(shard);
  const nlohmann::json manifest = read_json(where / "checkpoint.json");
  const nn::FlatParam& p = a.params.units[1].params[1];  // not at the buffer's start
  struct Case {
    std::string tensor;
    float value;
    std::string expect;
  };
  const std::vector<Case> cases = {{"data.h.0", NAN, "NaN"},
                                   {"data.h.0", INFINITY, "Inf"},
                                   {"m.h.0", -INFINITY, "Inf"},
                                   {"v.h.0", -1.0f, "a negative value"}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.tensor);
    std::ofstream(shard, std::ios::binary | std::ios::trunc) << good;
    write_sealed(where, manifest);
    rewrite_shard(shard, [&](std::vector<Raw>& ts) {
      std::memcpy(&raw_named(ts, c.tensor).bytes[4 * (p.offset + 3)], &c.value, 4);
    });
    reseal_file(where, "shard_tp0_fsdp0.safetensors");
    Model b(padded_vocab_gpt(), 2);
    const std::string e =
        error_of([&] { ckpt::load_sharded(where.string(), padded_vocab_gpt(), b.params, b.opt); });
    EXPECT_TRUE(
        has(e, "shard_tp0_fsdp0.safetensors: " + c.tensor + " holds " + c.expect + " in " + p.spec.name))
        << e;
    if (c.tensor == "data.h.0") {  // init_from and export read the weights only: refused too
      Model w(padded_vocab_gpt(), 2);
      EXPECT_TRUE(
          has(error_of([&] { ckpt::load_sharded_weights(where.string(), padded_vocab_gpt(), w.params); }),
              c.expect));
      EXPECT_TRUE(has(error_of([&] { ckpt::export_weights(where.string(), (d / "o.safetensors").string()); }),
                      c.expect));
    }
  }
}

TEST(ShardedCheckpoint, ResumesWithAnotherVocabularyPadding) {
  // the padded rows of wte hold zeros that are never trained (their logits are masked), so a
  // checkpoint resumes under another model.vocab_multiple: rows are dropped or added as zeros
  fs::path d = ndt::testing::fresh_dir("sh_repad");
  Model a(padded_vocab_gpt(), 1);  // vocab 10 padded to 16
  const std::string where = save_sharded_step2(d, a);
  const std::vector<float> wte = a.gpt.wte.weight.to_vector<float>();
  for (size_t i = 10 * 8; i < wte.size(); ++i) ASSERT_EQ(wte[i], 0.0f) << "padded rows stay zero";
  for (int64_t vm : {1, 32}) {
    SCOPED_TRACE(vm);
    models::GPTConfig c = padded_vocab_gpt();
    c.vocab_multiple = vm;
    Model b(c, 2);
    ASSERT_EQ(ckpt::load_sharded(where, c, b.params, b.opt).step, 2);
    const int64_t live = 10 * 8, rows = c.padded_vocab();
    std::vector<float> got = b.gpt.wte.weight.to_vector<float>(), want(wte.begin(), wte.begin() + live);
    want.resize(rows * 8, 0.0f);
    EXPECT_EQ(got, want);
    for (const char* n : {"wpe.weight", "ln_f.weight", "h.1.mlp.c_fc.weight"})
      EXPECT_EQ(b.params.find(n)->value.to_vector<float>(), a.params.find(n)->value.to_vector<float>()) << n;
    // the moments follow the parameters: the first element of wpe's, wherever wte ends
    const int64_t off_a = a.params.find("wpe.weight")->offset, off_b = b.params.find("wpe.weight")->offset;
    EXPECT_EQ(b.opt.v()[0].narrow(0, off_b, 48).to_vector<float>(),
              a.opt.v()[0].narrow(0, off_a, 48).to_vector<float>());
    // and the full format does the same
    const fs::path full = d / ("full" + std::to_string(vm));
    ckpt::TrainState st;
    st.step = 2;
    const std::string fwhere = ckpt::save_checkpoint(full.string(), a.gpt, a.params, a.opt, st, 0);
    Model f(c, 3);
    int64_t adam = 0;
    ckpt::load_checkpoint_local(fwhere, f.gpt, f.params, nn::flat_layout(models::GPT(c).units()), f.opt.m(),
                                f.opt.v(), &adam);
    EXPECT_EQ(f.gpt.wte.weight.to_vector<float>(), want);
    EXPECT_EQ(f.opt.v()[0].narrow(0, off_b, 48).to_vector<float>(),
              a.opt.v()[0].narrow(0, off_a, 48).to_vector<float>());
    EXPECT_EQ(f.opt.m()[0].narrow(0, 0, live).to_vector<float>(),
              a.opt.m()[0].narrow(0, 0, live).to_vector<float>());
  }
  // another model is still refused, naming what differs
  models::GPTConfig other = padded_vocab_gpt();
  other.n_layer = 3;
  Model o(other, 2);
  const std::string e = error_of([&] { ckpt::load_sharded(where, other, o.params, o.opt); });
  EXPECT_TRUE(has(e, "resume with the same [model] section")) << e;
}

TEST(Checkpoint, AnOldCheckpointThatCannotBeDeletedIsAWarningOnce) {
  // checkpoint.keep prunes old checkpoints after the new one is in place: a delete that
  // fails (here a file with the immutable attribute) warns once per path, the save succeeds
  fs::path d = ndt::testing::fresh_dir("ckpt_prune");
  models::GPT g(padded_vocab_gpt());
  nn::FlatParams p = nn::materialize(g.units(), Device::cpu(), DType::f32, 1);
  optim::AdamW o(p, {});
  ckpt::TrainState st;
  st.step = 2;
  ckpt::save_checkpoint(d.string(), g, p, o, st, 1);
  const fs::path stuck = d / "step_00000002";
  ndt::testing::Immutable pin(stuck / "model.safetensors");
  if (!pin.error().empty()) GTEST_SKIP() << "cannot make a file immutable here (" << pin.error() << ")";
  std::ostringstream out;
  ckpt::PruneLog log{&out};
  for (int s : {4, 6}) {
    st.step = s;
    std::string where;
    EXPECT_NO_THROW(where = ckpt::save_checkpoint(d.string(), g, p, o, st, 1, &log)) << "step " << s;
    EXPECT_EQ(ckpt::latest_checkpoint(d.string()).value_or(""), where);
  }
  const std::string w = out.str();
  EXPECT_EQ(std::count(w.begin(), w.end(), '\n'), 1) << "once per path: " << w;
  EXPECT_NE(w.find("warning: checkpoint.keep = 1: cannot delete the old checkpoint " + stuck.string() +
                   " (Operation not permitted)"),
            std::string::npos)
      << w;
  EXPECT_TRUE(fs::exists(stuck / "model.safetensors"));
  EXPECT_FALSE(fs::exists(d / "step_00000004"));  // the others are still pruned
  EXPECT_TRUE(fs::exists(d / "step_00000006" / "checkpoint.json"));
}

TEST(ExportWeights, RefusesAnOutputInsideTheCheckpointAndWritesAtomically) {
  fs::path d = ndt::testing::fresh_dir("ckpt_export");
  models::GPT g(padded_vocab_gpt());
  nn::FlatParams p = nn::materialize(g.units(), Device::cpu(), DType::f32, 1);
  optim::AdamW o(p, {});
  dist::DeviceMesh mesh(dist::ParallelDims{}, dist::init_world());  // one process
  ckpt::TrainState st;
  for (st.step = 0; st.step < 3; ++st.step) o.step(0.01);  // a manifest's step is AdamW's step count
  const fs::path ck = ckpt::save_sharded((d / "ck").string(), st, p, o, mesh, padded_vocab_gpt(), {}, 0);
  const std::vector<float> saved = p.units[1].data.to_vector<float>();
  for (; st.step < 5; ++st.step) o.step(0.01);
  const fs::path other = ckpt::save_sharded((d / "ck").string(), st, p, o, mesh, padded_vocab_gpt(), {}, 0);
  fs::create_symlink(ck / "shard_tp0_fsdp0.safetensors", d / "link.safetensors");
  fs::create_symlink(ck, d / "ck_link");
  const auto before = snapshot(d / "ck");
  struct Case {
    std::string from, out, expect;
  };
  const std::string in = "refused: it is inside the checkpoint ";
  const std::vector<Case> cases = {
      {ck.string(), (ck / "checkpoint.json").string(), in},                 // the manifest
      {ck.string(), (ck / "shard_tp0_fsdp0.safetensors").string(), in},     // a shard
      {ck.string(), (ck / "gpt2.safetensors").string(), in},                // a new file there
      {ck.string(), (ck / "sub" / ".." / "checkpoint.json").string(), in},  // through ".."
      {ck.string(), (d / "link.safetensors").string(), in},                 // a symlink to a shard
      {(d / "ck_link").string(), (ck / "checkpoint.json").string(), in},    // the input via a symlink
      {ck.string(), ck.string() + "/", "refused: it is the checkpoint directory "},  // the directory itself
      {ck.string(), (other / "gpt2.safetensors").string(),
       "refused: it is inside the checkpoint " + fs::canonical(other).string()},  // another checkpoint
  };
  for (const Case& c : cases) {
    const std::string e = error_of([&] { ckpt::export_weights(c.from, c.out); });
    EXPECT_NE(e.find(c.expect), std::string::npos) << c.out << ": " << e;
    EXPECT_EQ(snapshot(d / "ck"), before) << c.out;
  }
  ckpt::verify_checkpoint(ck.string());  // still whole
  // outside: written, and loads as GPT-2 weights
  const fs::path out = d / "gpt2.safetensors";
  ckpt::export_weights(ck.string(), out.string());
  models::GPT g2(padded_vocab_gpt());
  nn::FlatParams p2 = nn::materialize(g2.units(), Device::cpu(), DType::f32, 2);
  ckpt::load_weights(out.string(), g2, p2);
  EXPECT_EQ(p2.units[1].data.to_vector<float>(), saved);
  // checkpoint.dir stands for its latest checkpoint; a path that is not there, or a folder
  // that holds no checkpoint, is said as such
  EXPECT_EQ(ckpt::export_weights((d / "ck").string(), (d / "latest.safetensors").string()), other.string());
  ckpt::load_weights((d / "latest.safetensors").string(), g2, p2);
  EXPECT_EQ(p2.units[1].data.to_vector<float>(), p.units[1].data.to_vector<float>());
  EXPECT_NE(error_of([&] {
              ckpt::export_weights((d / "ck" / "step_00000009").string(), (d / "x.safetensors").string());
            }).find("step_00000009 does not exist: give a checkpoint's step folder"),
            std::string::npos);
  fs::create_directories(d / "empty");
  EXPECT_NE(error_of([&] {
              ckpt::export_weights((d / "empty").string(), (d / "x.safetensors").string());
            }).find("is neither a checkpoint (no checkpoint.json) nor a checkpoint.dir"),
            std::string::npos);
  EXPECT_FALSE(fs::exists(d / "x.safetensors"));
  // a failed export leaves the previous file as it was and no temporary file: a damaged
  // checkpoint fails before writing, a directory in the way fails at the rename
  std::ofstream(d / "old.safetensors") << "previous";
  const fs::path bad = d / "bad";
  fs::copy(ck, bad);
  fs::resize_file(bad / "shard_tp0_fsdp0.safetensors",
                  fs::file_size(bad / "shard_tp0_fsdp0.safetensors") - 1);
  EXPECT_NE(error_of([&] {
              ckpt::export_weights(bad.string(), (d / "old.safetensors").string());
            }).find("truncated"),
            std::string::npos);
  std::ifstream prev(d / "old.safetensors");
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(prev), std::istreambuf_iterator<char>()), "previous");
  // (a target not ending in .safetensors is a Hugging Face folder, written into a directory)
  fs::create_directories(d / "adir.safetensors");
  EXPECT_NE(error_of([&] {
              ckpt::export_weights(ck.string(), (d / "adir.safetensors").string());
            }).find("adir.safetensors: it is a directory, not a regular file"),
            std::string::npos);
  EXPECT_FALSE(fs::exists(d / "old.safetensors.tmp"));
  EXPECT_FALSE(fs::exists(d / "adir.safetensors.tmp"));
  EXPECT_TRUE(fs::is_empty(d / "adir.safetensors"));
  // the program: one line, a non-zero exit, the checkpoint untouched
  const ndt::testing::ShellResult r = ndt::testing::run_shell(
      std::string(NDT_EXPORT_BIN) + " " + ck.string() + " " + (ck / "checkpoint.json").string());
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_EQ(
      r.out.rfind("export_weights: error: export to " + (ck / "checkpoint.json").string() + " refused", 0),
      0u)
      << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
  EXPECT_EQ(snapshot(d / "ck"), before);
}

// ---- the run's tokenizer: carried by the checkpoints into the export ---------------------

namespace {

std::string read_all(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

nlohmann::json json_of(const fs::path& p) { return nlohmann::json::parse(read_all(p)); }

// train_gpt on the tests' word corpus in d/data: a tiny llama of `init`'s sizes (vocab_size 264).
ndt::testing::RunResult train_tiny(const fs::path& d, std::vector<std::string> more) {
  std::vector<std::string> args = {"--data.train",
                                   (d / "data" / "train_*.bin").string(),
                                   "--train.seq_len",
                                   "16",
                                   "--train.micro_batch_size",
                                   "2",
                                   "--train.eval_every",
                                   "0",
                                   "--train.threads",
                                   "1",
                                   "--sample.every",
                                   "-1",
                                   "--checkpoint.dir",
                                   (d / "ck").string()};
  args.insert(args.end(), more.begin(), more.end());
  return ndt::testing::run_train_gpt(args);
}

}  // namespace

// A run from a Hugging Face folder, trained with that folder's tokenizer: every checkpoint
// (sharded or full, resumed, resumed in the other format) holds the tokenizer and the files
// beside it, checkpoint.json names them with the folder's special ids, and the export is a
// whole folder: tokenizer.json, tokenizer_config.json, special_tokens_map.json and
// generation_config.json as the source had them, config.json with bos/eos/pad ids.
TEST(ExportWeights, AnExportCarriesTheRunsTokenizerFilesAndSpecialIds) {
  using Ids = ndt::testing::TinyHfIds;
  const fs::path d = ndt::testing::fresh_dir("ckpt_tokenizer");
  ndt::testing::write_tiny_hf_folder(d / "model");
  fs::copy(d / "model", d / "source");  // what the checkpoints and the export must hold
  ndt::testing::write_word_corpus(d / "data", 2000, 5, 0);
  const std::vector<std::string> beside = {"tokenizer.json", "tokenizer_config.json",
                                           "special_tokens_map.json", "generation_config.json"};
  ndt::testing::RunResult r = train_tiny(
      d, {"--model.init_from", (d / "model").string(), "--data.vocab",
          (d / "model" / "tokenizer.json").string(), "--train.steps", "2", "--checkpoint.format", "sharded"});
  ASSERT_EQ(r.rc, 0) << r.out << r.err;
  auto check_step = [&](const fs::path& step) {
    for (const std::string& f : beside) EXPECT_EQ(read_all(step / f), read_all(d / "source" / f)) << step / f;
    const nlohmann::json t = json_of(step / "checkpoint.json")["tokenizer"];
    EXPECT_EQ(t["vocabulary"], "tokenizer.json");
    EXPECT_EQ(t["files"].size(), 4u);
    EXPECT_EQ(t["bos_token_id"], Ids::bos);
    EXPECT_EQ(t["eos_token_id"], nlohmann::json::array({Ids::eos}));
    EXPECT_EQ(t["pad_token_id"], Ids::pad);
  };
  check_step(d / "ck" / "step_00000002");
  // resumed without model.init_from (its folder gone), the vocabulary a copy elsewhere: the
  // checkpoint's files and ids go on, into a full checkpoint, then a sharded one again
  fs::copy_file(d / "model" / "tokenizer.json", d / "tokenizer.json");
  fs::remove_all(d / "model");
  const std::vector<std::string> model = {"--model.arch",
                                          "llama",
                                          "--model.n_layer",
                                          "2",
                                          "--model.n_head",
                                          "4",
                                          "--model.n_kv_head",
                                          "2",
                                          "--model.n_embd",
                                          "32",
                                          "--model.intermediate_size",
                                          "48",
                                          "--model.vocab_size",
                                          std::to_string(Ids::vocab_size),
                                          "--model.block_size",
                                          "64",
                                          "--data.vocab",
                                          (d / "tokenizer.json").string()};
  for (const auto& [steps, format] : {std::pair{"3", "full"}, std::pair{"4", "sharded"}}) {
    std::vector<std::string> args = model;
    for (const char* a :
         {"--train.steps", steps, "--checkpoint.format", format, "--checkpoint.resume", "true"})
      args.push_back(a);
    r = train_tiny(d, args);
    ASSERT_EQ(r.rc, 0) << r.out << r.err;
    EXPECT_NE(r.out.find("resumed from "), std::string::npos) << r.out;
    check_step(d / "ck" / (std::string("step_0000000") + steps));
  }
  // the export: a whole folder, and nothing said about what it lacks
  std::ostringstream note;
  ckpt::export_weights((d / "ck").string(), (d / "hf").string(), DType::f32, note);
  EXPECT_EQ(note.str(), "");
  for (const std::string& f : beside) EXPECT_EQ(read_all(d / "hf" / f), read_all(d / "source" / f)) << f;
  const io::HfConfig out = io::read_hf_config((d / "hf" / "config.json").string());
  EXPECT_EQ(out.bos_token_id, Ids::bos);
  EXPECT_EQ(out.eos_token_id, std::vector<int64_t>{Ids::eos});
  EXPECT_EQ(out.pad_token_id, Ids::pad);
  EXPECT_EQ(data::TextCodec::find_in_folder((d / "hf").string()), (d / "hf" / "tokenizer.json").string());
}

// A run whose vocabulary is not model.init_from's tokenizer does not take that folder's
// files (they would describe another tokenizer): one note says so, and the checkpoint carries
// the run's own vocabulary (prepare_text's char vocab.json), exported as a tokenizer.json that
// reads back as the same vocabulary, with a plain tokenizer_config.json and no special ids.
TEST(ExportWeights, ACharVocabularyIsExportedAsATokenizerAndAForeignSourceIsNotCarried) {
  const fs::path d = ndt::testing::fresh_dir("ckpt_char_tokenizer");
  ndt::testing::write_tiny_hf_folder(d / "model");
  ndt::testing::write_word_corpus(d / "data", 2000, 5, 0);
  const ndt::testing::RunResult r = train_tiny(d, {"--model.init_from", (d / "model").string(),
                                                   "--train.steps", "1", "--checkpoint.format", "sharded"});
  ASSERT_EQ(r.rc, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("note: the tokenizer files of model.init_from " + (d / "model").string() +
                       " are not carried into the checkpoints: the run trains with " +
                       (d / "data" / "vocab.json").string() + ", not its tokenizer.json"),
            std::string::npos)
      << r.out;
  const fs::path step = d / "ck" / "step_00000001";
  EXPECT_EQ(read_all(step / "vocab.json"), read_all(d / "data" / "vocab.json"));
  EXPECT_FALSE(fs::exists(step / "tokenizer_config.json"));
  const nlohmann::json t = json_of(step / "checkpoint.json")["tokenizer"];
  EXPECT_EQ(t["vocabulary"], "vocab.json");
  EXPECT_FALSE(t.contains("bos_token_id") || t.contains("eos_token_id") || t.contains("pad_token_id")) << t;
  std::ostringstream note;
  ckpt::export_weights(step.string(), (d / "hf").string(), DType::f32, note);
  EXPECT_EQ(note.str(), "");
  const data::Vocab v = data::Vocab::load((d / "data" / "vocab.json").string());
  const data::TextCodec back = data::TextCodec::load((d / "hf").string());
  EXPECT_EQ(back.describe(), (d / "hf" / "tokenizer.json").string() + " (char vocabulary, " +
                                 std::to_string(v.size()) + " tokens)");
  const std::string text = "the cat sat";
  const std::vector<uint16_t> ids = v.encode(text);
  EXPECT_EQ(back.encode_prompt(text), std::vector<int32_t>(ids.begin(), ids.end()));
  EXPECT_EQ(json_of(d / "hf" / "tokenizer_config.json"),
            (nlohmann::json{{"tokenizer_class", "PreTrainedTokenizerFast"},
                            {"clean_up_tokenization_spaces", false}}));
  EXPECT_EQ(json_of(d / "hf" / "generation_config.json"), nlohmann::json::object());
  const io::HfConfig out = io::read_hf_config((d / "hf" / "config.json").string());
  EXPECT_FALSE(out.bos_token_id);
  EXPECT_TRUE(out.eos_token_id.empty());
}

// A checkpoint written before checkpoints carried a tokenizer exports as it always did (config.json
// and weights), with one line saying what the folder lacks; a damaged tokenizer file is one
// error naming it, before anything is written.
TEST(ExportWeights, AnOldCheckpointExportsWithANoteAndADamagedTokenizerFileIsNamed) {
  const fs::path d = ndt::testing::fresh_dir("ckpt_old_tokenizer");
  models::GPT g(padded_vocab_gpt());
  nn::FlatParams p = nn::materialize(g.units(), Device::cpu(), DType::f32, 1);
  optim::AdamW o(p, {});
  dist::DeviceMesh mesh(dist::ParallelDims{}, dist::init_world());
  ckpt::TrainState st;
  const fs::path old = ckpt::save_sharded((d / "old").string(), st, p, o, mesh, padded_vocab_gpt(), {}, 0);
  std::ostringstream note;
  ckpt::export_weights(old.string(), (d / "hf").string(), DType::f32, note);
  EXPECT_EQ(note.str(),
            "export: the folder has no tokenizer: the checkpoint carries none (written by an older ndtrain, "
            "or by a run without a vocabulary); give generate --tokenizer, and copy the tokenizer's files in "
            "for transformers\n");
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(d / "hf")) names.insert(e.path().filename().string());
  EXPECT_EQ(names, (std::set<std::string>{"config.json", "model.safetensors"}));
  // with a tokenizer (a byte vocabulary), one byte of it changed
  st.tokenizer.vocabulary = "vocab.json";
  st.tokenizer.files["vocab.json"] = data::Vocab::byte_level().to_json();
  const fs::path ck = ckpt::save_sharded((d / "ck").string(), st, p, o, mesh, padded_vocab_gpt(), {}, 0);
  EXPECT_EQ(ckpt::read_tokenizer_files(ck.string()), st.tokenizer);
  std::string bytes = read_all(ck / "vocab.json");
  bytes[bytes.size() / 2] ^= 1;
  std::ofstream(ck / "vocab.json", std::ios::binary) << bytes;
  const std::string e =
      error_of([&] { ckpt::export_weights(ck.string(), (d / "hf2").string(), DType::f32, note); });
  EXPECT_NE(e.find("checkpoint file " + (ck / "vocab.json").string() + " fails its checksum"),
            std::string::npos)
      << e;
  EXPECT_FALSE(fs::exists(d / "hf2"));
}

// Without a source folder the special ids are those the tokenizer names (its post-processor's
// BOS, its end-of-text token), also in the tokenizer_config.json written for it; a char
// vocabulary holding bytes that are not UTF-8 is copied as vocab.json, with one line saying
// that transformers cannot load it.
TEST(ExportWeights, IdsComeFromTheTokenizerWithoutASourceAndAnInexpressibleVocabularyIsSaid) {
  using Ids = ndt::testing::TinyHfIds;
  const fs::path d = ndt::testing::fresh_dir("ckpt_tokenizer_ids");
  models::GPT g(padded_vocab_gpt());
  const nn::FlatParams p = nn::materialize(g.units(), Device::cpu(), DType::f32, 1);
  ckpt::TokenizerFiles bpe;
  bpe.vocabulary = "tokenizer.json";
  bpe.files["tokenizer.json"] = ndt::testing::tiny_bpe_tokenizer_json();
  std::ostringstream note;
  ckpt::export_hf((d / "bpe").string(), g, p, DType::f32, bpe, note);
  EXPECT_EQ(note.str(), "");
  const io::HfConfig c = io::read_hf_config((d / "bpe" / "config.json").string());
  EXPECT_EQ(c.bos_token_id, Ids::bos);
  EXPECT_EQ(c.eos_token_id, std::vector<int64_t>{Ids::eos});
  const nlohmann::json tc = json_of(d / "bpe" / "tokenizer_config.json");
  EXPECT_EQ(tc["bos_token"], "<s>");
  EXPECT_EQ(tc["eos_token"], "</s>");
  EXPECT_EQ(json_of(d / "bpe" / "generation_config.json"),
            (nlohmann::json{{"bos_token_id", Ids::bos}, {"eos_token_id", Ids::eos}}));
  ckpt::TokenizerFiles raw;
  raw.vocabulary = "vocab.json";
  raw.files["vocab.json"] = data::Vocab::build_char("ab\xff").to_json();
  ckpt::export_hf((d / "raw").string(), g, p, DType::f32, raw, note);
  EXPECT_NE(note.str().find("export: transformers cannot load this folder's tokenizer: its char vocabulary "
                            "holds bytes that are not UTF-8"),
            std::string::npos)
      << note.str();
  EXPECT_FALSE(fs::exists(d / "raw" / "tokenizer.json"));
  EXPECT_EQ(read_all(d / "raw" / "vocab.json"), raw.files["vocab.json"]);
  EXPECT_EQ(data::TextCodec::find_in_folder((d / "raw").string()), (d / "raw" / "vocab.json").string());
}
