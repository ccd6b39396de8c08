// The Llama family against Hugging Face transformers itself: tiny LlamaForCausalLM and
// Qwen2ForCausalLM models that transformers builds and saves (tests/scripts/hf_reference.py,
// in the venv of scripts/setup.sh --reference) load through model.init_from's path, and
// ndtrain's logits, loss and every gradient equal transformers' (float64 within 1e-10,
// float32 within 1e-5); a few steps of training in ndtrain, exported, give the same
// validation loss in transformers; fine-tuning's masked loss over packed documents (llama and
// GPT-2) is transformers' over the documents run one at a time (float64 within 1e-10). Every
// test skips, with the reason, where the venv is missing.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>

#include "autograd/engine.h"
#include "autograd/node.h"
#include "dist/tensor_parallel/tensor_parallel.h"
#include "models/generate.h"
#include "models/gpt.h"
#include "nn/moe.h"
#include "support/corpus.h"
#include "support/hf_fixture.h"
#include "support/launch.h"
#include "support/outputs.h"
#include "support/testing.h"
#include "tokenizer/tokenizer.h"
#include "train/checkpoint/hf.h"
#include "train/checkpoint/load.h"
#include "train/data/data.h"
#include "train/data/preparation.h"
#include "train/data/text.h"
#include "train/io/safetensors.h"

using namespace ndt;
namespace fs = std::filesystem;

namespace {

// hf_reference.py with the venv's python; rc 3 (or no venv): the reason to skip.
ndt::testing::ShellResult reference(const std::string& args) {
  if (!fs::exists(ndt::testing::reference_python()))
    return {3, "transformers/torch not available: no venv at " + ndt::testing::reference_python() +
                   " (scripts/setup.sh --reference)"};
  return ndt::testing::run_shell(ndt::testing::reference_python() + " " + NDT_SOURCE_DIR +
                                 "/tests/scripts/hf_reference.py " + args);
}

fs::path temp_dir(const std::string& name) { return ndt::testing::fresh_dir("hf_" + name); }

using ndt::testing::max_rel;

// The folder made by transformers, loaded as train_gpt loads it; logits, loss and gradients
// against transformers' within `tol` (relative to each tensor's largest value).
void check_against_transformers(const std::string& arch, const std::string& dtype, double tol) {
  const fs::path d = temp_dir(arch + dtype);
  const ndt::testing::ShellResult made =
      reference("make " + d.string() + " --arch " + arch + " --dtype " + dtype);
  if (made.rc == 3) GTEST_SKIP() << made.out;
  ASSERT_EQ(made.rc, 0) << made.out;
  const io::HfFolder folder((d / "model").string());
  const models::GPTConfig cfg = ckpt::model_config(folder.config());
  EXPECT_EQ(cfg.arch, "llama");
  EXPECT_EQ(cfg.kv_heads(), 2);
  EXPECT_EQ(cfg.attention_bias, arch == "qwen2" || arch == "qwen2_moe");
  const bool qwen3 = arch == "qwen3" || arch == "qwen3_moe",
             moe = arch == "qwen3_moe" || arch == "qwen2_moe" || arch == "mixtral";
  EXPECT_EQ(cfg.qk_norm, qwen3);
  EXPECT_EQ(cfg.head_dim(), qwen3 ? 24 : 16);  // qwen3: 4 heads of 24 from a width of 64
  EXPECT_EQ(cfg.tied(), arch == "qwen3");
  EXPECT_EQ(cfg.moe_layers(), arch == "qwen3_moe" || arch == "qwen2_moe" ? 1
                              : arch == "mixtral"                        ? 2
                                                                         : 0);  // qwen*_moe: layer 1 dense
  EXPECT_EQ(cfg.shared_expert_intermediate_size, arch == "qwen2_moe" ? 56 : 0);
  EXPECT_EQ(cfg.router_aux_loss_coef, moe ? 0.25 : 0.0);
  models::GPT gpt(cfg);
  const DType dt = dtype == "float64" ? DType::f64 : DType::f32;
  nn::FlatParams params = nn::materialize(gpt.units(), Device::cpu(), dt, 1);
  ckpt::load_hf_local(folder, gpt, params);
  io::SafeTensorsReader ref((d / "reference.safetensors").string());
  const Tensor x = ref.get("inputs", DType::i32), y = ref.get("targets", DType::i32);
  const int64_t B = x.size(0), T = x.size(1), V = cfg.vocab_size;

  {  // logits: the padded vocabulary columns aside
    autograd::NoGradGuard no_grad;
    const Tensor logits = gpt.forward(x, Tensor()).logits;  // (B*T, Vp)
    const Tensor ours = logits.narrow(1, 0, V).contiguous().view({B, T, V});
    const double err = max_rel(ours, ref.get("logits", DType::f64));
    EXPECT_LT(err, tol) << "logits";
    std::cout << arch << " " << dtype << ": logits within " << err << " of transformers'\n";
  }
  const models::GPTOutput out = gpt.forward(x, y);
  const Tensor loss = out.loss;  // MoE: + 0.25 x the load-balancing loss
  EXPECT_LT(std::abs(loss.item() - ref.get("loss", DType::f64).item()), tol * std::abs(loss.item()))
      << "loss";
  if (moe) {
    const double aux = out.aux_loss.item(), theirs = ref.get("aux_loss", DType::f64).item();
    EXPECT_LT(std::abs(aux - theirs), tol * std::abs(theirs)) << "the load-balancing loss";
    std::cout << arch << " " << dtype << ": load-balancing loss " << aux << ", transformers' " << theirs
              << "\n";
  }
  backward(loss);
  int compared = 0;
  double worst = 0;
  for (auto& [name, grad] :
       ckpt::hf_tensors(gpt, [&](const std::string& n) { return params.find(n)->value.grad(); })) {
    ASSERT_TRUE(ref.has("grad." + name)) << name;
    const double err = max_rel(grad, ref.get("grad." + name, DType::f64));
    EXPECT_LT(err, tol) << "gradient of " << name;
    worst = std::max(worst, err);
    ++compared;
  }
  std::cout << arch << " " << dtype << ": " << compared << " gradients within " << worst << "\n";
  // every parameter of transformers' (the experts' under the folder's per-expert names)
  EXPECT_EQ(compared, static_cast<int>(ref.entries().size()) - (moe ? 5 : 4));
  fs::remove_all(d);
}

}  // namespace

