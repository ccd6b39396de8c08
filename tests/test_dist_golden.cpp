// Bit-for-bit figures of train_gpt, recorded once: the losses of three steps and the XXH64
// of the final checkpoint's tensors (weights, and AdamW's moments), for one process and for
// several layouts under mpirun. A change that only moves code (a refactor of the trainer,
// the strategies or the tensor-parallel layers) must leave every one of them unchanged;
// the layouts' agreement with one process at a tolerance is tests/test_dist_train.cpp's.
//
// The figures depend on the GEMM kernel and on the CPU's vector width (glibc's libm and
// GELU's clones pick code by it), so the runs use OpenBLAS's Haswell kernel (any AVX2 CPU)
// for every f32 GEMM (NDT_F32_GEMM=openblas, also where oneDNN's would be chosen) and one
// thread, and the figures are kept per kind of machine; on one without recorded figures the
// test skips and says so. A second test runs the AVX2 machine's layouts on an emulated
// Haswell (QEMU), so that an AVX-512 machine checks both kinds. To record (after a change
// meant to change numbers, or for a new kind of machine), run
//   NDT_RECORD_GOLDEN=1 build/test_dist_golden
// and paste what it prints into kRecorded below (the second block is the AVX2 kind's).
#include <gtest/gtest.h>

#include "support/corpus.h"
#include "support/launch.h"
#include "support/testing.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tensor/cpu/onednn_gemm.h"
#include "tensor/threads.h"
#include "train/io/files.h"
#include "train/io/safetensors.h"

using namespace ndt;
namespace fs = std::filesystem;

