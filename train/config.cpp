#include "train/config.h"

#include <boost/program_options.hpp>
#include <fstream>
#include <sstream>

namespace po = boost::program_options;

namespace ndt::train {
namespace {

// One option a line reads best as a table.
// clang-format off
po::options_description describe(Config& c) {
  po::options_description model("[model]");
  model.add_options()
      ("model.n_layer", po::value(&c.n_layer)->default_value(c.n_layer), "transformer blocks")
      ("model.n_head", po::value(&c.n_head)->default_value(c.n_head), "attention heads (must divide n_embd)")
      ("model.n_embd", po::value(&c.n_embd)->default_value(c.n_embd), "channels C")
      ("model.vocab_size", po::value(&c.vocab_size)->default_value(c.vocab_size),
       "vocabulary size V (every token in the data must be < V; 50257 for GPT-2)")
      ("model.block_size", po::value(&c.block_size)->default_value(c.block_size), "maximum sequence length (positions)")
      ("model.vocab_multiple", po::value(&c.vocab_multiple)->default_value(c.vocab_multiple),
       "pad the vocabulary to a multiple of this (e.g. 128) for speed; padded logits never affect the loss")
      ("model.init_from", po::value(&c.init_from)->default_value(c.init_from),
       "safetensors file with HF GPT-2 names to start from (empty: random init)");
  po::options_description data("[data]");
  data.add_options()
      ("data.train", po::value(&c.train_data)->default_value(c.train_data), "glob of training shards (llm.c format)")
      ("data.val", po::value(&c.val_data)->default_value(c.val_data), "glob of validation shards (empty: no eval)")
      ("data.shuffle", po::value(&c.shuffle)->default_value(c.shuffle), "shuffle batch windows each epoch (true/false)")
      ("data.vocab", po::value(&c.vocab)->default_value(c.vocab),
       "vocab.json for decoding samples (empty: vocab.json beside the training shards, if any)");
  po::options_description train("[train]");
  train.add_options()
      ("train.micro_batch_size", po::value(&c.micro_batch_size)->default_value(c.micro_batch_size), "sequences per micro-batch B")
      ("train.seq_len", po::value(&c.seq_len)->default_value(c.seq_len), "tokens per sequence T (<= model.block_size)")
      ("train.grad_accum_steps", po::value(&c.grad_accum_steps)->default_value(c.grad_accum_steps), "micro-batches per optimizer step")
      ("train.steps", po::value(&c.steps)->default_value(c.steps), "optimizer steps")
      ("train.eval_every", po::value(&c.eval_every)->default_value(c.eval_every), "evaluate every N steps (0: only at the end)")
      ("train.eval_steps", po::value(&c.eval_steps)->default_value(c.eval_steps), "validation batches per evaluation")
      ("train.seed", po::value(&c.seed)->default_value(c.seed), "seed for init, shuffling and sampling")
      ("train.device", po::value(&c.device)->default_value(c.device), "cpu or cuda (cuda:N)")
      ("train.dtype", po::value(&c.dtype)->default_value(c.dtype), "float32 (bfloat16 arrives with mixed precision)")
      ("train.activation_checkpointing", po::value(&c.activation_checkpointing)->default_value(c.activation_checkpointing),
       "recompute each block in backward to save memory (true/false)")
      ("train.threads", po::value(&c.threads)->default_value(c.threads), "CPU threads (0: all cores)")
      ("train.stop_after", po::value(&c.stop_after)->default_value(c.stop_after),
       "stop after this many steps of this run, with a checkpoint, to resume later (0: run to train.steps)");
  po::options_description optim("[optim]");
  optim.add_options()
      ("optim.lr", po::value(&c.lr)->default_value(c.lr), "peak learning rate")
      ("optim.min_lr_frac", po::value(&c.min_lr_frac)->default_value(c.min_lr_frac), "final lr = lr * min_lr_frac")
      ("optim.warmup_steps", po::value(&c.warmup_steps)->default_value(c.warmup_steps), "linear warmup steps")
      ("optim.schedule", po::value(&c.schedule)->default_value(c.schedule), "after warmup: cosine, linear or constant")
      ("optim.weight_decay", po::value(&c.weight_decay)->default_value(c.weight_decay), "AdamW decoupled decay (2-D weights only)")
      ("optim.beta1", po::value(&c.beta1)->default_value(c.beta1), "AdamW beta1")
      ("optim.beta2", po::value(&c.beta2)->default_value(c.beta2), "AdamW beta2")
      ("optim.eps", po::value(&c.eps)->default_value(c.eps), "AdamW epsilon")
      ("optim.grad_clip", po::value(&c.grad_clip)->default_value(c.grad_clip), "clip the global gradient norm to this (0: off)");
  po::options_description ckpt("[checkpoint]");
  ckpt.add_options()
      ("checkpoint.dir", po::value(&c.ckpt_dir)->default_value(c.ckpt_dir), "checkpoint directory (empty: none)")
      ("checkpoint.every", po::value(&c.ckpt_every)->default_value(c.ckpt_every), "checkpoint every N steps (0: only at the end)")
      ("checkpoint.resume", po::value(&c.resume)->default_value(c.resume), "resume from the latest checkpoint in dir (true/false)")
      ("checkpoint.keep", po::value(&c.ckpt_keep)->default_value(c.ckpt_keep), "checkpoints to keep (0: all)");
  po::options_description log("[log]");
  log.add_options()
      ("log.metrics", po::value(&c.metrics)->default_value(c.metrics), "JSON-lines metrics file (empty: none)")
      ("log.every", po::value(&c.log_every)->default_value(c.log_every), "print a line every N steps")
      ("log.report", po::value(&c.report)->default_value(c.report), "HTML report with loss curves, written at the end (empty: none)")
      ("log.peak_tflops", po::value(&c.peak_tflops)->default_value(c.peak_tflops),
       "peak TFLOP/s of one device for MFU on GPU (0: 989 for H100 bf16 / 67 f32)");
  po::options_description sample("[sample]");
  sample.add_options()
      ("sample.every", po::value(&c.sample_every)->default_value(c.sample_every), "sample every N steps (0: only at the end; -1: never)")
      ("sample.length", po::value(&c.sample_length)->default_value(c.sample_length), "tokens to generate")
      ("sample.temperature", po::value(&c.temperature)->default_value(c.temperature), "softmax temperature (> 0)")
      ("sample.top_k", po::value(&c.top_k)->default_value(c.top_k), "sample from the k most likely tokens (0: all)")
      ("sample.prompt", po::value(&c.prompt)->default_value(c.prompt), "text to start from (\\n for a newline)");
  po::options_description par("[parallel]");
  par.add_options()
      ("parallel.dp_replicate_size", po::value(&c.dp_replicate_size)->default_value(c.dp_replicate_size), "data-parallel replicas")
      ("parallel.dp_shard_size", po::value(&c.dp_shard_size)->default_value(c.dp_shard_size), "FSDP shards")
      ("parallel.tp_size", po::value(&c.tp_size)->default_value(c.tp_size), "tensor-parallel degree")
      ("parallel.cp_size", po::value(&c.cp_size)->default_value(c.cp_size), "context-parallel degree");
  po::options_description all;
  all.add(model).add(data).add(train).add(optim).add(ckpt).add(log).add(sample).add(par);
  return all;
}
// clang-format on

// What kind of value an option takes, for error messages.
std::string value_kind(const po::option_description& d) {
  const po::value_semantic* v = d.semantic().get();
  if (dynamic_cast<const po::typed_value<bool>*>(v)) return "true or false";
  if (dynamic_cast<const po::typed_value<int64_t>*>(v) || dynamic_cast<const po::typed_value<int>*>(v))
    return "an integer";
  if (dynamic_cast<const po::typed_value<uint64_t>*>(v)) return "a non-negative integer";
  if (dynamic_cast<const po::typed_value<double>*>(v)) return "a number";
  return "text";
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

}  // namespace

bool parse_config(int argc, const char* const* argv, Config& c, std::string& help_out) {
  po::options_description keys = describe(c);
  po::options_description generic(
      "train_gpt: train a GPT on token shards.\n\nUsage: train_gpt --config gpt.ini [--sec.key value "
      "...]\n\nOptions");
  generic.add_options()("help,h", "print this help and exit")("config", po::value(&c.config_path),
                                                              "INI file with [section] key = value lines");
  po::options_description cmdline;
  cmdline.add(generic).add(keys);
  po::variables_map vm;
  try {
    po::store(po::parse_command_line(argc, argv, cmdline), vm);  // the command line wins: stored first
    if (vm.count("help")) {
      std::ostringstream os;
      os << cmdline << "\nEvery key may be given in the INI file as `key = value` under `[section]`,\n"
         << "or on the command line as --section.key value; the command line wins.\n";
      help_out = os.str();
      return false;
    }
    if (vm.count("config")) {
      const std::string path = vm["config"].as<std::string>();
      std::ifstream f(path);
      if (!f.good()) throw ConfigError("cannot read config file '" + path + "'");
      po::store(po::parse_config_file(f, keys, /*allow_unregistered=*/false), vm);
    }
    po::notify(vm);
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
  c.prompt = unescape(c.prompt);
  validate(c);
  return true;
}

void validate(const Config& c) {
  auto need = [](bool ok, const std::string& msg) {
    if (!ok) throw ConfigError(msg);
  };
  need(!c.train_data.empty(), "data.train is empty: give a glob of training shards, e.g. data/train_*.bin");
  need(c.micro_batch_size >= 1, "train.micro_batch_size must be >= 1");
  need(c.seq_len >= 1, "train.seq_len must be >= 1");
  need(c.seq_len <= c.block_size, "train.seq_len (" + std::to_string(c.seq_len) +
                                      ") must be <= model.block_size (" + std::to_string(c.block_size) + ")");
  need(c.grad_accum_steps >= 1, "train.grad_accum_steps must be >= 1");
  need(c.steps >= 1, "train.steps must be >= 1");
  need(c.eval_every >= 0 && c.eval_steps >= 1, "train.eval_every must be >= 0 and train.eval_steps >= 1");
  need(c.device == "cpu" || c.device == "cuda" || c.device.rfind("cuda:", 0) == 0,
       "train.device must be cpu, cuda or cuda:N, got '" + c.device + "'");
  need(c.dtype == "float32" || c.dtype == "bfloat16",
       "train.dtype must be float32 or bfloat16, got '" + c.dtype + "'");
  need(c.dtype == "float32",
       "train.dtype = bfloat16 is not supported yet (mixed precision is a later issue); use float32");
  need(c.threads >= 0, "train.threads must be >= 0");
  need(c.stop_after >= 0, "train.stop_after must be >= 0");
  need(c.lr > 0, "optim.lr must be > 0");
  need(c.min_lr_frac >= 0 && c.min_lr_frac <= 1, "optim.min_lr_frac must be in [0, 1]");
  need(c.warmup_steps >= 0, "optim.warmup_steps must be >= 0");
  need(c.schedule == "cosine" || c.schedule == "linear" || c.schedule == "constant",
       "optim.schedule must be cosine, linear or constant, got '" + c.schedule + "'");
  need(c.weight_decay >= 0, "optim.weight_decay must be >= 0");
  need(c.beta1 >= 0 && c.beta1 < 1 && c.beta2 >= 0 && c.beta2 < 1,
       "optim.beta1 and optim.beta2 must be in [0, 1)");
  need(c.eps > 0, "optim.eps must be > 0");
  need(c.grad_clip >= 0, "optim.grad_clip must be >= 0");
  need(c.ckpt_every >= 0 && c.ckpt_keep >= 0, "checkpoint.every and checkpoint.keep must be >= 0");
  need(!c.resume || !c.ckpt_dir.empty(), "checkpoint.resume needs checkpoint.dir");
  need(c.log_every >= 1, "log.every must be >= 1");
  need(c.sample_every >= -1, "sample.every must be >= -1");
  need(c.sample_length >= 0 && c.top_k >= 0, "sample.length and sample.top_k must be >= 0");
  need(c.temperature > 0, "sample.temperature must be > 0");
  for (auto [key, v] : {std::pair<const char*, int64_t>{"parallel.dp_replicate_size", c.dp_replicate_size},
                        {"parallel.dp_shard_size", c.dp_shard_size},
                        {"parallel.tp_size", c.tp_size},
                        {"parallel.cp_size", c.cp_size}})
    need(v == 1, std::string(key) + " = " + std::to_string(v) +
                     ": parallelism is not available yet (a later issue); every [parallel] size must be 1");
}

}  // namespace ndt::train