TEST(HfModels, LlamaWithLlama3RopeEqualsTransformersInFloat64) {
  check_against_transformers("llama", "float64", 1e-10);
}
// Mixtures of experts: the router, the top 2 of 4 experts (Qwen3-MoE's weights as the softmax
// gives them, Mixtral's renormalised), a dense layer beside an MoE one (Qwen3-MoE's
// mlp_only_layers), and the load-balancing loss over every MoE layer in the loss.
TEST(HfModels, Qwen3MoeEqualsTransformersInFloat64) {
  check_against_transformers("qwen3_moe", "float64", 1e-10);
}
// Qwen2-MoE: q, k, v biases, the routed experts (not renormalised) beside the shared expert, a
// SwiGLU of its own gated per token by sigmoid(shared_expert_gate x), every gradient of it too.
TEST(HfModels, Qwen2MoeWithASharedExpertEqualsTransformersInFloat64) {
  check_against_transformers("qwen2_moe", "float64", 1e-10);
}
TEST(HfModels, Qwen2MoeEqualsTransformersInFloat32) {
  check_against_transformers("qwen2_moe", "float32", 1e-5);
}
TEST(HfModels, MixtralEqualsTransformersInFloat64) {
  check_against_transformers("mixtral", "float64", 1e-10);
}
TEST(HfModels, Qwen3MoeEqualsTransformersInFloat32) {
  check_against_transformers("qwen3_moe", "float32", 1e-5);
}

TEST(HfModels, Qwen2WithQkvBiasesEqualsTransformersInFloat64) {
  check_against_transformers("qwen2", "float64", 1e-10);
}
TEST(HfModels, Qwen3WithQkNormsAndItsOwnHeadSizeEqualsTransformersInFloat64) {
  check_against_transformers("qwen3", "float64", 1e-10);
}

