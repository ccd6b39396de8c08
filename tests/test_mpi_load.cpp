// RAM-efficient loading under mpirun: ranks that shard a GPT-2-124M-shaped model each read
// only their own elements of a 500 MB weights file. Loading raises no rank's peak resident
// memory (VmHWM, which counts the touched pages of mapped files too) by more than a tenth of
// the model's bytes over what its random init already took, and every element lands where
// the single-process layout puts it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "dist_testing.h"
#include "models/gpt.h"
#include "nn/flat.h"
#include "tensor/kernels.h"
#include "train/checkpoint/checkpoint.h"

using namespace ndt;

namespace {

int64_t vm_hwm() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  return 0;
}

constexpr uint64_t kSeed = 4242;

// Element e of parameter `name` in the file: normal(seed, hash(name), e).
Tensor file_values(const std::string& name, int64_t begin, int64_t n) {
  Tensor t = Tensor::empty({n}, DType::f32);
  kernels::fill_normal(t, kSeed, nn::name_hash(name), static_cast<uint64_t>(begin), 0.0f, 0.02f);
  return t;
}

// A safetensors file of the whole parameters, streamed a piece at a time (the writer's
// resident memory stays small: it is a rank of the test too).
void write_streamed(const std::string& path, const models::GPT& gpt) {
  nlohmann::json h = nlohmann::json::object();
  uint64_t off = 0;
  std::vector<std::pair<std::string, int64_t>> order;
  for (const nn::ParamSpec& s : gpt.parameters()) {
    Shape shape = s.shape;
    if (s.name == "wte.weight") shape[0] = gpt.cfg.vocab_size;  // saved without padding rows
    const int64_t n = numel_of(shape);
    h[s.name] = {
        {"dtype", "F32"}, {"shape", shape}, {"data_offsets", {off, off + 4 * static_cast<uint64_t>(n)}}};
    off += 4 * static_cast<uint64_t>(n);
    order.emplace_back(s.name, n);
  }
  std::string header = h.dump();
  while ((8 + header.size()) % 8) header += ' ';
  std::FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  const uint64_t hn = header.size();
  std::fwrite(&hn, 8, 1, f);
  std::fwrite(header.data(), 1, header.size(), f);
  for (auto& [name, n] : order)
    for (int64_t k = 0; k < n; k += 1 << 20) {
      Tensor t = file_values(name, k, std::min<int64_t>(1 << 20, n - k));
      std::fwrite(t.data_ptr(), 1, t.nbytes(), f);
    }
  ASSERT_EQ(std::fclose(f), 0);
}

TEST(RamEfficientLoading, Gpt2ShapedFileAddsUnderATenthOfTheModelToAnyRank) {
  auto& w = *ndt::testing::world();
  // GPT-2 124M
  const models::GPTConfig c{
      .n_layer = 12, .n_head = 12, .n_embd = 768, .vocab_size = 50257, .block_size = 1024};
  models::GPT gpt(c);
  int64_t model_bytes = 0;
  for (const nn::ParamSpec& s : gpt.parameters()) model_bytes += 4 * numel_of(s.shape);
  const int64_t tag =
      static_cast<int64_t>(w.all_reduce_scalar(w.rank() == 0 ? ::getpid() : 0, dist::ReduceOp::kMax));
  const std::string path =
      (std::filesystem::temp_directory_path() / ("ndt_gpt2_" + std::to_string(tag) + ".safetensors"))
          .string();
  // removed however the test ends, a failed assertion included (rank 0 wrote it)
  struct RemoveAtEnd {
    std::string path;
    bool mine;
    ~RemoveAtEnd() {
      std::error_code ec;
      if (mine) std::filesystem::remove(path, ec);
    }
  } remove_at_end{path, w.rank() == 0};
  if (w.rank() == 0) write_streamed(path, gpt);
  w.barrier();

  // random init of this rank's shards, then the file's values over them
  nn::FlatParams p =
      nn::materialize(gpt.units(), Device::cpu(), DType::f32, 1, nn::ShardSpec{w.rank(), w.size()});
  const int64_t before = vm_hwm();
  ckpt::load_weights_local(path, gpt, p);
  const int64_t added = vm_hwm() - before;
  std::printf(
      "rank %d of %d: loading a %.0f MiB model added %.1f MiB to the peak resident memory (limit %.1f MiB)\n",
      w.rank(), w.size(), model_bytes / 1048576.0, added / 1048576.0, model_bytes / 10 / 1048576.0);
  EXPECT_LT(added, model_bytes / 10);

  // every element of the rank's shard is the file's (padding rows and gaps zero)
  for (const nn::FlatUnit& u : p.units)
    for (const nn::FlatParam& f : u.params) {
      const int64_t n = numel_of(f.spec.shape), s0 = u.shard_offset;
      const int64_t a = std::max(f.offset, s0), b = std::min(f.offset + n, s0 + u.shard_numel);
      if (a >= b) continue;
      const int64_t live = f.spec.name == "wte.weight"
                               ? std::min(b - f.offset, c.vocab_size * c.n_embd) - (a - f.offset)
                               : b - a;
      const std::vector<float> got = u.data.narrow(0, a - s0, b - a).to_vector<float>();
      const std::vector<float> want =
          live > 0 ? file_values(f.spec.name, a - f.offset, live).to_vector<float>() : std::vector<float>{};
      for (int64_t k = 0; k < b - a; ++k)
        ASSERT_EQ(got[k], k < live ? want[k] : 0.0f) << f.spec.name << " element " << a - f.offset + k;
    }
  w.barrier();  // every rank has read the file before rank 0 removes it
}

}  // namespace
