#include "train/config.h"

#include "models/family.h"

#include "dist/pipeline_parallel/schedule.h"
#include "train/checkpoint/hf.h"
#include "train/checkpoint/load.h"
#include "train/checkpoint/lora.h"
#include "train/command_line.h"

#include <algorithm>
#include <boost/program_options.hpp>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <thread>

namespace po = boost::program_options;
namespace fs = std::filesystem;

namespace ndt::train {
namespace {

// One option a line reads best as a table.
// clang-format off
po::options_description describe(Config& c) {
  po::options_description model("[model]");
  models::visit_fields(  // the model's fields (models/gpt_config.h), then the rope scaling's and init_from
      [&](const models::Field& f, auto& v) {
        model.add_options()((std::string("model.") + f.name).c_str(), po::value(&v)->default_value(v), f.help);
      },
      c.model);
  model.add_options()
      ("model.rope_scaling", po::value(&c.model.rope_scaling)->default_value(c.model.rope_scaling),
       "llama: none, or llama3 (Llama 3.1's long-context scaling, with the four keys below)")
      ("model.rope_factor", po::value(&c.model.llama3.factor)->default_value(c.model.llama3.factor),
       "llama3 scaling: how much the low frequencies are stretched")
      ("model.rope_low_freq_factor", po::value(&c.model.llama3.low_freq_factor)->default_value(c.model.llama3.low_freq_factor),
       "llama3 scaling: wavelengths past original_max_position / this are stretched")
      ("model.rope_high_freq_factor", po::value(&c.model.llama3.high_freq_factor)->default_value(c.model.llama3.high_freq_factor),
       "llama3 scaling: wavelengths under original_max_position / this are kept")
      ("model.rope_original_max_position", po::value(&c.model.llama3.original_max_position)->default_value(c.model.llama3.original_max_position),
       "llama3 scaling: the context the model was first trained at")
      ("model.init_from", po::value(&c.model.init_from)->default_value(c.model.init_from),
       "a Hugging Face model folder (config.json and safetensors: Llama, Qwen2, Mistral, GPT-2; the model "
       "comes from its config.json), a safetensors file with HF GPT-2 names, or a sharded checkpoint's step_* "
       "directory, to start from (empty: random init)");
  po::options_description data("[data]");
  data.add_options()
      ("data.train", po::value(&c.data.train)->default_value(c.data.train), "glob of training shards (llm.c format)")
      ("data.val", po::value(&c.data.val)->default_value(c.data.val), "glob of validation shards (empty: no eval)")
      ("data.shuffle", po::value(&c.data.shuffle)->default_value(c.data.shuffle), "shuffle batch windows each epoch (true/false)")
      ("data.vocab", po::value(&c.data.vocab)->default_value(c.data.vocab),
       "the samples' tokenizer: a tokenizer.json, a folder holding one, or prepare_text's vocab.json (empty: "
       "tokenizer.json or vocab.json beside the training shards, if any)");
  po::options_description train("[train]");
  train.add_options()
      ("train.micro_batch_size", po::value(&c.train.micro_batch_size)->default_value(c.train.micro_batch_size), "sequences per micro-batch B")
      ("train.seq_len", po::value(&c.train.seq_len)->default_value(c.train.seq_len), "tokens per sequence T (<= model.block_size)")
      ("train.grad_accum_steps", po::value(&c.train.grad_accum_steps)->default_value(c.train.grad_accum_steps), "micro-batches per optimizer step")
      ("train.steps", po::value(&c.train.steps)->default_value(c.train.steps), "optimizer steps (0: only evaluate and sample the initial weights, e.g. a model from model.init_from)")
      ("train.eval_every", po::value(&c.train.eval_every)->default_value(c.train.eval_every), "evaluate every N steps (0: only at the end)")
      ("train.eval_steps", po::value(&c.train.eval_steps)->default_value(c.train.eval_steps), "validation batches per evaluation")
      ("train.seed", po::value(&c.train.seed)->default_value(c.train.seed), "seed for init, shuffling and sampling")
      ("train.device", po::value(&c.train.device)->default_value(c.train.device), "cpu or cuda (cuda:N)")
      ("train.dtype", po::value(&c.train.dtype)->default_value(c.train.dtype), "float32, or bfloat16: mixed precision (bf16 parameters in compute, f32 master copy, AdamW and loss)")
      ("train.tf32", po::value(&c.train.tf32)->default_value(c.train.tf32),
       "on a GPU, float32 matrix products on TF32 tensor cores (10-bit mantissa inputs, f32 accumulation; "
       "much faster, relative error ~1e-3); false: strict float32. bfloat16 runs are not affected")
      ("train.activation_checkpointing", po::value(&c.train.activation_checkpointing)->default_value(c.train.activation_checkpointing),
       "recompute activations in backward instead of keeping them: none; full (each checkpointed block keeps only its "
       "input and runs its whole forward again in backward); selective (each checkpointed block recomputes only its "
       "attention core -- heads, q k^T, causal softmax, p v -- and keeps every linear's and LayerNorm's and GELU's "
       "tensors). true and false, from older configs, mean full and none")
      ("train.ac_every", po::value(&c.train.ac_every)->default_value(c.train.ac_every),
       "checkpoint only blocks 0, k, 2k, ... (k = ac_every) with the mode of train.activation_checkpointing; 1: every block")
      ("train.threads", po::value(&c.train.threads)->default_value(c.train.threads), "CPU threads of each rank (0: the node's cores / the ranks on this node)")
      ("train.stop_after", po::value(&c.train.stop_after)->default_value(c.train.stop_after),
       "stop after this many steps of this run, with a checkpoint, to resume later (0: run to train.steps)");
  po::options_description optim("[optim]");
  optim.add_options()
      ("optim.lr", po::value(&c.optim.lr)->default_value(c.optim.lr), "peak learning rate")
      ("optim.min_lr_frac", po::value(&c.optim.min_lr_frac)->default_value(c.optim.min_lr_frac), "final lr = lr * min_lr_frac")
      ("optim.warmup_steps", po::value(&c.optim.warmup_steps)->default_value(c.optim.warmup_steps), "linear warmup steps")
      ("optim.schedule", po::value(&c.optim.schedule)->default_value(c.optim.schedule), "after warmup: cosine, linear or constant")
      ("optim.weight_decay", po::value(&c.optim.weight_decay)->default_value(c.optim.weight_decay), "AdamW decoupled decay (2-D weights only)")
      ("optim.beta1", po::value(&c.optim.beta1)->default_value(c.optim.beta1), "AdamW beta1")
      ("optim.beta2", po::value(&c.optim.beta2)->default_value(c.optim.beta2), "AdamW beta2")
      ("optim.eps", po::value(&c.optim.eps)->default_value(c.optim.eps), "AdamW epsilon")
      ("optim.grad_clip", po::value(&c.optim.grad_clip)->default_value(c.optim.grad_clip), "clip the global gradient norm to this (0: off)")
      ("optim.lr_scaling", po::value(&c.optim.lr_scaling)->default_value(c.optim.lr_scaling),
       "scale optim.lr with the effective batch: none, linear (lr x batch/base) or sqrt (lr x sqrt(batch/base))")
      ("optim.lr_base_batch", po::value(&c.optim.lr_base_batch)->default_value(c.optim.lr_base_batch),
       "the effective batch, in sequences, that optim.lr was tuned for (needed by lr_scaling)");
  po::options_description ckpt("[checkpoint]");
  ckpt.add_options()
      ("checkpoint.dir", po::value(&c.checkpoint.dir)->default_value(c.checkpoint.dir), "checkpoint directory (empty: none)")
      ("checkpoint.every", po::value(&c.checkpoint.every)->default_value(c.checkpoint.every), "checkpoint every N steps (0: only at the end)")
      ("checkpoint.resume", po::value(&c.checkpoint.resume)->default_value(c.checkpoint.resume), "resume from the latest checkpoint in dir (true/false)")
      ("checkpoint.keep", po::value(&c.checkpoint.keep)->default_value(c.checkpoint.keep), "checkpoints to keep (0: all)")
      ("checkpoint.format", po::value(&c.checkpoint.format)->default_value(c.checkpoint.format),
       "sharded (every rank writes its shards, in parallel) or full (rank 0 writes whole tensors with GPT-2 names); "
       "any layout resumes either; build/export_weights turns sharded into full");
  po::options_description log("[log]");
  log.add_options()
      ("log.metrics", po::value(&c.log.metrics)->default_value(c.log.metrics), "JSON-lines metrics file (empty: none)")
      ("log.metrics_every_rank", po::value(&c.log.metrics_every_rank)->default_value(c.log.metrics_every_rank),
       "every rank writes its own metrics, its memory peak and bytes sent (rank 0 to log.metrics, rank r to "
       "out/m.jsonl -> out/m.rank<r>.jsonl); false: rank 0 only")
      ("log.every", po::value(&c.log.every)->default_value(c.log.every), "print a line every N steps")
      ("log.progress_seconds", po::value(&c.log.progress_seconds)->default_value(c.log.progress_seconds),
       "print a step's line when this many seconds have passed since the last one, whatever log.every "
       "(slow steps still show progress; 0: only log.every)")
      ("log.report", po::value(&c.log.report)->default_value(c.log.report), "HTML report: charts of every metric, the layout, config and samples; written at the end (empty: none)")
      ("log.tensorboard", po::value(&c.log.tensorboard)->default_value(c.log.tensorboard), "directory for TensorBoard event files, scalars written every step (empty: none)")
      ("log.trace", po::value(&c.log.trace)->default_value(c.log.trace),
       "Chrome trace of each rank's steps (out/trace.json -> out/trace.rank0.json, ...; empty: none)")
      ("log.grads", po::value(&c.log.grads)->default_value(c.log.grads),
       "write the first step's gradients here (safetensors, one whole tensor per parameter: grad.<name>), to compare layouts (empty: none)")
      ("log.peak_tflops", po::value(&c.log.peak_tflops)->default_value(c.log.peak_tflops),
       "dense peak TFLOP/s of one GPU for the training dtype, for MFU (0: the GPU's own when it is an H100, H200 or A100; else GFLOP/s are shown)");
  po::options_description sample("[sample]");
  sample.add_options()
      ("sample.every", po::value(&c.sample.every)->default_value(c.sample.every), "sample every N steps (0: only at the end; -1: never)")
      ("sample.length", po::value(&c.sample.length)->default_value(c.sample.length), "tokens to generate")
      ("sample.temperature", po::value(&c.sample.temperature)->default_value(c.sample.temperature), "softmax temperature (> 0)")
      ("sample.top_k", po::value(&c.sample.top_k)->default_value(c.sample.top_k), "sample from the k most likely tokens (0: all)")
      ("sample.top_p", po::value(&c.sample.top_p)->default_value(c.sample.top_p), "then from the fewest whose probability reaches p (1: all)")
      ("sample.prompt", po::value(&c.sample.prompt)->default_value(c.sample.prompt), "text to start from (\\n for a newline)");
  po::options_description par("[parallel]");
  par.add_options()
      ("parallel.dp_replicate_size", po::value(&c.parallel.dp_replicate_size)->default_value(c.parallel.dp_replicate_size),
       "data-parallel replicas (DP; with dp_shard_size > 1: HSDP)")
      ("parallel.dp_shard_size", po::value(&c.parallel.dp_shard_size)->default_value(c.parallel.dp_shard_size),
       "FSDP shards (-1: the rest of the world)")
      ("parallel.pp_size", po::value(&c.parallel.pp_size)->default_value(c.parallel.pp_size),
       "pipeline stages over the transformer blocks (outermost in the mesh)")
      ("parallel.pp_schedule", po::value(&c.parallel.pp_schedule)->default_value(c.parallel.pp_schedule),
       "the order of the micro-batches' forwards and backwards: gpipe, 1f1b, interleaved or zb-h1")
      ("parallel.pp_virtual", po::value(&c.parallel.pp_virtual)->default_value(c.parallel.pp_virtual),
       "interleaved: model chunks per pipeline rank (>= 2)")
      ("parallel.pp_split", po::value(&c.parallel.pp_split)->default_value(c.parallel.pp_split),
       "blocks per stage, comma-separated, summing to model.n_layer (empty: balanced)")
      ("parallel.tp_size", po::value(&c.parallel.tp_size)->default_value(c.parallel.tp_size), "tensor-parallel degree (divides model.n_head and the padded vocabulary)")
      ("parallel.sequence_parallel", po::value(&c.parallel.sequence_parallel)->default_value(c.parallel.sequence_parallel),
       "with tp_size > 1: LayerNorms, residual adds and embeddings on each tp rank's seq_len / cp / tp positions "
       "(true/false); the all-reduces become reduce-scatters and all-gathers of the same bytes")
      ("parallel.reshard_after_forward", po::value(&c.parallel.reshard_after_forward)->default_value(c.parallel.reshard_after_forward),
       "FSDP: release each unit after its forward and backward (false: keep them gathered for the step: "
       "one all-gather a step instead of two per micro-batch, the rank's units held whole)")
      ("parallel.reduce_dtype", po::value(&c.parallel.reduce_dtype)->default_value(c.parallel.reduce_dtype),
       "with train.dtype = bfloat16: the dtype FSDP reduce-scatters gradients in (float32, or bfloat16 for half the bytes)")
      ("parallel.backend", po::value(&c.parallel.backend)->default_value(c.parallel.backend),
       "collectives: auto (NCCL between GPUs when there is more than one rank, else MPI), mpi, or nccl "
       "(NCCL even for one rank; needs train.device = cuda)")
      ("parallel.cp_size", po::value(&c.parallel.cp_size)->default_value(c.parallel.cp_size), "context-parallel degree (2 x cp_size divides train.seq_len)")
      ("parallel.sp_size", po::value(&c.parallel.sp_size)->default_value(c.parallel.sp_size),
       "Ulysses sequence-parallel degree: each rank holds seq_len / sp_size tokens, attention all-to-alls "
       "them into n_head / sp_size heads of the whole sequence (sp_size divides n_head and seq_len)")
      ("parallel.ep_size", po::value(&c.parallel.ep_size)->default_value(c.parallel.ep_size),
       "expert-parallel degree (mixture-of-experts models): each rank holds model.n_experts / ep_size experts "
       "of every MoE layer and all-to-alls the routed tokens to them; ep_size consecutive data ranks inside "
       "dp_shard_size (or dp_replicate_size when dp_shard_size = 1) and dividing model.n_experts")
      ("parallel.timeout_s", po::value(&c.parallel.timeout_s)->default_value(c.parallel.timeout_s),
       "the deadline of every collective (a peer dead, stopped or cut off: the job ends, exit code 6), "
       "and how long a rank asked to stop (SIGTERM) may go without finishing its step (exit code 4)")
      ("parallel.fail_at_step", po::value(&c.parallel.fail_at_step)->default_value(c.parallel.fail_at_step),
       "rehearse a failure: rank parallel.fail_rank throws in the middle of this step (0: never)")
      ("parallel.fail_rank", po::value(&c.parallel.fail_rank)->default_value(c.parallel.fail_rank),
       "the rank that fails at parallel.fail_at_step");
  po::options_description cluster("[cluster] (for --plan; 0: from the preset)");
  cluster.add_options()
      ("cluster.preset", po::value(&c.cluster.preset)->default_value(c.cluster.preset),
       "h100-sxm-8, a100-sxm-8, h100-pcie-8, h200-8 (one node of 8 GPUs; set cluster.hosts for more) or cpu-sim "
       "(one host of the simulated CPU cluster, 2 ranks, measured); docs/planner.md gives each number's source")
      ("cluster.hosts", po::value(&c.cluster.hosts)->default_value(c.cluster.hosts), "hosts (nodes)")
      ("cluster.devices_per_host", po::value(&c.cluster.devices_per_host)->default_value(c.cluster.devices_per_host), "GPUs (or ranks) per host")
      ("cluster.device_tflops", po::value(&c.cluster.device_tflops)->default_value(c.cluster.device_tflops),
       "dense TFLOP/s of one device for the training dtype (float32: TF32 tensor cores with train.tf32)")
      ("cluster.dtype", po::value(&c.cluster.dtype)->default_value(c.cluster.dtype),
       "the training dtype device_tflops is for (--plan.calibrate writes it; a plan of another dtype is refused)")
      ("cluster.efficiency", po::value(&c.cluster.efficiency)->default_value(c.cluster.efficiency),
       "share of device_tflops the matrix products reach (0 < e <= 1; a calibrated file has 1)")
      ("cluster.memory_gbps", po::value(&c.cluster.memory_gbps)->default_value(c.cluster.memory_gbps), "device memory bandwidth, GB/s")
      ("cluster.bf16_memory_gbps", po::value(&c.cluster.bf16_memory_gbps)->default_value(c.cluster.bf16_memory_gbps),
       "GB/s the element-wise ops reach on bfloat16 values, counted in their 2 bytes (0: memory_gbps, as on GPUs, "
       "where such passes are bound by memory; a CPU converts every value to f32 and back and reaches about half; "
       "--plan.calibrate measures it)")
      ("cluster.device_memory_gb", po::value(&c.cluster.device_memory_gb)->default_value(c.cluster.device_memory_gb), "memory of one device, GB")
      ("cluster.intra_gbps", po::value(&c.cluster.intra_gbps)->default_value(c.cluster.intra_gbps),
       "bandwidth between the devices of a host, GB/s per device and direction (NVLink, PCIe, shared memory)")
      ("cluster.intra_latency_us", po::value(&c.cluster.intra_latency_us)->default_value(c.cluster.intra_latency_us), "latency of one message inside a host, microseconds")
      ("cluster.inter_gbps", po::value(&c.cluster.inter_gbps)->default_value(c.cluster.inter_gbps),
       "bandwidth between hosts, GB/s per device and direction (a host's links carry devices_per_host times it)")
      ("cluster.inter_latency_us", po::value(&c.cluster.inter_latency_us)->default_value(c.cluster.inter_latency_us), "latency of one message between hosts, microseconds")
      ("cluster.intra_cpu_share", po::value(&c.cluster.intra_cpu_share)->default_value(c.cluster.intra_cpu_share),
       "of a transfer inside a host, the share of its time it takes from the computation it runs under (CPU ranks copy "
       "its bytes on the cores that compute; 0 on GPUs; --plan.calibrate measures it)")
      ("cluster.inter_cpu_share", po::value(&c.cluster.inter_cpu_share)->default_value(c.cluster.inter_cpu_share),
       "the same for a transfer between hosts")
      ("cluster.attention_tflops", po::value(&c.cluster.attention_tflops)->default_value(c.cluster.attention_tflops),
       "CPU ranks: TFLOP/s the fused attention core's products reach (q k^T, p v and backward's; 0: device_tflops; "
       "--plan.calibrate measures it)")
      ("cluster.expert_tflops", po::value(&c.cluster.expert_tflops)->default_value(c.cluster.expert_tflops),
       "TFLOP/s a mixture of experts' grouped GEMMs reach in its MoE MLP (0: device_tflops; --plan.calibrate "
       "measures it for an MoE model)")
      ("cluster.score_pass_ns", po::value(&c.cluster.score_pass_ns)->default_value(c.cluster.score_pass_ns),
       "CPU ranks: nanoseconds of one pass of the fused attention core's softmax over one score (0: 4 bytes at "
       "memory_gbps; --plan.calibrate measures it)");
  po::options_description lora("[lora]");
  lora.add_options()
      ("lora.rank", po::value(&c.lora.rank)->default_value(c.lora.rank),
       "LoRA: train rank-r adapters on a frozen base (model.init_from) instead of every weight (0: no LoRA)")
      ("lora.alpha", po::value(&c.lora.alpha)->default_value(c.lora.alpha),
       "the adapters' scale is alpha / rank (PEFT's lora_alpha)")
      ("lora.dropout", po::value(&c.lora.dropout)->default_value(c.lora.dropout),
       "dropout on the adapters' input while training, in [0, 1) (PEFT's lora_dropout)")
      ("lora.targets", po::value(&c.lora.targets_text)->default_value(c.lora.targets_text),
       "PEFT's target_modules, comma-separated: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj "
       "(llama), c_attn, c_proj, c_fc (gpt2), or all-linear (every linear but the head); empty: PEFT's "
       "default (q_proj,v_proj for llama, c_attn for gpt2)")
      ("lora.rslora", po::value(&c.lora.rslora)->default_value(c.lora.rslora),
       "rank-stabilized LoRA: scale alpha / sqrt(rank) (PEFT's use_rslora)")
      ("lora.init_from", po::value(&c.lora.init_from)->default_value(c.lora.init_from),
       "start from a PEFT adapter folder (adapter_config.json, adapter_model.safetensors): its r, lora_alpha, "
       "target_modules and use_rslora fill the lora keys not given, and must agree with those given");
  po::options_description run("run");
  run.add_options()
      ("out", po::value(&c.out)->default_value(c.out),
       "the run folder: every output of the run in it (checkpoint.dir, log.metrics and log.report default to "
       "ckpt, metrics.jsonl and report.html there; a relative output path given is taken inside it); in a "
       "config file, before the first [section] (empty: each output key's path as given)");
  po::options_description all;
  all.add(run).add(model).add(data).add(train).add(optim).add(ckpt).add(log).add(sample).add(par).add(lora).add(cluster);
  return all;
}
// clang-format on

// A parsed value as text, for comparing configs between ranks.
std::string value_text(const boost::any& v) {
  if (auto* p = boost::any_cast<int64_t>(&v)) return std::to_string(*p);
  if (auto* p = boost::any_cast<int>(&v)) return std::to_string(*p);
  if (auto* p = boost::any_cast<bool>(&v)) return *p ? "true" : "false";
  if (auto* p = boost::any_cast<std::string>(&v)) return *p;
  if (auto* p = boost::any_cast<double>(&v)) {
    char s[32];
    std::snprintf(s, sizeof(s), "%.17g", *p);  // every bit of the double
    return s;
  }
  NDT_FAIL("config: a value of an unexpected type (", v.type().name(), "); value_text needs a case for it");
}

// The INI file: `[section]` lines, `key = value` lines, comments from `#` (or a line
// starting with `;`). A value in double quotes is taken literally up to the last quote on
// the line, `#` included; outside quotes `\#` is a literal `#`. Returns what
// boost::program_options would have parsed, so the command line and the file share one
// store.
po::parsed_options parse_ini(const std::string& path, const po::options_description& keys) {
  std::ifstream f(path);
  if (!f.good()) throw ConfigError("cannot read config file '" + path + "'");
  auto trim = [](std::string t) {
    const size_t a = t.find_first_not_of(" \t\r"), b = t.find_last_not_of(" \t\r");
    return a == std::string::npos ? std::string() : t.substr(a, b - a + 1);
  };
  po::parsed_options parsed(&keys);
  std::string line, section;
  for (int lineno = 1; std::getline(f, line); ++lineno) {
    const std::string where = path + ":" + std::to_string(lineno);
    line = trim(line);
    if (line.empty() || line[0] == '#' || line[0] == ';') continue;
    if (line[0] == '[') {
      const size_t close = line.find(']');
      const std::string rest = close == std::string::npos ? "" : trim(line.substr(close + 1));
      if (close == std::string::npos || (!rest.empty() && rest[0] != '#'))
        throw ConfigError(where + ": malformed section line '" + line + "'");
      section = trim(line.substr(1, close - 1));
      continue;
    }
    const size_t eq = line.find('=');
    if (eq == std::string::npos || eq == 0)
      throw ConfigError(where + ": expected 'key = value' or '[section]', got '" + line + "'");
    const std::string key = trim(line.substr(0, eq));
    std::string raw = trim(line.substr(eq + 1)), value;
    if (!raw.empty() && raw[0] == '"') {
      const size_t last = raw.rfind('"');
      if (last == 0) throw ConfigError(where + ": the value of '" + key + "' opens a quote it never closes");
      const std::string rest = trim(raw.substr(last + 1));
      if (!rest.empty() && rest[0] != '#')
        throw ConfigError(where + ": text after the closing quote of '" + key + "': '" + rest + "'");
      value = raw.substr(1, last - 1);
    } else {
      for (size_t i = 0; i < raw.size(); ++i) {
        if (raw[i] == '\\' && i + 1 < raw.size() && raw[i + 1] == '#') {
          value += '#';
          ++i;
        } else if (raw[i] == '#') {
          break;
        } else {
          value += raw[i];
        }
      }
      value = trim(value);
    }
    const std::string name = section.empty() ? key : section + "." + key;
    if (!keys.find_nothrow(name, false))
      throw ConfigError("unknown key '" + name + "' (" + where + "); run train_gpt --help for every key");
    parsed.options.push_back(po::option(name, {value}));
  }
  return parsed;
}

// The options that are not config keys: --help, --config, --plan and its companions.
po::options_description program_options(Config& c) {
  po::options_description generic(
      "train_gpt: train a GPT on token shards.\n\nUsage: train_gpt --config gpt.ini [--sec.key value "
      "...]\n\nOptions");
  generic.add_options()("help,h", "print this help and exit")("config", po::value(&c.config_path),
                                                              "INI file with [section] key = value lines");
  generic.add_options()(
      "plan", po::bool_switch(&c.plan),
      "print the per-rank memory and per-step communication plan and exit (no data, no MPI)")(
      "json", po::bool_switch(&c.plan_json), "with --plan: print the plan as JSON")(
      "plan.world", po::value(&c.plan_world),
      "with --plan: the number of ranks (needed when dp_shard_size = -1 and no cluster is given)")(
      "cluster", po::value(&c.cluster_path),
      "with --plan: an INI file with only a [cluster] section (the command line wins over it, it over "
      "--config)")("plan.search", po::bool_switch(&c.plan_search),
                   "with --plan and a cluster: rank every layout, micro-batch and checkpointing mode by "
                   "predicted tokens/s")("plan.batch", po::value(&c.plan_batch),
                                         "with --plan.search: sequences per optimizer step (0: "
                                         "micro_batch_size x grad_accum_steps x the config's "
                                         "data-parallel ranks)")(
      "plan.top", po::value(&c.plan_top), "with --plan.search: how many plans to print (default 10)")(
      "plan.ep_imbalance", po::value(&c.plan_ep_imbalance),
      "with --plan under parallel.ep_size > 1: the rows a rank's experts receive over perfectly balanced "
      "routing's (default 1: balanced)")(
      "plan.calibrate", po::value(&c.plan_calibrate),
      "measure this machine (under mpirun: every rank; the hosts from their names) at the model's shapes and "
      "write a --cluster file here");
  return generic;
}

std::string help_text(const po::options_description& cmdline) {
  std::ostringstream os;
  os << cmdline << "\nEvery key may be given in the INI file as `key = value` under `[section]`,\n"
     << "or on the command line as --section.key value; the command line wins. In the file, `#`\n"
     << "starts a comment; quote a value (prompt = \"C# rocks\") or write \\# to keep a `#`.\n";
  return os.str();
}

po::parsed_options parse_ini_file(const std::string& path, const po::options_description& keys) {
  std::error_code ec;
  if (!fs::exists(path, ec)) throw ConfigError("cannot read config file '" + path + "': it does not exist");
  if (!fs::is_regular_file(path, ec))
    throw ConfigError("config file '" + path + "' is not a regular file (a directory?)");
  return parse_ini(path, keys);
}

// A --cluster file: an INI file of [cluster] keys only.
po::parsed_options parse_cluster_file(const std::string& path, const po::options_description& keys) {
  po::parsed_options parsed = parse_ini_file(path, keys);
  for (const po::option& o : parsed.options)
    if (o.string_key.rfind("cluster.", 0) != 0)
      throw ConfigError("--cluster " + path + ": '" + o.string_key +
                        "' is not a [cluster] key; a cluster file holds only the [cluster] section (put the "
                        "rest in --config)");
  return parsed;
}

// Values as the rest of the code reads them: the prompt's escapes, and the old spellings of
// train.activation_checkpointing (it was a bool; those boost accepted mean full / none).
void normalize(Config& c) {
  c.model.rope.llama3.reset();  // model.rope_scaling's keys into the model's RopeConfig
  if (c.model.rope_scaling == "llama3") c.model.rope.llama3 = c.model.llama3;
  c.sample.prompt = unescape(c.sample.prompt);
  c.lora.targets.clear();  // lora.targets: comma-separated, spaces ignored
  std::string t;
  for (const char ch : c.lora.targets_text + ",") {
    if (ch == ',') {
      if (!t.empty()) c.lora.targets.push_back(t);
      t.clear();
    } else if (!std::isspace(static_cast<unsigned char>(ch))) {
      t += ch;
    }
  }
  std::string ac = c.train.activation_checkpointing;
  for (char& ch : ac) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (ac == "true" || ac == "yes" || ac == "on" || ac == "1") c.train.activation_checkpointing = "full";
  if (ac == "false" || ac == "no" || ac == "off" || ac == "0") c.train.activation_checkpointing = "none";
}

}  // namespace

namespace {

// out, the run folder: the output keys' paths inside it (Config::out).
void apply_run_folder(Config& c, const po::variables_map& vm) {
  if (c.out.empty()) return;
  auto place = [&](const std::string& key, std::string& path, const char* standard) {
    if (!vm.count(key) || vm[key].defaulted()) path = standard;
    if (!path.empty() && fs::path(path).is_relative()) path = (fs::path(c.out) / path).string();
  };
  place("checkpoint.dir", c.checkpoint.dir, "ckpt");
  place("log.metrics", c.log.metrics, "metrics.jsonl");
  place("log.report", c.log.report, "report.html");
  place("log.tensorboard", c.log.tensorboard, "");
  place("log.trace", c.log.trace, "");
  place("log.grads", c.log.grads, "");
}

}  // namespace

// model.init_from a Hugging Face folder: the model is its config.json's. A model key given in
// the config or on the command line must agree with it (block_size of a llama may be
// smaller: rotary positions need no table); the others are taken from the folder.
void apply_model_folder(Config& c, const po::variables_map& vm) {
  if (c.model.init_from.empty()) return;
  models::GPTConfig theirs;
  try {
    c.model.init_source = std::make_shared<const ckpt::WeightSource>(ckpt::find_weights(c.model.init_from));
    if (c.model.init_source->kind != ckpt::WeightSource::Kind::kHfFolder) return;
    theirs = ckpt::model_config(c.model.init_source->hf->config());
  } catch (const Error& e) {
    throw ConfigError(std::string("model.init_from: ") + e.what());
  }
  const std::string file = (fs::path(c.model.init_from) / "config.json").string();
  std::vector<std::string> clashes;
  auto given = [&](const std::string& key) { return vm.count(key) && !vm[key].defaulted(); };
  auto take = [&](const std::string& key, auto& ours, const auto& value) {
    if (given(key) && !(ours == value)) {
      std::ostringstream os;
      os << std::boolalpha << key << " = " << ours << " (given) but " << value << " in " << file;
      clashes.push_back(os.str());
    }
    ours = value;
  };
  ModelSection& m = c.model;
  models::GPTConfig folder = theirs;
  folder.n_kv_head = theirs.kv_heads();
  models::visit_fields(
      [&](const models::Field& f, auto& ours, const auto& value) {
        const std::string key = std::string("model.") + f.name;
        if (!f.hf || !f.of(theirs)) return;
        // fewer positions than the model was trained for: allowed (rotary positions need no table)
        if (key == "model.block_size" && !theirs.family().learned_positions && given(key) && ours <= value)
          return;
        take(key, ours, value);
      },
      m, folder);
  if (!theirs.family().learned_positions) {
    take("model.rope_scaling", m.rope_scaling, std::string(theirs.rope.llama3 ? "llama3" : "none"));
    if (theirs.rope.llama3) {
      take("model.rope_factor", m.llama3.factor, theirs.rope.llama3->factor);
      take("model.rope_low_freq_factor", m.llama3.low_freq_factor, theirs.rope.llama3->low_freq_factor);
      take("model.rope_high_freq_factor", m.llama3.high_freq_factor, theirs.rope.llama3->high_freq_factor);
      take("model.rope_original_max_position", m.llama3.original_max_position,
           theirs.rope.llama3->original_max_position);
    }
  }
  if (!clashes.empty()) {
    std::string all;
    for (const std::string& x : clashes) all += (all.empty() ? "" : "; ") + x;
    throw ConfigError("model.init_from is a Hugging Face folder whose config.json describes the model, and " +
                      all + "; drop the key or make it agree");
  }
}

namespace {

// lora.init_from: the adapter folder's settings into the [lora] keys not given; a key given
// must agree with it (targets as sets of names; all-linear is checked by the tensors' names)
void apply_lora_folder(Config& c, const po::variables_map& vm) {
  LoraSection& l = c.lora;
  if (l.init_from.empty()) return;
  nn::LoraConfig theirs;
  try {
    theirs = ckpt::read_peft_config(l.init_from);
  } catch (const Error& e) {
    throw ConfigError(std::string("lora.init_from: ") + e.what());
  }
  const std::string file = (fs::path(l.init_from) / "adapter_config.json").string();
  auto given = [&](const std::string& key) { return vm.count(key) && !vm[key].defaulted(); };
  std::string taken;
  auto agree = [&](const std::string& key, const std::string& peft, bool same, const std::string& ours,
                   const std::string& value) {
    if (!given(key)) {
      taken += (taken.empty() ? "" : ", ") + key + " = " + value;
    } else if (!same) {
      throw ConfigError(key + " = " + ours + " (given) but " + peft + " = " + value + " in " + file +
                        " (lora.init_from); give " + value + " or leave " + key + " out");
    }
  };
  auto num = [](double v) {
    std::ostringstream os;
    os << v;
    return os.str();
  };
  std::vector<std::string> ours = l.targets, folder = theirs.targets;
  std::sort(ours.begin(), ours.end());
  std::sort(folder.begin(), folder.end());
  std::string names;
  for (const std::string& t : theirs.targets) names += (names.empty() ? "" : ",") + t;
  const bool any_all = std::count(ours.begin(), ours.end(), "all-linear") +
                           std::count(folder.begin(), folder.end(), "all-linear") >
                       0;
  agree("lora.rank", "r", l.rank == theirs.rank, std::to_string(l.rank), std::to_string(theirs.rank));
  agree("lora.alpha", "lora_alpha", l.alpha == theirs.alpha, num(l.alpha), num(theirs.alpha));
  agree("lora.targets", "target_modules", (ours == folder || any_all) && !l.targets.empty(), l.targets_text,
        names);
  agree("lora.rslora", "use_rslora", l.rslora == theirs.rslora, l.rslora ? "true" : "false",
        theirs.rslora ? "true" : "false");
  if (!given("lora.rank")) l.rank = theirs.rank;
  if (!given("lora.alpha")) l.alpha = theirs.alpha;
  if (!given("lora.targets") || l.targets.empty()) l.targets = theirs.targets;
  if (!given("lora.rslora")) l.rslora = theirs.rslora;
  l.taken = "lora.init_from " + l.init_from + ": " +
            (taken.empty() ? "every [lora] key given agrees" : taken + " from its adapter_config.json");
  if (theirs.dropout != l.dropout)  // a training setting, not the adapters': lora.dropout decides
    l.taken += "; its lora_dropout " + num(theirs.dropout) +
               " is not applied (lora.dropout = " + num(l.dropout) + "; set lora.dropout to train with it)";
}

}  // namespace

bool parse_config(int argc, const char* const* argv, Config& c, std::string& help_out) {
  po::options_description keys = describe(c);
  const po::options_description generic = program_options(c);
  po::options_description cmdline;
  cmdline.add(generic).add(keys);
  // Words that are not options land here, to be refused by name.
  std::vector<std::string> stray;
  po::options_description hidden;
  hidden.add_options()("stray-argument", po::value(&stray));
  po::options_description parser_opts;
  parser_opts.add(cmdline).add(hidden);
  po::positional_options_description positional;
  positional.add("stray-argument", -1);
  po::variables_map vm;
  try {
    // No prefix matching: --optim.l must not mean --optim.lr.
    const int style = po::command_line_style::default_style & ~po::command_line_style::allow_guessing;
    po::store(
        po::command_line_parser(argc, argv).options(parser_opts).positional(positional).style(style).run(),
        vm);  // the command line wins: stored first
    if (vm.count("stray-argument")) {
      const std::string a = vm["stray-argument"].as<std::vector<std::string>>().front();
      throw ConfigError("unexpected argument '" + a + "': every setting is --section.key value" +
                        (a.size() > 4 && a.substr(a.size() - 4) == ".ini"
                             ? " (did you mean --config " + a + "?)"
                             : std::string()));
    }
    if (vm.count("help")) {
      help_out = help_text(cmdline);
      return false;
    }
    if (vm.count("cluster")) po::store(parse_cluster_file(vm["cluster"].as<std::string>(), keys), vm);
    if (vm.count("config")) po::store(parse_ini_file(vm["config"].as<std::string>(), keys), vm);
    po::notify(vm);
    for (const auto& d : keys.options()) {
      const std::string& name = d->long_name();
      if (vm.count(name)) c.values.emplace_back(name, value_text(vm[name].value()));
    }
    std::sort(c.values.begin(), c.values.end());
  } catch (const ConfigError&) {
    throw;
  } catch (const po::unknown_option& e) {
    std::string name = e.get_option_name();
    while (!name.empty() && name[0] == '-') name.erase(0, 1);
    throw ConfigError(
        "unknown key '" + name + "'" +
        (vm.count("config") ? " (in " + vm["config"].as<std::string>() + " or on the command line)" : "") +
        "; run train_gpt --help for every key");
  } catch (const po::validation_error& e) {
    std::string name = e.get_option_name();
    while (!name.empty() && name[0] == '-') name.erase(0, 1);
    const po::option_description* d = keys.find_nothrow(name, false);
    throw ConfigError("bad value for '" + name + "': " + e.what() + "; it takes " +
                      (d ? value_kind(*d) : std::string("a value")) + " (see train_gpt --help)");
  } catch (const po::error& e) {
    throw ConfigError(std::string(e.what()) + "; run train_gpt --help for every key and its allowed values");
  }
  apply_model_folder(c, vm);
  apply_run_folder(c, vm);
  normalize(c);
  apply_lora_folder(c, vm);
  validate(c);
  return true;
}

namespace {

// The checks of validate(), each one line naming the key: integer keys have ranges far
// beyond any real run (kBig for counts of steps), so that no size computed from them can
// overflow and a typo fails here, before anything is allocated.
constexpr int64_t kBig = int64_t(1) << 40;
struct Checks {
  void need(bool ok, const std::string& msg) const {
    if (!ok) throw ConfigError(msg);
  }
  void range(const char* key, int64_t v, int64_t lo, int64_t hi) const {
    need(v >= lo && v <= hi, std::string(key) + " = " + std::to_string(v) + " is outside [" +
                                 std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }
  // 0 (the preset's value) or a number a real machine can have, in [lo, hi] `unit`
  void physical(const char* key, double v, double lo, double hi, const char* unit) const {
    char range[96];
    std::snprintf(range, sizeof(range), "%g to %g %s", lo, hi, unit);
    need(v == 0 || (std::isfinite(v) && v >= lo && v <= hi), std::string(key) + " = " + std::to_string(v) +
                                                                 " is not a value a machine has: expected " +
                                                                 range + " (or 0: the preset's)");
  }
  void finite(const char* key, double v, bool positive) const {
    need(std::isfinite(v) && (positive ? v > 0 : v >= 0), std::string(key) + " must be a finite number " +
                                                              (positive ? "> 0" : ">= 0") + ", got " +
                                                              std::to_string(v));
  }
};

void validate_model(const Config& c, const Checks& ck) {
  ck.range("plan.world", c.plan_world, 0, kBig);
  ck.range("plan.batch", c.plan_batch, 0, kBig);
  ck.range("plan.top", c.plan_top, 1, 100000);
  ck.need(
      std::isfinite(c.plan_ep_imbalance) && c.plan_ep_imbalance >= 1 && c.plan_ep_imbalance <= 1024,
      "plan.ep_imbalance = " + std::to_string(c.plan_ep_imbalance) +
          " must be in [1, 1024]: the rows a rank's experts receive over balanced routing's (1: balanced)");
  ck.need(!c.plan_search || c.plan, "--plan.search needs --plan");
  ck.need(c.plan_calibrate.empty() || c.plan, "--plan.calibrate needs --plan");
  ck.need(c.plan || !c.data.train.empty(),
          "data.train is empty: give a glob of training shards, e.g. data/train_*.bin");
  try {  // the model's sizes in their ranges (models/gpt_config.h)
    models::check_field_ranges(c.model);
  } catch (const Error& e) {
    ck.need(false, e.what());
  }
  ck.need(models::find_family(c.model.arch) != nullptr, "model.arch must be " + models::family_names() +
                                                            " (Qwen2 and Mistral are llama), got '" +
                                                            c.model.arch + "'");
  ck.need(c.model.rope_scaling == "none" || c.model.rope_scaling == "llama3",
          "model.rope_scaling must be none or llama3, got '" + c.model.rope_scaling + "'");
  const models::Llama3Scaling s = c.model.llama3, d{};
  ck.need(
      c.model.rope_scaling == "llama3" ||
          (s.factor == d.factor && s.low_freq_factor == d.low_freq_factor &&
           s.high_freq_factor == d.high_freq_factor && s.original_max_position == d.original_max_position),
      "model.rope_factor, rope_low_freq_factor, rope_high_freq_factor and rope_original_max_position are "
      "llama3 scaling's: set model.rope_scaling = llama3 (for model.arch = llama), or leave them out");
}

void validate_train(const Config& c, const Checks& ck) {
  ck.range("train.micro_batch_size", c.train.micro_batch_size, 1, int64_t(1) << 20);
  ck.range("train.seq_len", c.train.seq_len, 1, int64_t(1) << 20);
  ck.need(c.train.seq_len <= c.model.block_size, "train.seq_len (" + std::to_string(c.train.seq_len) +
                                                     ") must be <= model.block_size (" +
                                                     std::to_string(c.model.block_size) + ")");
  ck.need(c.train.micro_batch_size * c.train.seq_len <= (int64_t(1) << 31),
          "train.micro_batch_size x train.seq_len = " +
              std::to_string(c.train.micro_batch_size * c.train.seq_len) +
              " tokens per micro-batch; at most 2^31");
  ck.range("train.grad_accum_steps", c.train.grad_accum_steps, 1, int64_t(1) << 20);
  ck.range("train.steps", c.train.steps, 0, kBig);  // 0: evaluate (and sample) the weights, no step
  ck.range("train.eval_every", c.train.eval_every, 0, kBig);
  ck.range("train.eval_steps", c.train.eval_steps, 1, int64_t(1) << 20);
  ck.range("train.seed", c.train.seed, 0, std::numeric_limits<int64_t>::max());
  ck.need(
      c.train.device == "cpu" || c.train.device == "cuda" ||
          (c.train.device.size() > 5 && c.train.device.size() <= 7 && c.train.device.rfind("cuda:", 0) == 0 &&
           c.train.device.find_first_not_of("0123456789", 5) == std::string::npos),
      "train.device must be cpu, cuda or cuda:N, got '" + c.train.device + "'");
  ck.need(c.train.dtype == "float32" || c.train.dtype == "bfloat16",
          "train.dtype must be float32 or bfloat16, got '" + c.train.dtype + "'");
  ck.need(c.parallel.backend == "auto" || c.parallel.backend == "mpi" || c.parallel.backend == "nccl",
          "parallel.backend must be auto, mpi or nccl, got '" + c.parallel.backend + "'");
  ck.need(
      c.parallel.backend != "nccl" || c.train.device.rfind("cuda", 0) == 0,
      "parallel.backend = nccl needs train.device = cuda (NCCL moves GPU memory); use mpi or auto on cpu");
  ck.need(c.parallel.reduce_dtype == "float32" || c.parallel.reduce_dtype == "bfloat16",
          "parallel.reduce_dtype must be float32 or bfloat16, got '" + c.parallel.reduce_dtype + "'");
  const int64_t cores = std::max<int64_t>(1, std::thread::hardware_concurrency());
  ck.need(c.train.threads >= 0 && c.train.threads <= cores,
          "train.threads = " + std::to_string(c.train.threads) + " but this machine has " +
              std::to_string(cores) + " CPUs; use 0 for all of them");
  ck.need(
      c.train.activation_checkpointing == "none" || c.train.activation_checkpointing == "full" ||
          c.train.activation_checkpointing == "selective",
      "train.activation_checkpointing must be none, full or selective (or true/false for full/none), got '" +
          c.train.activation_checkpointing + "'");
  ck.range("train.ac_every", c.train.ac_every, 1, 1024);
  ck.range("train.stop_after", c.train.stop_after, 0, kBig);
  ck.need(c.train.stop_after == 0 || !c.checkpoint.dir.empty(),
          "train.stop_after needs checkpoint.dir: without it the stopped run could not be resumed");
}

void validate_optim(const Config& c, const Checks& ck) {
  ck.finite("optim.lr", c.optim.lr, true);
  ck.need(c.optim.min_lr_frac >= 0 && c.optim.min_lr_frac <= 1, "optim.min_lr_frac must be in [0, 1]");
  ck.range("optim.warmup_steps", c.optim.warmup_steps, 0, kBig);
  ck.need(c.optim.schedule == "cosine" || c.optim.schedule == "linear" || c.optim.schedule == "constant",
          "optim.schedule must be cosine, linear or constant, got '" + c.optim.schedule + "'");
  ck.finite("optim.weight_decay", c.optim.weight_decay, false);
  ck.need(c.optim.beta1 >= 0 && c.optim.beta1 < 1 && c.optim.beta2 >= 0 && c.optim.beta2 < 1,
          "optim.beta1 and optim.beta2 must be in [0, 1)");
  ck.finite("optim.eps", c.optim.eps, true);
  ck.finite("optim.grad_clip", c.optim.grad_clip, false);
  ck.need(c.optim.lr_scaling == "none" || c.optim.lr_scaling == "linear" || c.optim.lr_scaling == "sqrt",
          "optim.lr_scaling must be none, linear or sqrt, got '" + c.optim.lr_scaling + "'");
  ck.range("optim.lr_base_batch", c.optim.lr_base_batch, 0, kBig);
  ck.need(c.optim.lr_scaling == "none" || c.optim.lr_base_batch > 0,
          "optim.lr_scaling = " + c.optim.lr_scaling +
              " needs optim.lr_base_batch: the effective batch, in sequences, that optim.lr was tuned for");
}

void validate_outputs(const Config& c, const Checks& ck) {
  ck.range("checkpoint.every", c.checkpoint.every, 0, kBig);
  ck.range("checkpoint.keep", c.checkpoint.keep, 0, 1000000);
  ck.need(c.checkpoint.format == "full" || c.checkpoint.format == "sharded",
          "checkpoint.format must be full or sharded, got '" + c.checkpoint.format + "'");
  ck.need(!c.checkpoint.resume || !c.checkpoint.dir.empty(), "checkpoint.resume needs checkpoint.dir");
  ck.range("log.every", c.log.every, 1, kBig);
  ck.finite("log.progress_seconds", c.log.progress_seconds, false);
  ck.finite("log.peak_tflops", c.log.peak_tflops, false);
  ck.range("sample.every", c.sample.every, -1, kBig);
  ck.range("sample.length", c.sample.length, 0, 65536);
  ck.range("sample.top_k", c.sample.top_k, 0, 65536);
  ck.finite("sample.temperature", c.sample.temperature, true);
  ck.need(c.sample.top_p > 0 && c.sample.top_p <= 1,
          "sample.top_p must be in (0, 1] (1: no nucleus cut), got " + std::to_string(c.sample.top_p));
  ck.finite("parallel.timeout_s", c.parallel.timeout_s, true);
  ck.need(c.sample.prompt.size() <= 65536, "sample.prompt is " + std::to_string(c.sample.prompt.size()) +
                                               " bytes; at most 65536 (the model sees only "
                                               "the last model.block_size tokens anyway)");
}

// [lora]: its own keys here; the targets and the rank against the model's linears
// when the model is described (nn::check_lora)
void validate_lora(const Config& c, const Checks& ck) {
  ck.range("lora.rank", c.lora.rank, 0, 1 << 16);
  if (!c.lora.on()) return;
  ck.need(std::isfinite(c.lora.alpha) && c.lora.alpha > 0,
          "lora.alpha must be > 0, got " + std::to_string(c.lora.alpha));
  ck.need(c.lora.dropout >= 0 && c.lora.dropout < 1,
          "lora.dropout = " + std::to_string(c.lora.dropout) +
              " must be in [0, 1) (the probability of dropping an adapter's input element)");
  ck.need(c.plan || !c.model.init_from.empty(),  // --plan: no weights are read
          "lora.rank = " + std::to_string(c.lora.rank) +
              " trains adapters on a frozen base, which comes from model.init_from; set it (a Hugging Face "
              "folder, a weights file or a checkpoint)");
}

void validate_cluster(const Config& c, const Checks& ck) {
  const ClusterSection& k = c.cluster;
  ck.range("cluster.hosts", k.hosts, 0, 1 << 16);
  ck.range("cluster.devices_per_host", k.devices_per_host, 0, 1024);
  ck.physical("cluster.device_tflops", k.device_tflops, 1e-6, 1e5, "TFLOP/s per device");
  ck.need(k.dtype.empty() || k.dtype == c.train.dtype,
          "cluster.dtype = " + k.dtype + ": the cluster's device_tflops is " + k.dtype +
              "'s rate, but train.dtype = " + c.train.dtype + "; measure it again with --train.dtype " +
              c.train.dtype + " (--plan.calibrate), or give cluster.device_tflops for " + c.train.dtype +
              " and no cluster.dtype");
  ck.need(std::isfinite(k.efficiency) && k.efficiency >= 0 && k.efficiency <= 1,
          "cluster.efficiency must be in (0, 1] (0: the preset's), got " + std::to_string(k.efficiency));
  ck.physical("cluster.memory_gbps", k.memory_gbps, 1e-3, 1e5, "GB/s");
  ck.physical("cluster.bf16_memory_gbps", k.bf16_memory_gbps, 1e-3, 1e5, "GB/s");
  ck.physical("cluster.device_memory_gb", k.device_memory_gb, 1e-3, 1e5, "GB");
  ck.physical("cluster.intra_gbps", k.intra_gbps, 1e-6, 1e5, "GB/s per device and direction");
  ck.physical("cluster.intra_latency_us", k.intra_latency_us, 1e-3, 1e7, "microseconds");
  ck.physical("cluster.inter_gbps", k.inter_gbps, 1e-6, 1e5, "GB/s per device and direction");
  ck.physical("cluster.inter_latency_us", k.inter_latency_us, 1e-3, 1e7, "microseconds");
  ck.physical("cluster.intra_cpu_share", k.intra_cpu_share, 0, 10,
              "times a transfer's time (a calibration measures up to about 1.3)");
  ck.physical("cluster.inter_cpu_share", k.inter_cpu_share, 0, 10,
              "times a transfer's time (a calibration measures up to about 1.3)");
  ck.physical("cluster.attention_tflops", k.attention_tflops, 1e-6, 1e5, "TFLOP/s per device");
  ck.physical("cluster.score_pass_ns", k.score_pass_ns, 1e-6, 1e6, "nanoseconds a score and a pass");
  ck.physical("cluster.expert_tflops", k.expert_tflops, 1e-6, 1e5, "TFLOP/s per device");
}

// Ulysses sequence parallelism: the model and the sequence must split over sp ranks (inside
// tp's heads and cp's chunks: dist::check_parallel_model); the sequence is checked here, at start.
void validate_ulysses(const Config& c, const Checks& ck) {
  const int64_t sp = c.parallel.sp_size;
  if (sp <= 1) return;
  const std::string s = "parallel.sp_size = " + std::to_string(sp);
  // (n_head: against the model that is built, which a folder may give: dist::check_parallel_model)
  const int64_t cp = std::max<int64_t>(c.parallel.cp_size, 1);  // USP: the cp rank's tokens over sp
  ck.need(c.train.seq_len % (cp * sp) == 0,
          "train.seq_len = " + std::to_string(c.train.seq_len) + " must be divisible by " +
              (cp > 1 ? "parallel.cp_size x sp_size = " + std::to_string(cp) + " x " + std::to_string(sp) +
                            " (each rank holds seq_len / (cp_size x sp_size) tokens)"
                      : s + " (each rank holds seq_len / sp_size tokens)"));
}

void validate_parallel(const Config& c, const Checks& ck) {
  ck.range("parallel.dp_replicate_size", c.parallel.dp_replicate_size, 1, 1 << 20);
  ck.need(c.parallel.dp_shard_size == -1 ||
              (c.parallel.dp_shard_size >= 1 && c.parallel.dp_shard_size <= (1 << 20)),
          "parallel.dp_shard_size must be >= 1, or -1 for the rest of the world, got " +
              std::to_string(c.parallel.dp_shard_size));
  ck.range("parallel.tp_size", c.parallel.tp_size, 1, 1 << 16);
  ck.range("parallel.cp_size", c.parallel.cp_size, 1, 1 << 16);
  ck.range("parallel.sp_size", c.parallel.sp_size, 1, 1 << 16);
  ck.range("parallel.ep_size", c.parallel.ep_size, 1, 1 << 16);
  // expert parallelism over replicas: each replica holds other experts, and a sharded checkpoint
  // is written by the first replica only (dist/expert_parallel/expert_parallel.h)
  ck.need(
      c.parallel.ep_size == 1 || c.parallel.dp_shard_size != 1 || c.checkpoint.format == "full" ||
          c.checkpoint.dir.empty(),
      "parallel.ep_size = " + std::to_string(c.parallel.ep_size) +
          " over replicas (dp_shard_size = 1) needs checkpoint.format = full: the replicas hold different "
          "experts and a sharded checkpoint would keep only the first replica's");
  validate_ulysses(c, ck);
  ck.range("parallel.pp_size", c.parallel.pp_size, 1, 1 << 12);
  ck.range("parallel.pp_virtual", c.parallel.pp_virtual, 1, 1 << 12);
  // the schedule's name here; its other rules with the model's (dist::plan_pipeline)
  try {
    dist::pp::parse_kind(c.parallel.pp_schedule);
  } catch (const Error& e) {
    ck.need(false, "parallel.pp_schedule: " + std::string(e.what()));
  }
  ck.range("parallel.fail_at_step", c.parallel.fail_at_step, 0, kBig);
  ck.range("parallel.fail_rank", c.parallel.fail_rank, 0, 1 << 20);
  ck.need(c.parallel.cp_size == 1 || c.train.seq_len % (2 * c.parallel.cp_size) == 0,
          "train.seq_len = " + std::to_string(c.train.seq_len) +
              " must be divisible by 2 x parallel.cp_size = " + std::to_string(2 * c.parallel.cp_size) +
              " (each context-parallel rank holds two chunks of every sequence)");
}

}  // namespace

void validate(const Config& c) {
  const Checks ck;
  validate_model(c, ck);
  validate_train(c, ck);
  validate_optim(c, ck);
  validate_outputs(c, ck);
  validate_parallel(c, ck);
  validate_lora(c, ck);
  validate_cluster(c, ck);
}

nn::ACMode ac_mode(const TrainSection& t) {
  if (t.activation_checkpointing == "full") return nn::ACMode::full;
  if (t.activation_checkpointing == "selective") return nn::ACMode::selective;
  if (t.activation_checkpointing == "none") return nn::ACMode::none;
  throw ConfigError("train.activation_checkpointing must be none, full or selective, got '" +
                    t.activation_checkpointing + "'");
}

std::vector<std::string> warnings(const Config& c) {
  std::vector<std::string> w;
  if (c.train.ac_every > 1 && c.train.activation_checkpointing == "none")
    w.push_back("train.ac_every = " + std::to_string(c.train.ac_every) +
                " has no effect: train.activation_checkpointing is none");
  if (c.train.ac_every > c.model.n_layer && c.train.activation_checkpointing != "none")
    w.push_back("train.ac_every (" + std::to_string(c.train.ac_every) + ") > model.n_layer (" +
                std::to_string(c.model.n_layer) + "): only block 0 is checkpointed");
  if (c.lora.rank == 0 && (!c.lora.targets.empty() || c.lora.rslora))
    w.push_back("lora.targets and lora.rslora have no effect: lora.rank is 0 (every weight is trained)");
  if (c.optim.warmup_steps > c.train.steps)
    w.push_back("optim.warmup_steps (" + std::to_string(c.optim.warmup_steps) + ") > train.steps (" +
                std::to_string(c.train.steps) + "): the learning rate never reaches optim.lr");
  return w;
}

std::string unescape(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 1 < s.size()) {
      const char n = s[++i];
      out += n == 'n' ? '\n' : n == 't' ? '\t' : n;
    } else {
      out += s[i];
    }
  }
  return out;
}

}  // namespace ndt::train