namespace {

// A model changed in ndtrain (one gradient step from transformers' folder, so that no weight,
// the norms', the routers' and the experts' included, is where transformers put it), exported in
// float64, loaded by transformers: its loss on the same windows is ndtrain's (evaluation's: the
// cross-entropy alone).
void check_export(const std::string& arch, int64_t head_dim) {
  const fs::path d = temp_dir(arch + "_export");
  const ndt::testing::ShellResult made =
      reference("make " + d.string() + " --arch " + arch + " --dtype float64");
  if (made.rc == 3) GTEST_SKIP() << made.out;
  ASSERT_EQ(made.rc, 0) << made.out;
  const io::HfFolder folder((d / "model").string());
  models::GPTConfig cfg = ckpt::model_config(folder.config());
  if (cfg.moe()) cfg.router_z_loss_coef = 0.1;  // a training option of ndtrain's: not exported
  models::GPT gpt(cfg);
  nn::FlatParams params = nn::materialize(gpt.units(), Device::cpu(), DType::f64, 1);
  ckpt::load_hf_local(folder, gpt, params);
  io::SafeTensorsReader ref((d / "reference.safetensors").string());
  backward(gpt.forward(ref.get("inputs", DType::i32), ref.get("targets", DType::i32)).loss);
  for (const nn::FlatUnit& u : params.units)  // w -= 0.5 dw
    for (const nn::FlatParam& p : u.params) {
      const std::vector<double> g = p.value.grad().contiguous().to_vector<double>();
      double* w = p.value.data<double>();
      for (size_t i = 0; i < g.size(); ++i) w[i] -= 0.5 * g[i];
    }
  ckpt::export_hf((d / "export").string(), gpt, params, DType::f64);
  const io::HfConfig back = io::read_hf_config((d / "export" / "config.json").string());
  EXPECT_EQ(back.model_type, arch);
  EXPECT_EQ(back.head_dim, head_dim);
  EXPECT_EQ(back.num_experts, gpt.cfg.n_experts);
  EXPECT_EQ(back.shared_expert_intermediate_size, gpt.cfg.shared_expert_intermediate_size);
  const models::GPTConfig again = ckpt::model_config(back);
  EXPECT_EQ(again.router_z_loss_coef, 0.0);  // the folder has no z-loss
  EXPECT_EQ(again.shared_expert_intermediate_size, gpt.cfg.shared_expert_intermediate_size);
  // 2 windows of 16 tokens (+1) from the vocabulary of 96
  std::vector<uint16_t> tokens;
  for (int i = 0; i < 33; ++i) tokens.push_back(static_cast<uint16_t>((i * 37 + 11) % 96));
  data::write_shard((d / "val.bin").string(), tokens);
  std::vector<int32_t> xs, ys;
  for (int i = 0; i < 32; ++i) xs.push_back(tokens[i]), ys.push_back(tokens[i + 1]);
  double ours = 0;
  {
    autograd::NoGradGuard no_grad;
    gpt.training = false;  // evaluation's loss: the cross-entropy alone
    ours = gpt.forward(Tensor::from_vector(xs, {2, 16}), Tensor::from_vector(ys, {2, 16})).loss.item();
  }
  const ndt::testing::ShellResult r =
      reference("eval " + (d / "export").string() + " --tokens " + (d / "val.bin").string() +
                " --seq-len 16 --batch-size 2 --batches 1 --dtype float64");
  ASSERT_EQ(r.rc, 0) << r.out;
  const size_t l = r.out.find("loss ");
  ASSERT_NE(l, std::string::npos) << r.out;
  const double theirs = std::stod(r.out.substr(l + 5));
  EXPECT_NEAR(theirs, ours, 1e-10 * ours) << r.out;
  EXPECT_GT(std::abs(ours - ref.get("loss", DType::f64).item()), 1e-3) << "the step changed nothing";
  std::cout << arch << " export: loss " << ours << " in ndtrain, " << theirs << " in transformers\n";
  fs::remove_all(d);
}

}  // namespace

TEST(HfModels, Qwen3ExportedLoadsInTransformersWithTheSameLoss) { check_export("qwen3", 24); }
TEST(HfModels, Qwen3MoeExportedLoadsInTransformersWithTheSameLoss) { check_export("qwen3_moe", 24); }
TEST(HfModels, MixtralExportedLoadsInTransformersWithTheSameLoss) { check_export("mixtral", 16); }
TEST(HfModels, Qwen2MoeExportedLoadsInTransformersWithTheSameLoss) { check_export("qwen2_moe", 16); }

TEST(HfModels, LlamaEqualsTransformersInFloat32) { check_against_transformers("llama", "float32", 1e-5); }

// Trained in ndtrain from the folder, exported, loaded back by transformers: the same
// validation loss on the same windows.
TEST(HfModels, TrainedExportedAndLoadedByTransformersGivesTheSameLoss) {
  const fs::path d = temp_dir("roundtrip");
  const ndt::testing::ShellResult made = reference("make " + d.string() + " --arch llama --dtype float32");
  if (made.rc == 3) GTEST_SKIP() << made.out;
  ASSERT_EQ(made.rc, 0) << made.out;
  const int64_t V = ndt::testing::write_word_corpus(d / "data", 4000, 3, 0.3);
  ASSERT_LE(V, 96) << "the corpus' vocabulary must fit the model's 96 tokens";
  const std::string run =
      std::string(NDT_TRAIN_GPT_BIN) + " --model.init_from " + (d / "model").string() + " --data.train '" +
      (d / "data" / "train_*.bin").string() + "' --data.val '" + (d / "data" / "val_*.bin").string() +
      "' --train.micro_batch_size 2 --train.seq_len 16 --train.eval_steps 3 --train.eval_every 0"
      " --train.threads 1 --sample.every -1 --optim.lr 0.01 --optim.warmup_steps 1";
  const std::string checkpoints = " --checkpoint.dir " + (d / "ck").string();
  // a model key that contradicts config.json is one line
  ndt::testing::ShellResult r =
      ndt::testing::run_shell(run + checkpoints + " --train.steps 3 --model.n_head 8");
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_TRUE(r.out.find("model.n_head = 8 (given) but 4 in ") != std::string::npos) << r.out;
  // --train.steps 0 evaluates the folder's weights as they are: transformers' loss on them
  r = ndt::testing::run_shell(run + " --train.steps 0");
  ASSERT_EQ(r.rc, 0) << r.out;
  ASSERT_NE(r.out.find("final val loss "), std::string::npos) << r.out;
  const double loaded = std::stod(r.out.substr(r.out.find("final val loss ") + 15));
  ndt::testing::ShellResult t =
      reference("eval " + (d / "model").string() + " --tokens " + (d / "data" / "val_000000.bin").string() +
                " --seq-len 16 --batch-size 2 --batches 3 --dtype float32");
  ASSERT_EQ(t.rc, 0) << t.out;
  EXPECT_NEAR(std::stod(t.out.substr(t.out.find("loss ") + 5)), loaded, 1e-4 * loaded) << t.out;
  r = ndt::testing::run_shell(run + checkpoints + " --train.steps 5");
  ASSERT_EQ(r.rc, 0) << r.out;
  const size_t at = r.out.find("final val loss ");
  ASSERT_NE(at, std::string::npos) << r.out;
  const double ours = std::stod(r.out.substr(at + 15));
  r = ndt::testing::run_shell(std::string(NDT_EXPORT_BIN) + " " + (d / "ck" / "step_00000005").string() +
                              " " + (d / "export").string());
  ASSERT_EQ(r.rc, 0) << r.out;
  r = reference("eval " + (d / "export").string() + " --tokens " + (d / "data" / "val_000000.bin").string() +
                " --seq-len 16 --batch-size 2 --batches 3 --dtype float32");
  ASSERT_EQ(r.rc, 0) << r.out;
  const size_t l = r.out.find("loss ");
  ASSERT_NE(l, std::string::npos) << r.out;
  EXPECT_NEAR(std::stod(r.out.substr(l + 5)), ours, 1e-4 * std::abs(ours)) << r.out;
  std::cout << "val loss after 5 steps: ndtrain " << ours << ", transformers on the export "
            << r.out.substr(l + 5);
  fs::remove_all(d);
}