namespace {

// A layout: its name and train_gpt arguments.
struct Layout {
  const char* name;
  int np;
  const char* args;
};
const std::vector<Layout> kLayouts = {
    {"one process", 1, "--train.micro_batch_size 4"},
    {"dp2", 2, "--train.micro_batch_size 2 --parallel.dp_replicate_size 2"},
    {"fsdp2", 2, "--train.micro_batch_size 2 --parallel.dp_shard_size 2"},
    {"hsdp 2x2", 4, "--train.micro_batch_size 1 --parallel.dp_replicate_size 2 --parallel.dp_shard_size 2"},
    {"tp2", 2, "--train.micro_batch_size 4 --parallel.tp_size 2"},
    {"cp2", 2, "--train.micro_batch_size 4 --parallel.cp_size 2"},
    {"fsdp2 x tp2", 4, "--train.micro_batch_size 2 --parallel.dp_shard_size 2 --parallel.tp_size 2"},
    {"fsdp2 bf16 recompute", 2,
     "--train.micro_batch_size 2 --parallel.dp_shard_size 2 --train.dtype bfloat16 "
     "--train.activation_checkpointing full"},
};

// What one layout trained: %.17g of each step's logged loss, and the XXH64 of the final
// checkpoint's tensors.
struct Figures {
  std::vector<std::string> losses;
  std::string model_xxh64;  // model.safetensors
  std::string state_xxh64;  // state.safetensors
};

// Per kind of machine, the figures of kLayouts in order.
const std::map<std::string, std::vector<Figures>> kRecorded = {
    // clang-format off
    // recorded 2026-12-01 on an AMD EPYC (Zen, AVX2); cp2 again on 2026-12-03 on the AVX-512
    // machine below, when ring attention's pairs moved to the CPU's fused kernel (every f32
    // figure, the fused self-attention's included, had come out identical on both kinds).
    // All again 2026-12-04 on a Haswell emulated by QEMU 7.2 (which first reproduced every
    // figure above bit for bit), when LayerNorm's row sums moved to fixed vector lanes
    {"x86-64 AVX2, OpenBLAS Haswell",
     {
      {{"2.7997465133666992", "2.6450431346893311", "2.55092453956604"}, "9f0baa4613b606e1", "0ea00bf64c5e05f8"},  // one process
      {{"2.799746572971344", "2.6450431942939758", "2.5509244203567505"}, "b5e00c9bad7653c6", "227ab70577069894"},  // dp2
      {{"2.799746572971344", "2.6450431346893311", "2.5509244203567505"}, "acd24235cb9859b4", "f198a455f12ee711"},  // fsdp2
      {{"2.7997465431690216", "2.6450431346893311", "2.5509244501590729"}, "86b4c4be3272abf5", "9635a6f9193e6388"},  // hsdp 2x2
      {{"2.7997465133666992", "2.6450431346893311", "2.55092453956604"}, "e16dfefc63cf49ea", "a46b1c7ea728a049"},  // tp2
      {{"2.799746572971344", "2.6450431346893311", "2.5509244799613953"}, "a76dd71412fb63a3", "c8a35f5b982684f1"},  // cp2
      {{"2.799746572971344", "2.6450431346893311", "2.5509244203567505"}, "684bf5c310ffdc4a", "789c31abb9a651eb"},  // fsdp2 x tp2
      {{"2.7997244000434875", "2.6440420746803284", "2.5525828003883362"}, "8fab00722ffed7f6", "92f475abbb7b6a2e"},  // fsdp2 bf16 recompute
     }},
    // recorded 2026-12-02 on an AMD EPYC (Zen 5: AVX-512, AVX512-BF16); the f32 figures are
    // the AVX2 machine's, bit for bit; the bf16 run's GEMMs are oneDNN's here. cp2 recorded
    // again 2026-12-03 (Zen 4): ring attention's pairs on the fused kernel. The f32 figures
    // again 2026-12-04 (Zen 4): LayerNorm's row sums in fixed vector lanes (the bf16 run's
    // figures did not move)
    {"x86-64 AVX-512, OpenBLAS Haswell, oneDNN bf16",
     {
      {{"2.7997465133666992", "2.6450431346893311", "2.55092453956604"}, "9f0baa4613b606e1", "0ea00bf64c5e05f8"},  // one process
      {{"2.799746572971344", "2.6450431942939758", "2.5509244203567505"}, "b5e00c9bad7653c6", "227ab70577069894"},  // dp2
      {{"2.799746572971344", "2.6450431346893311", "2.5509244203567505"}, "acd24235cb9859b4", "f198a455f12ee711"},  // fsdp2
      {{"2.7997465431690216", "2.6450431346893311", "2.5509244501590729"}, "86b4c4be3272abf5", "9635a6f9193e6388"},  // hsdp 2x2
      {{"2.7997465133666992", "2.6450431346893311", "2.55092453956604"}, "e16dfefc63cf49ea", "a46b1c7ea728a049"},  // tp2
      {{"2.799746572971344", "2.6450431346893311", "2.5509244799613953"}, "a76dd71412fb63a3", "c8a35f5b982684f1"},  // cp2
      {{"2.799746572971344", "2.6450431346893311", "2.5509244203567505"}, "684bf5c310ffdc4a", "789c31abb9a651eb"},  // fsdp2 x tp2
      {{"2.7997244000434875", "2.6440155506134033", "2.5526340007781982"}, "13c513dc89942756", "7a170a56e67f276e"},  // fsdp2 bf16 recompute
     }},
    {"x86-64 AVX-512, OpenBLAS Haswell, oneDNN bf16 on AMX",  // an Intel Xeon with AMX (Sapphire Rapids)
     {
      {{"2.7997465133666992", "2.6450431346893311", "2.55092453956604"}, "9f0baa4613b606e1", "0ea00bf64c5e05f8"},  // one process
      {{"2.799746572971344", "2.6450431942939758", "2.5509244203567505"}, "b5e00c9bad7653c6", "227ab70577069894"},  // dp2
      {{"2.799746572971344", "2.6450431346893311", "2.5509244203567505"}, "acd24235cb9859b4", "f198a455f12ee711"},  // fsdp2
      {{"2.7997465431690216", "2.6450431346893311", "2.5509244501590729"}, "86b4c4be3272abf5", "9635a6f9193e6388"},  // hsdp 2x2
      {{"2.7997465133666992", "2.6450431346893311", "2.55092453956604"}, "e16dfefc63cf49ea", "a46b1c7ea728a049"},  // tp2
      {{"2.799746572971344", "2.6450431346893311", "2.5509244799613953"}, "a76dd71412fb63a3", "c8a35f5b982684f1"},  // cp2
      {{"2.799746572971344", "2.6450431346893311", "2.5509244203567505"}, "684bf5c310ffdc4a", "789c31abb9a651eb"},  // fsdp2 x tp2
      {{"2.7997244000434875", "2.6440155506134033", "2.5526334643363953"}, "f624cdd48034c1af", "e1f93967c90bf63f"},  // fsdp2 bf16 recompute
     }},
    // clang-format on
};

const std::string kAvx2 = "x86-64 AVX2, OpenBLAS Haswell";

// The kind of machine, as far as the figures care.
std::string machine() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return "";
  // bf16 GEMMs run on oneDNN's kernels where the CPU has bf16 units (tensor/cpu/onednn_gemm)
  // (their last bits differ between AVX512-BF16 and AMX kernels: oneDNN picks AMX where it is)
  const std::string lib = ndt::cpu::bf16_gemm_library();
  const std::string bf16 = !ndt::cpu::bf16_gemm_native()          ? ""
                           : lib.find("amx") != std::string::npos ? ", oneDNN bf16 on AMX"
                                                                  : ", oneDNN bf16";
  return (__builtin_cpu_supports("avx512f") ? "x86-64 AVX-512, OpenBLAS Haswell" : kAvx2) + bf16;
#else
  return "";
#endif
}

