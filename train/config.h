// ndtrain: the train_gpt configuration, from an INI file and the command line.
//
// Every INI key `key` in section `[sec]` is also the option `--sec.key`; the command line
// wins over the file. `train_gpt --help` lists every key with its default and meaning.
//
//   [model]
//   n_layer = 4
//   [train]
//   steps = 500
//
//   train_gpt --config gpt.ini --train.steps 100
//
// An unknown key or a bad value throws ConfigError (train_gpt exits with code 2). Every
// integer key has a range, checked before anything is allocated. In the INI file `#` starts
// a comment; a value in double quotes keeps its `#` (prompt = "C# rocks"), as does `\#`.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dist/mesh.h"
#include "models/gpt.h"
#include "optim/adamw.h"
#include "tensor/error.h"

namespace ndt::ckpt {
struct WeightSource;  // train/checkpoint/load.h
}

namespace ndt::train {

class ConfigError : public Error {
 public:
  using Error::Error;
};

// One struct per INI section; [model] and [optim] extend the model's and the optimizer's
// own config types, so the trainer hands them over as they are.
struct ModelSection : models::GPTConfig {  // [model]
  ModelSection() {
    n_layer = 4;
    n_head = 4;
    n_embd = 128;
    vocab_size = 256;
    block_size = 128;
  }
  // what to start from (empty: random init): a Hugging Face model folder (the model then comes
  // from its config.json), a safetensors file with HF GPT-2 names, or a sharded checkpoint's
  // step_* directory
  std::string init_from;
  // init_from opened once, by parse_config (ckpt::find_weights): what it is and, for a Hugging
  // Face folder, its config.json and tensor headers; the trainer reads the weights through it
  std::shared_ptr<const ckpt::WeightSource> init_source;
  // model.rope_scaling (none or llama3) and, for llama3, its four keys (model.rope_factor,
  // rope_low_freq_factor, rope_high_freq_factor, rope_original_max_position), which
  // normalize (train/config.cpp) copies into the model's rope.llama3
  std::string rope_scaling = "none";
  models::Llama3Scaling llama3;
};

struct DataSection {              // [data]
  std::string train, val, vocab;  // shard globs, vocab.json
  bool shuffle = false;
};

struct TrainSection {  // [train]
  int64_t micro_batch_size = 8, seq_len = 128, grad_accum_steps = 1, steps = 100, eval_every = 50,
          eval_steps = 10;
  int64_t seed = 1337;  // >= 0
  std::string device = "cpu", dtype = "float32";
  bool tf32 = true;  // float32 GEMMs on TF32 tensor cores (CUDA only)
  // none, full or selective (nn::ACMode); parse_config turns the old true/false into
  // full/none. ac_every = k: only blocks 0, k, 2k, ... are recomputed.
  std::string activation_checkpointing = "none";
  int64_t ac_every = 1;
  int threads = 0;         // 0: this rank's share of the node's cores
  int64_t stop_after = 0;  // stop (with a checkpoint) after this many steps of this run; 0: never
};

struct OptimSection : optim::AdamWConfig {  // [optim]: AdamW's betas, eps, weight decay, and
  double lr = 1e-3, min_lr_frac = 0.1, grad_clip = 1.0;
  int64_t warmup_steps = 0;
  std::string schedule = "cosine";
  std::string lr_scaling = "none";  // none, linear or sqrt in effective batch / lr_base_batch
  int64_t lr_base_batch = 0;        // sequences
};

struct CheckpointSection {  // [checkpoint]
  std::string dir;
  int64_t every = 0;
  bool resume = false;
  int keep = 2;
  std::string format =
      "sharded";  // sharded: every rank its own files; full: one file of whole tensors (rank 0)
};

struct LogSection {  // [log]
  std::string metrics, report;
  bool metrics_every_rank = false;  // every rank writes its own metrics (rank r > 0: path.rank<r>.jsonl)
  std::string tensorboard;          // a directory: TensorBoard event files, scalars every step (rank 0)
  std::string trace;  // Chrome trace, one file per rank (out/trace.json -> out/trace.rank0.json, ...)
  // the first step's gradients, one whole tensor per parameter ("grad." + name), in one
  // safetensors file that rank 0 writes: comparable between any two layouts
  std::string grads;
  int64_t every = 1;
  double progress_seconds = 30;  // a step line at least this often, whatever `every` (0: off)
  double peak_tflops = 0;
};

struct SampleSection {  // [sample]
  int64_t every = 0, length = 200, top_k = 0;
  double temperature = 1.0, top_p = 1.0;
  std::string prompt = "\n";
};

// [parallel], named as in Hugging Face Accelerate's ParallelismConfig: the layout's sizes, the
// pipeline's words and sequence parallelism (dist::ParallelConfig), and how the ranks run it
struct ParallelSection : dist::ParallelConfig {
  std::string reduce_dtype = "float32";  // mixed precision: FSDP's reduce-scatter dtype
  // FSDP: release each unit after its forward and its backward (false: keep the units
  // gathered until the step ends; one all-gather a step instead of two per micro-batch)
  bool reshard_after_forward = true;
  std::string backend = "auto";  // collectives: auto (NCCL on GPUs when world > 1), mpi, nccl
  // A rank asked to stop (SIGINT/SIGTERM) that makes no progress for this long (stuck in a
  // collective with a dead or stopped peer) ends the job with kExitStuck (train/guard.h).
  double timeout_s = 300;
  // A rehearsal of a failure (the fault tests, and a user trying the flight report): rank
  // fail_rank throws in the middle of step fail_at_step (after its first forward); 0: never.
  int64_t fail_at_step = 0, fail_rank = 0;
};

// [lora]: LoRA adapters on a frozen base (nn/lora.h), as Hugging Face PEFT's LoraConfig:
// rank (r; 0, the default: no LoRA, every weight trained), alpha (lora_alpha), dropout
// (lora_dropout), targets (target_modules, comma-separated; all-linear), rslora (use_rslora).
// init_from: a PEFT adapter folder to start from; its settings fill the keys not given (said
// in `taken`) and must agree with those given.
struct LoraSection : nn::LoraConfig {
  std::string targets_text;  // lora.targets as given; normalize splits it into targets
  std::string init_from;     // a PEFT adapter folder (adapter_config.json, adapter_model.safetensors)
  std::string taken;         // what init_from's adapter_config.json gave: a line for the run's output
};

// [cluster]: the machines a plan's time model runs on (train/planner/cluster.h). Every
// number left at 0 comes from the preset; without a preset and without hosts, --plan
// predicts memory and bytes only. `train_gpt --cluster FILE` reads a file that holds only
// this section (one written by --plan.calibrate, or a user's own).
struct ClusterSection {
  std::string preset;  // h100-sxm-8, a100-sxm-8, h100-pcie-8, h200-8, cpu-sim (empty: none)
  int64_t hosts = 0, devices_per_host = 0;
  double device_tflops = 0;     // dense TFLOP/s of one device for the training dtype
  std::string dtype;            // what device_tflops was measured for (empty: train.dtype)
  double efficiency = 0;        // the share of device_tflops the model's matrix products reach
  double memory_gbps = 0;       // device memory bandwidth, GB/s (the element-wise ops)
  double bf16_memory_gbps = 0;  // the same on bf16 values, in their bytes (0: memory_gbps)
  double device_memory_gb = 0;  // memory of one device, GB (the search keeps plans that fit)
  double intra_gbps = 0, intra_latency_us = 0;  // between devices of a host, per device, per direction
  double inter_gbps = 0, inter_latency_us = 0;  // between hosts, per device, per direction
  // of a transfer's time, the share it takes from the computation it runs under (CPU ranks)
  double intra_cpu_share = 0, inter_cpu_share = 0;
  // the CPU's fused attention core (0: at device_tflops and memory_gbps): the TFLOP/s its
  // products reach (4 S hd forward, 10 S hd backward, S its scores) and the nanoseconds of
  // one pass over one score (its softmax's: 2 forward, 3 backward)
  double attention_tflops = 0, score_pass_ns = 0;
  // a mixture of experts' MLP (0: at device_tflops): the TFLOP/s its grouped GEMMs reach, the
  // routed rows' gate, up and down products (6 M C Ie forward, twice that backward) as the MoE
  // MLP runs them (router, sort, dispatch and combine around them)
  double expert_tflops = 0;
};

struct Config {
  // The run folder (`out` before the first section, or --out): every output of the run lives
  // in it. checkpoint.dir, log.metrics and log.report default to ckpt, metrics.jsonl and
  // report.html there; a relative path given for any output key (log.tensorboard, log.trace,
  // log.grads too) is taken inside it. Empty: each output key's path as given.
  std::string out;
  ModelSection model;
  DataSection data;
  TrainSection train;
  OptimSection optim;
  CheckpointSection checkpoint;
  LogSection log;
  SampleSection sample;
  ParallelSection parallel;
  LoraSection lora;
  ClusterSection cluster;
  std::string config_path;   // the --config file, if any
  std::string cluster_path;  // the --cluster file, if any
  // train_gpt --plan [--json] [--plan.world N]: print the memory and communication plan
  // (train/planner/plan.h) and exit, without data, memory or MPI
  bool plan = false, plan_json = false;
  int64_t plan_world = 0;  // 0: the product of the [parallel] sizes (or the cluster's devices)
  // --plan --plan.search: every layout, micro-batch and checkpointing mode for the cluster,
  // the best plan.top by predicted tokens/s, at plan.batch sequences per step (0: the config's)
  bool plan_search = false;
  int64_t plan_batch = 0, plan_top = 10;
  // --plan under expert parallelism: the rows a rank's experts receive (and its all-to-alls
  // move) over perfectly balanced routing's; 1: balanced (docs/planner-model.md: reading it from a run)
  double plan_ep_imbalance = 1.0;
  // --plan.calibrate FILE (under mpirun on the cluster itself): measure the matrix-product
  // rate at the model's shapes, the memory bandwidth and the links; write a --cluster file
  std::string plan_calibrate;
  // Every [section] key with its value as parsed (file, command line or default), sorted:
  // what ranks compare to find a stale config file on one node.
  std::vector<std::pair<std::string, std::string>> values;
};

// Returns false when --help was asked (help text written to `help_out`).
bool parse_config(int argc, const char* const* argv, Config& cfg, std::string& help_out);
// Checks values and combinations; throws ConfigError naming the key.
void validate(const Config& cfg);
// train.activation_checkpointing as the wrapper's mode (none, full, selective).
nn::ACMode ac_mode(const TrainSection& t);
// Legal but probably unintended settings, one line each (train_gpt prints them at start).
std::vector<std::string> warnings(const Config& cfg);

// A prompt as sample.prompt reads it: \n a newline, \t a tab, \ before any other character
// that character.
std::string unescape(const std::string& s);

}  // namespace ndt::train