// ---- packed documents: fine-tuning's loss against the documents run one at a time ----------

namespace {

// hf_reference.py packed: a random float64 model in a Hugging Face folder, and transformers'
// loss over 9 documents each run alone (mean over their trained targets). Here the documents
// laid end to end in a shard with their loss mask and document starts, as prepare_text writes
// a .jsonl's rows, read by the loader as one window of 2 rows; ndtrain's masked loss on it with
// the documents (each attends to itself, its positions restart) must be transformers'.
void check_packed_against_transformers(const std::string& arch) {
  const fs::path d = temp_dir("packed_" + arch);
  const ndt::testing::ShellResult made = reference("packed " + d.string() + " --arch " + arch);
  if (made.rc == 3) GTEST_SKIP() << made.out;
  ASSERT_EQ(made.rc, 0) << made.out;
  const nlohmann::json ref = nlohmann::json::parse(std::ifstream(d / "packed.json"));
  const int64_t T = ref["T"].get<int64_t>(), rows = ref["rows"].get<int64_t>();
  std::vector<uint32_t> tok;
  std::string mask, first;  // a byte a token: trained; the first of a document
  for (const nlohmann::json& doc : ref["documents"]) {
    for (const nlohmann::json& id : doc["ids"]) tok.push_back(id.get<uint32_t>());
    for (const nlohmann::json& t : doc["trained"]) mask += static_cast<char>(t.get<int>());
    first += '\1' + std::string(doc["ids"].size() - 1, '\0');
  }
  const int64_t n = static_cast<int64_t>(tok.size());
  ASSERT_EQ(n, rows * T + 1);
  const fs::path data = d / "data";
  fs::create_directories(data);
  data::write_shard((data / "train_000000.bin").string(), tok, data::ShardFormat::u16);
  std::ofstream(data / "train_000000.mask", std::ios::binary) << mask;
  std::ofstream(data / "train_000000.docs", std::ios::binary) << first;
  data::Preparation p{data.string(), "0123456789abcdef", "", {{"train_000000.bin", n}}, {}};
  p.sidecars["train_000000.bin"] = {"train_000000.mask", "train_000000.docs", n};
  data::write_preparation(p);

  const io::HfFolder folder((d / "model").string());
  models::GPT gpt(ckpt::model_config(folder.config()));
  EXPECT_EQ(gpt.cfg.arch, arch);
  nn::FlatParams params = nn::materialize(gpt.units(), Device::cpu(), DType::f64, 1);
  ckpt::load_hf_local(folder, gpt, params);
  data::DataLoader loader((data / "train_*.bin").string(), rows, T, 0, 1, false, 0, gpt.cfg.vocab_size);
  const data::Batch b = loader.next();  // inputs, targets, docs (rows, T)
  ASSERT_TRUE(b.docs.defined());
  int64_t trained = 0;
  for (int32_t y : b.targets.to_vector<int32_t>()) trained += y >= 0;
  EXPECT_EQ(trained, ref["targets"].get<int64_t>()) << "the targets the loader trains are not transformers'";
  autograd::NoGradGuard no_grad;
  const double want = ref["loss"].get<double>(),
               ours = gpt.forward(b.inputs, b.targets, 0, b.docs).loss.item();
  const double as_one = gpt.forward(b.inputs, b.targets).loss.item();  // each row one document
  EXPECT_NEAR(ours, want, 1e-10);
  EXPECT_GT(std::abs(as_one - want), 1e-3) << "the test must tell the documents apart";
  std::cout << arch << " float64: the masked loss of " << ref["documents"].size() << " packed documents "
            << ours << ", transformers' over each alone " << want << " (" << std::abs(ours - want)
            << " apart; " << as_one << " without documents)\n";
  fs::remove_all(d);
}

}  // namespace

