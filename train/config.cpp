#include "train/config.h"

#include <boost/program_options.hpp>
#include <cmath>
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
      ("optim.grad_clip", po::value(&c.grad_clip)->default_value(c.grad_clip), "clip the global gradient norm to this (0: off)")
      ("optim.lr_scaling", po::value(&c.lr_scaling)->default_value(c.lr_scaling),
       "scale optim.lr with the effective batch: none, linear (lr x batch/base) or sqrt (lr x sqrt(batch/base))")
      ("optim.lr_base_batch", po::value(&c.lr_base_batch)->default_value(c.lr_base_batch),
       "the effective batch, in sequences, that optim.lr was tuned for (needed by lr_scaling)");
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
      ("log.trace", po::value(&c.trace)->default_value(c.trace),
       "Chrome trace of each rank's steps (out/trace.json -> out/trace.rank0.json, ...; empty: none)")
      ("log.grads", po::value(&c.grads_file)->default_value(c.grads_file),
       "write the first step's gradients (whole unit buffers, safetensors) here, to compare layouts (empty: none)")
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
      ("parallel.dp_replicate_size", po::value(&c.dp_replicate_size)->default_value(c.dp_replicate_size),
       "data-parallel replicas (DP; with dp_shard_size > 1: HSDP)")
      ("parallel.dp_shard_size", po::value(&c.dp_shard_size)->default_value(c.dp_shard_size),
       "FSDP shards (-1: the rest of the world)")
      ("parallel.tp_size", po::value(&c.tp_size)->default_value(c.tp_size), "tensor-parallel degree (must be 1 for now)")
      ("parallel.cp_size", po::value(&c.cp_size)->default_value(c.cp_size), "context-parallel degree (must be 1 for now)");
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
      std::ostringstream os;
      os << cmdline << "\nEvery key may be given in the INI file as `key = value` under `[section]`,\n"
         << "or on the command line as --section.key value; the command line wins. In the file, `#`\n"
         << "starts a comment; quote a value (prompt = \"C# rocks\") or write \\# to keep a `#`.\n";
      help_out = os.str();
      return false;
    }
    if (vm.count("config")) {
      const std::string path = vm["config"].as<std::string>();
      std::error_code ec;
      if (!fs::exists(path, ec))
        throw ConfigError("cannot read config file '" + path + "': it does not exist");
      if (!fs::is_regular_file(path, ec))
        throw ConfigError("config file '" + path + "' is not a regular file (a directory?)");
      po::store(parse_ini(path, keys), vm);
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
  // Integer keys have ranges far beyond any real run, so that no size computed from them
  // can overflow and a typo fails here, in one line, before anything is allocated.
  auto range = [&](const char* key, int64_t v, int64_t lo, int64_t hi) {
    need(v >= lo && v <= hi, std::string(key) + " = " + std::to_string(v) + " is outside [" +
                                 std::to_string(lo) + ", " + std::to_string(hi) + "]");
  };
  auto finite = [&](const char* key, double v, bool positive) {
    need(std::isfinite(v) && (positive ? v > 0 : v >= 0), std::string(key) + " must be a finite number " +
                                                              (positive ? "> 0" : ">= 0") + ", got " +
                                                              std::to_string(v));
  };
  constexpr int64_t kBig = int64_t(1) << 40;
  need(!c.train_data.empty(), "data.train is empty: give a glob of training shards, e.g. data/train_*.bin");
  range("model.n_layer", c.n_layer, 1, 1024);
  range("model.n_head", c.n_head, 1, 1024);
  range("model.n_embd", c.n_embd, 1, 65536);
  range("model.vocab_size", c.vocab_size, 1, 65536);
  range("model.block_size", c.block_size, 1, int64_t(1) << 20);
  range("model.vocab_multiple", c.vocab_multiple, 1, 65536);
  range("train.micro_batch_size", c.micro_batch_size, 1, int64_t(1) << 20);
  range("train.seq_len", c.seq_len, 1, int64_t(1) << 20);
  need(c.seq_len <= c.block_size, "train.seq_len (" + std::to_string(c.seq_len) +
                                      ") must be <= model.block_size (" + std::to_string(c.block_size) + ")");
  need(c.micro_batch_size * c.seq_len <= (int64_t(1) << 31),
       "train.micro_batch_size x train.seq_len = " + std::to_string(c.micro_batch_size * c.seq_len) +
           " tokens per micro-batch; at most 2^31");
  range("train.grad_accum_steps", c.grad_accum_steps, 1, int64_t(1) << 20);
  range("train.steps", c.steps, 1, kBig);
  range("train.eval_every", c.eval_every, 0, kBig);
  range("train.eval_steps", c.eval_steps, 1, int64_t(1) << 20);
  range("train.seed", c.seed, 0, std::numeric_limits<int64_t>::max());
  need(c.device == "cpu" || c.device == "cuda" ||
           (c.device.size() > 5 && c.device.size() <= 7 && c.device.rfind("cuda:", 0) == 0 &&
            c.device.find_first_not_of("0123456789", 5) == std::string::npos),
       "train.device must be cpu, cuda or cuda:N, got '" + c.device + "'");
  need(c.dtype == "float32" || c.dtype == "bfloat16",
       "train.dtype must be float32 or bfloat16, got '" + c.dtype + "'");
  need(c.dtype == "float32",
       "train.dtype = bfloat16 is not supported yet (mixed precision is not implemented); use float32");
  const int64_t cores = std::max<int64_t>(1, std::thread::hardware_concurrency());
  need(c.threads >= 0 && c.threads <= cores, "train.threads = " + std::to_string(c.threads) +
                                                 " but this machine has " + std::to_string(cores) +
                                                 " CPUs; use 0 for all of them");
  range("train.stop_after", c.stop_after, 0, kBig);
  need(c.stop_after == 0 || !c.ckpt_dir.empty(),
       "train.stop_after needs checkpoint.dir: without it the stopped run could not be resumed");
  finite("optim.lr", c.lr, true);
  need(c.min_lr_frac >= 0 && c.min_lr_frac <= 1, "optim.min_lr_frac must be in [0, 1]");
  range("optim.warmup_steps", c.warmup_steps, 0, kBig);
  need(c.schedule == "cosine" || c.schedule == "linear" || c.schedule == "constant",
       "optim.schedule must be cosine, linear or constant, got '" + c.schedule + "'");
  finite("optim.weight_decay", c.weight_decay, false);
  need(c.beta1 >= 0 && c.beta1 < 1 && c.beta2 >= 0 && c.beta2 < 1,
       "optim.beta1 and optim.beta2 must be in [0, 1)");
  finite("optim.eps", c.eps, true);
  finite("optim.grad_clip", c.grad_clip, false);
  range("checkpoint.every", c.ckpt_every, 0, kBig);
  range("checkpoint.keep", c.ckpt_keep, 0, 1000000);
  need(!c.resume || !c.ckpt_dir.empty(), "checkpoint.resume needs checkpoint.dir");
  range("log.every", c.log_every, 1, kBig);
  finite("log.peak_tflops", c.peak_tflops, false);
  range("sample.every", c.sample_every, -1, kBig);
  range("sample.length", c.sample_length, 0, 65536);
  range("sample.top_k", c.top_k, 0, 65536);
  finite("sample.temperature", c.temperature, true);
  need(c.prompt.size() <= 65536, "sample.prompt is " + std::to_string(c.prompt.size()) +
                                     " bytes; at most 65536 (the model sees only "
                                     "the last model.block_size tokens anyway)");
  range("parallel.dp_replicate_size", c.dp_replicate_size, 1, 1 << 20);
  need(c.dp_shard_size == -1 || (c.dp_shard_size >= 1 && c.dp_shard_size <= (1 << 20)),
       "parallel.dp_shard_size must be >= 1, or -1 for the rest of the world, got " + std::to_string(c.dp_shard_size));
  need(c.tp_size == 1, "parallel.tp_size = " + std::to_string(c.tp_size) +
                           ": tensor parallelism is not implemented yet; use tp_size = 1 (data parallel, FSDP "
                           "and HSDP work: dp_replicate_size, dp_shard_size)");
  need(c.cp_size == 1, "parallel.cp_size = " + std::to_string(c.cp_size) +
                           ": context parallelism is not implemented yet; use cp_size = 1 (data parallel, FSDP "
                           "and HSDP work: dp_replicate_size, dp_shard_size)");
  need(c.lr_scaling == "none" || c.lr_scaling == "linear" || c.lr_scaling == "sqrt",
       "optim.lr_scaling must be none, linear or sqrt, got '" + c.lr_scaling + "'");
  range("optim.lr_base_batch", c.lr_base_batch, 0, kBig);
  need(c.lr_scaling == "none" || c.lr_base_batch > 0,
       "optim.lr_scaling = " + c.lr_scaling +
           " needs optim.lr_base_batch: the effective batch, in sequences, that optim.lr was tuned for");
}

std::vector<std::string> warnings(const Config& c) {
  std::vector<std::string> w;
  if (c.warmup_steps > c.steps)
    w.push_back("optim.warmup_steps (" + std::to_string(c.warmup_steps) + ") > train.steps (" +
                std::to_string(c.steps) + "): the learning rate never reaches optim.lr");
  return w;
}

}  // namespace ndt::train
