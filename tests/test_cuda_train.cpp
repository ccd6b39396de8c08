// train_gpt on a GPU against the same run on the CPU: a tiny GPT, a few steps; the losses
// agree to f32 rounding in strict f32, to TF32's and bf16's rounding with those (label gpu;
// skips without a CUDA device).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "support/testing.h"
#include "tensor/cuda/runtime.h"
#include "train/data.h"
#include "train/trainer.h"

using namespace ndt;
namespace fs = std::filesystem;

namespace {

std::vector<double> train_losses(const fs::path& d, const std::string& device,
                                 const std::vector<std::string>& extra = {}) {
  static int run = 0;
  const std::string metrics = (d / ("m_" + device + std::to_string(run++) + ".jsonl")).string();
  std::vector<std::string> args = {"train_gpt",
                                   "--data.train",
                                   (d / "train.bin").string(),
                                   "--model.n_layer",
                                   "2",
                                   "--model.n_head",
                                   "2",
                                   "--model.n_embd",
                                   "32",
                                   "--model.vocab_size",
                                   "50",
                                   "--model.block_size",
                                   "16",
                                   "--train.seq_len",
                                   "16",
                                   "--train.micro_batch_size",
                                   "4",
                                   "--train.steps",
                                   "5",
                                   "--train.device",
                                   device,
                                   "--sample.every",
                                   "-1",
                                   "--log.metrics",
                                   metrics,
                                   "--optim.lr",
                                   "0.01"};
  args.insert(args.end(), extra.begin(), extra.end());
  std::vector<const char*> argv;
  for (auto& a : args) argv.push_back(a.c_str());
  std::ostringstream out, err;
  EXPECT_EQ(train::train_main(static_cast<int>(argv.size()), argv.data(), out, err), 0) << err.str();
  std::vector<double> l;
  std::ifstream f(metrics);
  for (std::string line; std::getline(f, line);) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("loss")) l.push_back(j["loss"].get<double>());
  }
  return l;
}

}  // namespace

TEST(CudaTrain, LossesMatchTheCpuRun) {
  if (!cuda::available())
    GTEST_SKIP() << "no CUDA device: " << (cuda::compiled() ? "none visible" : "built without CUDA");
  fs::path d = ndt::testing::fresh_dir("cuda_train");
  std::vector<uint16_t> tokens(4000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>((i * 7 + i / 13) % 50);
  data::write_shard((d / "train.bin").string(), tokens);
  std::vector<double> cpu = train_losses(d, "cpu"), gpu = train_losses(d, "cuda", {"--train.tf32", "false"});
  ASSERT_EQ(cpu.size(), 5u);
  ASSERT_EQ(gpu.size(), 5u);
  for (size_t i = 0; i < cpu.size(); ++i)
    EXPECT_NEAR(gpu[i], cpu[i], 1e-4 * std::abs(cpu[i])) << "step " << i + 1;
  EXPECT_LT(cpu.back(), cpu.front());
  // TF32 GEMMs (the default on a GPU) and bf16 mixed precision: the same run within their rounding
  std::vector<double> tf32 = train_losses(d, "cuda"),
                      bf16 = train_losses(d, "cuda", {"--train.dtype", "bfloat16"});
  ASSERT_EQ(tf32.size(), 5u);
  ASSERT_EQ(bf16.size(), 5u);
  for (size_t i = 0; i < cpu.size(); ++i) {
    EXPECT_NEAR(tf32[i], cpu[i], 3e-3 * std::abs(cpu[i])) << "tf32, step " << i + 1;
    EXPECT_NEAR(bf16[i], cpu[i], 2e-2 * std::abs(cpu[i])) << "bf16, step " << i + 1;
  }
  // and one rank with its collectives over NCCL (train_gpt's parallel.backend) runs the same
  std::vector<double> nccl = train_losses(d, "cuda", {"--train.tf32", "false", "--parallel.backend", "nccl"});
  ASSERT_EQ(nccl.size(), 5u);
  for (size_t i = 0; i < cpu.size(); ++i)
    EXPECT_NEAR(nccl[i], gpu[i], 1e-6 * std::abs(gpu[i])) << "nccl, step " << i + 1;
}