TEST(HfModels, PackedDocumentsOfALlamaGiveTransformersLossOverEachAlone) {
  check_packed_against_transformers("llama");
}
// learned positions: equal only when each document's positions restart at 0
TEST(HfModels, PackedDocumentsOfGpt2GiveTransformersLossOverEachAlone) {
  check_packed_against_transformers("gpt2");
}

// ---- a whole exported folder: its tokenizer too --------------------------------------------

namespace {

// The export at `hf` (a folder with a tokenizer) in transformers, from the folder alone:
// AutoTokenizer's ids of `prompt` and `text` equal ndtrain's (data::TextCodec on the folder),
// AutoModelForCausalLM's greedy tokens after the prompt equal models::generate's, and what
// pipeline("text-generation") writes equals what build/generate --model HF writes, which
// needs no --tokenizer.
void check_export_in_transformers(const fs::path& hf, const std::string& prompt, const std::string& text) {
  constexpr int kNew = 12;
  const ndt::testing::ShellResult r = reference("generate " + hf.string() + " --prompt '" + prompt +
                                                "' --text '" + text + "' --new " + std::to_string(kNew));
  if (r.rc == 3) GTEST_SKIP() << r.out;
  ASSERT_EQ(r.rc, 0) << r.out;
  const nlohmann::json ref = nlohmann::json::parse(r.out.substr(r.out.rfind("{\"prompt_ids\"")));
  const data::TextCodec codec = data::TextCodec::load(hf.string());
  const std::vector<int32_t> prompt_ids = codec.encode_prompt(prompt);
  EXPECT_EQ(prompt_ids, ref["prompt_ids"].get<std::vector<int32_t>>());
  EXPECT_EQ(codec.encode_prompt(text), ref["text_ids"].get<std::vector<int32_t>>());
  const ckpt::WeightSource src = ckpt::find_weights(hf.string());
  models::GPT gpt(ckpt::model_config_of(src));
  nn::FlatParams params = nn::materialize(gpt.units(), Device::cpu(), DType::f32, 0);
  ckpt::load_weights(src, gpt, params);
  models::SampleOptions greedy{.max_new_tokens = kNew, .temperature = 0};
  const std::vector<int32_t> ids = models::generate(gpt, prompt_ids, greedy, Device::cpu());
  EXPECT_EQ(std::vector<int32_t>(ids.begin() + prompt_ids.size(), ids.end()),
            ref["greedy"].get<std::vector<int32_t>>());
  const ndt::testing::ShellResult g = ndt::testing::run_shell(  // its text only
      "(" + std::string(NDT_GENERATE_BIN) + " --model " + hf.string() + " --prompt '" + prompt +
      "' --temperature 0 --max_new_tokens " + std::to_string(kNew) + " --threads 1 2>/dev/null)");
  ASSERT_EQ(g.rc, 0) << g.out;
  EXPECT_EQ(g.out, ref["pipeline"].get<std::string>() + "\n");
  std::cout << "transformers' pipeline on the export: " << ref["pipeline"].dump() << "\n";
}

// 30 steps of train_gpt with `args` on d/data's shards into a sharded checkpoint d/ck, then
// export_weights of it as the Hugging Face folder d/hf.
void train_and_export(const fs::path& d, const std::string& args) {
  ndt::testing::ShellResult r = ndt::testing::run_shell(
      std::string(NDT_TRAIN_GPT_BIN) + args + " --data.train '" + (d / "data" / "train_*.bin").string() +
      "' --train.eval_every 0 --train.threads 1 --sample.every -1 --optim.lr 0.01 --train.steps 30 "
      "--checkpoint.format sharded --checkpoint.dir " +
      (d / "ck").string());
  ASSERT_EQ(r.rc, 0) << r.out;
  r = ndt::testing::run_shell(std::string(NDT_EXPORT_BIN) + " " + (d / "ck").string() + " " +
                              (d / "hf").string());
  ASSERT_EQ(r.rc, 0) << r.out;
}

}  // namespace