// XXH64 of a safetensors file's tensors (names, then the f32 values, in name order): the
// numbers only, not the metadata (which names this run's paths).
std::string tensors_xxh64(const fs::path& file) {
  io::SafeTensorsReader r(file.string());
  std::string bytes;
  for (const auto& [name, e] : r.entries()) {
    const Tensor t = r.get(name).contiguous();
    bytes += name;
    bytes.append(static_cast<const char*>(t.data_ptr()), t.nbytes());
  }
  return io::hex64(io::xxh64(bytes.data(), bytes.size()));
}

std::vector<std::string> logged_losses(const fs::path& metrics) {
  std::vector<std::string> l;
  std::ifstream f(metrics);
  for (std::string line; std::getline(f, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (!j.contains("loss")) continue;
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.17g", j["loss"].get<double>());
    l.emplace_back(buf);
  }
  return l;
}

// Trains every layout with train_gpt behind launcher (a command prefix, or nothing) and
// checks its figures against kind's, or prints them to paste (NDT_RECORD_GOLDEN=1).
void expect_recorded_bits(const std::string& kind, const std::string& launcher) {
  const bool record = std::getenv("NDT_RECORD_GOLDEN") != nullptr;
  const auto want = kRecorded.find(kind);
  if (!record && want == kRecorded.end())
    GTEST_SKIP() << "no figures recorded for " << kind << " (record them with NDT_RECORD_GOLDEN=1)";
  if (!record) ASSERT_EQ(want->second.size(), kLayouts.size()) << "record the figures again";
  const fs::path dir = ndt::testing::fresh_dir("golden");
  const int64_t V = ndt::testing::write_word_corpus(dir / "data", 8000, 7, 0.0);
  std::ofstream(dir / "gpt.ini")
      << "[model]\nn_layer = 2\nn_head = 4\nn_embd = 32\nvocab_multiple = 4\nvocab_size = " << V
      << "\nblock_size = 32\n[data]\ntrain = " << (dir / "data" / "train_*.bin").string()
      << "\n[train]\nseq_len = 16\ngrad_accum_steps = 2\nsteps = 3\nthreads = 1\n"
         "[optim]\nlr = 0.01\nwarmup_steps = 1\n[sample]\nevery = -1\n[log]\nevery = 1\n"
         "[checkpoint]\nformat = full\n";
  std::string recorded = "    {\"" + kind + "\",\n     {\n";
  for (size_t i = 0; i < kLayouts.size(); ++i) {
    const Layout& L = kLayouts[i];
    SCOPED_TRACE(L.name);
    const fs::path d = dir / std::to_string(i);
    // every rank (mpirun passes the environment on) computes with the same kernel
    const std::string cmd = std::string("OPENBLAS_CORETYPE=Haswell NDT_F32_GEMM=openblas ") +
                            (L.np > 1 ? ndt::testing::mpirun(L.np) : std::string()) + launcher +
                            NDT_TRAIN_GPT_BIN + " --config " + (dir / "gpt.ini").string() +
                            " --log.metrics " + (d / "metrics.jsonl").string() + " --checkpoint.dir " +
                            (d / "ck").string() + " " + L.args;
    const ndt::testing::ShellResult r = ndt::testing::run_shell(cmd);
    ASSERT_EQ(r.rc, 0) << r.out;
    ASSERT_NE(r.out.find("OpenBLAS kernel Haswell"), std::string::npos) << r.out;
    const fs::path last = d / "ck" / "step_00000003";
    const Figures got{logged_losses(d / "metrics.jsonl"), tensors_xxh64(last / "model.safetensors"),
                      tensors_xxh64(last / "state.safetensors")};
    if (record) {
      recorded += "      {{";
      for (size_t k = 0; k < got.losses.size(); ++k) recorded += (k ? ", \"" : "\"") + got.losses[k] + "\"";
      recorded += "}, \"" + got.model_xxh64 + "\", \"" + got.state_xxh64 + "\"},  // " + L.name + "\n";
      continue;
    }
    const Figures& f = want->second[i];
    EXPECT_EQ(got.losses, f.losses) << "the losses of steps 1 to 3";
    EXPECT_EQ(got.model_xxh64, f.model_xxh64) << "the weights after step 3";
    EXPECT_EQ(got.state_xxh64, f.state_xxh64) << "the AdamW state after step 3";
  }
  if (record) std::printf("%s     }},\n", recorded.c_str());
  fs::remove_all(dir);
}

TEST(Golden, EveryLayoutTrainsTheRecordedBits) {
  const std::string kind = machine();
  if (kind.empty()) GTEST_SKIP() << "needs an x86-64 CPU with AVX2 and FMA (OpenBLAS's Haswell kernel)";
  expect_recorded_bits(kind, "");
}

// The AVX2 machine's figures on an emulated Haswell (QEMU's user-mode emulator runs every
// rank; it reports AVX2 and FMA and no AVX-512, so every kernel, libm's included, picks its
// AVX2 code as on a real one). On an AVX-512 machine this checks the figures of the other
// kind, which it could not otherwise see.
TEST(Golden, AnEmulatedAvx2MachineTrainsItsRecordedBits) {
#if !defined(__x86_64__)
  GTEST_SKIP() << "emulates an x86-64 CPU on an x86-64 host only";
#endif
  if (ndt::testing::run_shell("command -v qemu-x86_64").rc != 0)
    GTEST_SKIP() << "needs qemu-x86_64 (Debian's qemu-user, which scripts/setup.sh installs)";
  if (machine() == kAvx2) GTEST_SKIP() << "this machine is " << kAvx2 << " itself (the test above)";
  // train_gpt must not re-execute itself (the new process would run natively); the CPU
  // model without the features QEMU cannot emulate (it warns about each otherwise)
  expect_recorded_bits(kAvx2,
                       "env NDT_NO_BLAS_REEXEC=1 qemu-x86_64 -cpu Haswell,-pcid,-x2apic,-tsc-deadline,-hle,"
                       "-invpcid,-rtm ");
}

}  // namespace