// A llama trained from a Hugging Face folder with its byte-level BPE tokenizer (BOS put first,
// special <s> </s> <pad>), exported: transformers runs the folder as it is.
TEST(HfModels, AnExportWithTheSourcesTokenizerRunsInTransformersAsInNdtrain) {
  const fs::path d = temp_dir("export_bpe");
  ndt::testing::write_tiny_hf_folder(d / "model");
  // text in the folder's tokenizer, as prepare_text --tokenizer would make it
  const tok::Tokenizer t = tok::Tokenizer::from_file((d / "model").string());
  std::string text;
  const char* words[] = {"the", "cat", "sat", "on", "the", "mat", "and", "then", "ran"};
  for (int i = 0; i < 3000; ++i) text += std::string(words[(i * 7 + i / 5) % 9]) + (i % 9 == 8 ? ".\n" : " ");
  const std::vector<int32_t> ids = t.encode(text, /*add_special=*/true);
  fs::create_directories(d / "data");
  data::write_shard((d / "data" / "train_000000.bin").string(),
                    std::vector<uint16_t>(ids.begin(), ids.end()));
  ASSERT_NO_FATAL_FAILURE(train_and_export(
      d, " --model.init_from " + (d / "model").string() + " --data.vocab " +
             (d / "model" / "tokenizer.json").string() + " --train.micro_batch_size 2 --train.seq_len 16"));
  check_export_in_transformers(d / "hf", "the cat", "then the cat ran.\n<s>the end");
  fs::remove_all(d);
}

// A llama trained on prepare_text's char vocabulary, exported: the vocabulary is a
// tokenizer.json that transformers loads and that gives ndtrain's ids.
TEST(HfModels, AnExportOfACharVocabularyRunsInTransformersAsInNdtrain) {
  const fs::path d = temp_dir("export_char");
  const int64_t V = ndt::testing::write_word_corpus(d / "data", 3000, 11, 0);
  ASSERT_NO_FATAL_FAILURE(train_and_export(
      d,
      " --model.arch llama --model.n_layer 2 --model.n_head 4 --model.n_kv_head 2 "
      "--model.n_embd 32 --model.intermediate_size 48 --model.block_size 64 --model.vocab_size " +
          std::to_string(V) + " --train.micro_batch_size 4 --train.seq_len 32"));
  check_export_in_transformers(d / "hf", "the ", "a dog ran.\nit sat on the mat");
  fs::remove_all(d);
}

// ---- without transformers: ndtrain's own folders ------------------------------------------

namespace {

models::GPTConfig tiny_llama() {
  models::GPTConfig c{.arch = "llama",
                      .n_layer = 2,
                      .n_head = 4,
                      .n_embd = 16,
                      .vocab_size = 21,
                      .block_size = 32,
                      .vocab_multiple = 8};
  c.n_kv_head = 2;
  c.intermediate_size = 24;
  c.attention_bias = true;
  c.rope = {.theta = 10000, .llama3 = models::Llama3Scaling{8, 1, 4, 16}};
  return c;
}

}  // namespace

TEST(HfFolders, AnExportReadsBackBitForBitWholeAndAsATensorParallelRank) {
  const fs::path d = temp_dir("own");
  models::GPT a(tiny_llama());
  nn::FlatParams pa = nn::materialize(a.units(), Device::cpu(), DType::f32, 5);
  ckpt::export_hf((d / "m").string(), a, pa, DType::f32);
  EXPECT_TRUE(ckpt::is_hf_folder((d / "m").string()));
  const io::HfFolder folder((d / "m").string());
  EXPECT_EQ(folder.config().model_type, "qwen2");  // biases on q, k and v
  const models::GPTConfig back = ckpt::model_config(folder.config());
  EXPECT_EQ(back.str(), [] {
    models::GPTConfig c = tiny_llama();
    c.vocab_multiple = 1;
    return c.str();
  }()) << back.str();
  models::GPTConfig padded = back;  // the padding is ours (model.vocab_multiple), not the folder's
  padded.vocab_multiple = 8;
  models::GPT b(padded);
  nn::FlatParams pb = nn::materialize(b.units(), Device::cpu(), DType::f32, 9);
  ckpt::load_hf_local(folder, b, pb);
  // the padded vocabulary rows (21 -> 24) are zero on both sides
  EXPECT_EQ(ndt::testing::all_values(pa), ndt::testing::all_values(pb));
  // rank 1 of tp 2 holds its kv group's columns of c_attn: the second half, as one block
  models::GPT c(padded);
  dist::split_tensor_parallel(c, 2, 1);
  nn::FlatParams pc = nn::materialize(c.units(), Device::cpu(), DType::f32, 9);
  ckpt::load_hf_local(folder, c, pc);
  const Tensor whole = pa.find("h.1.attn.c_attn.weight")->value,
               part = pc.find("h.1.attn.c_attn.weight")->value;
  const int64_t W = whole.size(1);
  ASSERT_EQ(part.size(1), W / 2);
  EXPECT_EQ(part.contiguous().to_vector<float>(),
            whole.narrow(1, W / 2, W / 2).contiguous().to_vector<float>());
  const Tensor down = pa.find("h.0.mlp.down_proj.weight")->value,
               down1 = pc.find("h.0.mlp.down_proj.weight")->value;
  EXPECT_EQ(down1.contiguous().to_vector<float>(), down.narrow(0, 12, 12).contiguous().to_vector<float>());
  fs::remove_all(d);
}

TEST(HfFolders, AMissingMisShapedOrUnknownTensorIsNamed) {
  const fs::path d = temp_dir("bad");
  models::GPT a(tiny_llama());
  nn::FlatParams pa = nn::materialize(a.units(), Device::cpu(), DType::f32, 5);
  const auto tensors = ckpt::hf_tensors(a, [&](const std::string& n) { return pa.find(n)->value; });
  const io::HfConfig cfg = ckpt::hf_config(a.cfg, DType::f32);
  auto write_without = [&](const std::string& name, const std::string& folder,
                           const std::function<void(io::HfFolderWriter&)>& more) {
    io::HfFolderWriter w;
    for (auto& [n, t] : tensors)
      if (n != name) w.add(n, t.to(DType::f32));
    more(w);
    w.write((d / folder).string(), cfg);
  };
  auto load_error = [&](const std::string& folder) {
    models::GPT b(tiny_llama());
    nn::FlatParams pb = nn::materialize(b.units(), Device::cpu(), DType::f32, 9);
    try {
      ckpt::load_hf_local(io::HfFolder((d / folder).string()), b, pb);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  write_without("model.layers.1.mlp.up_proj.weight", "missing", [](io::HfFolderWriter&) {});
  EXPECT_TRUE(load_error("missing").find("missing tensors: model.layers.1.mlp.up_proj.weight") !=
              std::string::npos)
      << load_error("missing");
  write_without("model.layers.0.self_attn.k_proj.weight", "shape", [](io::HfFolderWriter& w) {
    w.add("model.layers.0.self_attn.k_proj.weight", Tensor::zeros({8, 15}, DType::f32));
  });
  EXPECT_TRUE(
      load_error("shape").find("model.layers.0.self_attn.k_proj.weight has shape (8, 15), the model needs "
                               "(8, 16)") != std::string::npos)
      << load_error("shape");
  write_without("", "extra", [](io::HfFolderWriter& w) {
    w.add("model.layers.0.mlp.experts.0.weight", Tensor::zeros({2}, DType::f32));
  });
  EXPECT_TRUE(load_error("extra").find("unexpected tensors: model.layers.0.mlp.experts.0.weight") !=
              std::string::npos)
      << load_error("extra");
  write_without("model.layers.1.mlp.gate_proj.weight", "nan", [&](io::HfFolderWriter& w) {
    Tensor t;
    for (auto& [n, v] : tensors)
      if (n == "model.layers.1.mlp.gate_proj.weight") t = v.to(DType::f32).clone();
    t.data<float>()[7] = std::numeric_limits<float>::quiet_NaN();
    w.add("model.layers.1.mlp.gate_proj.weight", t);
  });
  EXPECT_TRUE(load_error("nan").find("tensor model.layers.1.mlp.gate_proj.weight holds NaN values") !=
              std::string::npos)
      << load_error("nan");
  fs::remove_all(d);
}

namespace {

// A Qwen3-MoE of 4 experts in layer 1 (layer 0 dense), small enough to load in every layout.
models::GPTConfig tiny_moe() {
  models::GPTConfig c = tiny_llama();
  c.attention_bias = false;
  c.qk_norm = true;
  c.n_experts = 4;
  c.n_experts_per_tok = 2;
  c.moe_intermediate_size = 8;
  c.dense_layers = "0";
  return c;
}

// The layout of rank r of expert parallelism 2 (dist::apply_expert_parallel's slices): every
// MoE layer's experts (E, in, out) -> its E / 2 of them
void hold_experts_of(models::GPT& gpt, int64_t r) {
  for (auto& block : gpt.h)
    if (auto* moe = dynamic_cast<nn::MoeBlock*>(block.get()))
      for (const char* name : {"gate_proj", "up_proj", "down_proj"})
        moe->mlp.experts.split_experts(name, 2, r);
}

// Checks every element a layout's load holds against the same element of the whole model's
// values; returns how many it checked.
int64_t expect_elements_of(const nn::FlatParams& whole, const nn::FlatParams& part) {
  int64_t checked = 0;
  for (const nn::FlatUnit& u : part.units)
    for (const nn::FlatParam& p : u.params) {
      const std::vector<float> w = whole.find(p.spec.name)->value.contiguous().to_vector<float>();
      nn::for_each_shard_run(u, p, [&](int64_t dst, int64_t g, int64_t len) {
        EXPECT_EQ(u.data.narrow(0, dst, len).to_vector<float>(),
                  std::vector<float>(w.begin() + g, w.begin() + g + len))
            << p.spec.name << " elements [" << g << ", " << g + len << ")";
        checked += len;
      });
    }
  return checked;
}

}  // namespace

// An expert-parallel rank reads only its own experts' tensors from the folder (half the experts'
// bytes at ep 2), an FSDP shard only the experts its part of the buffer touches, and every
// element each holds is the whole model's.
TEST(HfFolders, AnExpertParallelRankReadsOnlyItsExperts) {
  const fs::path d = temp_dir("moe_slices");
  models::GPT a(tiny_moe());
  nn::FlatParams pa = nn::materialize(a.units(), Device::cpu(), DType::f32, 5);
  ckpt::export_hf((d / "m").string(), a, pa, DType::f32);
  int64_t all_bytes = 0, expert_bytes = 0;  // the folder's tensor data
  {
    const io::HfFolder f((d / "m").string());
    ASSERT_EQ(f.config().model_type, "qwen3_moe");
    for (const std::string& n : f.names()) {
      const int64_t b = static_cast<int64_t>(f.entry(n).end - f.entry(n).begin);
      all_bytes += b;
      if (n.find(".mlp.experts.") != std::string::npos) expert_bytes += b;
    }
  }
  EXPECT_EQ(expert_bytes, 3 * 4 * 8 * 16 * 4);  // {gate,up,down} x 4 experts x (8, 16) x f32
  auto load = [&](int64_t ep_rank, nn::ShardSpec shard, int64_t* bytes) {
    models::GPT b(tiny_moe());
    if (ep_rank >= 0) hold_experts_of(b, ep_rank);
    nn::FlatParams pb = nn::materialize(b.units(), Device::cpu(), DType::f32, 9, shard);
    const io::HfFolder f((d / "m").string());
    ckpt::load_hf_local(f, b, pb);
    *bytes = f.bytes_read();
    return pb;
  };
  int64_t bytes = 0;
  const nn::FlatParams whole = load(-1, {}, &bytes);
  EXPECT_EQ(ndt::testing::all_values(whole), ndt::testing::all_values(pa));
  EXPECT_EQ(bytes, all_bytes);  // every tensor read once
  int64_t n = 0;                // the model's elements
  for (const nn::FlatUnit& u : pa.units)
    for (const nn::FlatParam& p : u.params) n += numel_of(p.spec.shape);
  const int64_t half_experts = 3 * 2 * 8 * 16;  // 2 of the 4 experts' elements
  for (int64_t r = 0; r < 2; ++r) {
    const nn::FlatParams ep = load(r, {}, &bytes);
    EXPECT_EQ(expect_elements_of(pa, ep), n - half_experts) << "ep rank " << r;
    EXPECT_EQ(bytes, all_bytes - expert_bytes / 2) << "ep rank " << r;
    std::cout << "ep rank " << r << " of 2 read " << bytes << " bytes, the whole model " << all_bytes << "\n";
  }
  for (int64_t ep_rank : {-1, 0, 1}) {  // FSDP 2 alone, and on each ep rank: the shards cover it
    int64_t checked = 0;
    for (int64_t s = 0; s < 2; ++s) {
      const nn::FlatParams part = load(ep_rank, {s, 2}, &bytes);
      checked += expect_elements_of(pa, part);
      EXPECT_LE(bytes, ep_rank < 0 ? all_bytes : all_bytes - expert_bytes / 2);
      std::cout << "ep rank " << ep_rank << ", fsdp shard " << s << " of 2 read " << bytes << " bytes\n";
    }
    EXPECT_EQ(checked, ep_rank < 0 ? n : n - half_experts) << "ep rank " << ep_rank;
  }
  fs::remove_all(d);
}

// The finite check stays on what is read: a NaN in expert 3 is named by the ep rank holding it
// (rank 1 of 2: experts 2 and 3); rank 0 never reads that tensor.
TEST(HfFolders, ANonFiniteExpertIsNamedByTheRankThatReadsIt) {
  const fs::path d = temp_dir("moe_nan");
  models::GPT a(tiny_moe());
  nn::FlatParams pa = nn::materialize(a.units(), Device::cpu(), DType::f32, 5);
  const std::string bad = "model.layers.1.mlp.experts.3.down_proj.weight";
  io::HfFolderWriter w;
  for (auto& [name, t] : ckpt::hf_tensors(a, [&](const std::string& n) { return pa.find(n)->value; })) {
    Tensor v = t.to(DType::f32).clone();
    if (name == bad) v.data<float>()[5] = std::numeric_limits<float>::quiet_NaN();
    w.add(name, v);
  }
  w.write((d / "m").string(), ckpt::hf_config(a.cfg, DType::f32));
  auto load_error = [&](int64_t ep_rank) {
    models::GPT b(tiny_moe());
    hold_experts_of(b, ep_rank);
    nn::FlatParams pb = nn::materialize(b.units(), Device::cpu(), DType::f32, 9);
    try {
      ckpt::load_hf_local(io::HfFolder((d / "m").string()), b, pb);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(load_error(0), "no error");
  EXPECT_NE(load_error(1).find("tensor " + bad + " holds NaN values"), std::string::npos) << load_error(1);
  fs::remove_all(d);
}
