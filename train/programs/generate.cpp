// generate: text from a trained model, through its own tokenizer, with a key/value cache.
//
//   build/generate --model models/SmolLM2-135M --prompt "The capital of France is"
//   build/generate --model out/fortunes/ckpt --tokenizer data/fortunes/vocab.json --prompt "Q: "
//   build/generate --model out/hf --prompt "Once" --max_new_tokens 200 --temperature 0.8 \
//                  --top_k 50 --top_p 0.95 --seed 7 --device cuda --dtype bfloat16
//   build/generate --model models/SmolLM2-135M-Instruct --chat --system "Be brief." --prompt "Hi"
//   build/generate --model out/base_hf --adapter out/lora_adapter --prompt "Q: "
//
// --model is a Hugging Face model folder (config.json and safetensors: what export_weights
// writes, or one from the Hub; its tokenizer.json is the default tokenizer and its
// config.json's eos_token_id ends the text), or a train_gpt checkpoint: a step_* directory of
// a sharded checkpoint, or the checkpoint.dir holding `latest` (the tokenizer it carries is the
// default, train/checkpoint/tokenizer_files.h). --tokenizer: a tokenizer.json, a folder
// holding one, or the vocab.json prepare_text wrote beside the shards.
// --adapter: LoRA adapters on --model (their base), a PEFT adapter folder or a LoRA run's
// checkpoint, merged into the weights in memory as export_weights --merge merges them.
//
// The prompt runs through the model once; each new token then runs alone against the cached
// keys and values (models/kv_cache.h). The text is written to stdout as it is drawn, whole
// characters at a time; one line on stderr says how many tokens came at what speed. A bad
// argument, model or tokenizer is one line on stderr and exit code 2 (a failure while
// generating: 1). The options are spelled as train_gpt's keys are (--max_new_tokens); the
// spellings of the last release (--max-new-tokens, --top-k, --top-p, --ignore-eos) still work,
// with a note, until the next.
//
// --chat: the prompt is a user message (after a system message with --system), rendered
// through the model's own chat template (tokenizer/chat_template.h: the model folder's, else
// the tokenizer's folder's) with the assistant's turn opened, and tokenized without adding
// special tokens (the template wrote them). The reply alone is printed; it ends at the
// template's end-of-turn token (<|eot_id|>, <|im_end|>, </s>) as well as at end of text.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "models/generate.h"
#include "nn/flat.h"
#include "tensor/cuda/runtime.h"
#include "tensor/error.h"
#include "tensor/threads.h"
#include "tokenizer/chat_template.h"
#include "train/checkpoint/load.h"
#include "train/checkpoint/lora.h"
#include "train/checkpoint/tokenizer_files.h"
#include "train/command_line.h"
#include "train/config.h"
#include "train/data/text.h"

using namespace ndt;
namespace fs = std::filesystem;

namespace {

struct Args {
  std::string model, adapter, tokenizer, prompt, system, device = "cpu", dtype = "float32";
  bool chat = false;
  models::SampleOptions sample{
      .max_new_tokens = 200, .temperature = 0.8, .top_k = 50, .top_p = 0.95, .seed = 1};
  bool ignore_eos = false;
  int threads = 0;
};

// The command line into `a`; false after --help printed the options.
bool parse(int argc, char** argv, Args& a) {
  namespace po = boost::program_options;
  int64_t seed = static_cast<int64_t>(a.sample.seed);
  po::options_description opts(
      "generate: text from a trained model, through its own tokenizer\n\nUsage: generate --model PATH "
      "[--tokenizer PATH] [--prompt TEXT] [options]\n\nOptions");
  opts.add_options()("help,h", "print this help")(
      "model", po::value(&a.model),
      "a Hugging Face model folder, or a train_gpt checkpoint (a step_* directory or the checkpoint.dir "
      "holding latest)")(
      "adapter", po::value(&a.adapter),
      "LoRA adapters for --model (their base): a PEFT adapter folder or a LoRA run's checkpoint, merged in")(
      "tokenizer", po::value(&a.tokenizer),
      "tokenizer.json, a folder holding it, or prepare_text's vocab.json (default: the model folder's "
      "tokenizer.json, or the one the checkpoint carries)")(
      "prompt", po::value(&a.prompt), "text to continue (default: empty); \\n and \\t are understood")(
      "chat", po::bool_switch(&a.chat), "the prompt is a user message, through the model's chat template")(
      "system", po::value(&a.system), "with --chat: a system message before it")(
      "max_new_tokens", po::value(&a.sample.max_new_tokens)->default_value(a.sample.max_new_tokens),
      "tokens to generate at most")(
      "temperature", po::value(&a.sample.temperature)->default_value(a.sample.temperature, "0.8"),
      "0: greedy")("top_k", po::value(&a.sample.top_k)->default_value(a.sample.top_k),
                   "draw from the k most likely tokens (0: all)")(
      "top_p", po::value(&a.sample.top_p)->default_value(a.sample.top_p, "0.95"),
      "then from the fewest whose probability reaches p (1: all)")(
      "seed", po::value(&seed)->default_value(seed), "seed of the draws (>= 0)")(
      "ignore_eos", po::bool_switch(&a.ignore_eos), "go on past the end-of-text token")(
      "device", po::value(&a.device)->default_value(a.device), "cpu or cuda (cuda:N)")(
      "dtype", po::value(&a.dtype)->default_value(a.dtype), "float32 or bfloat16")(
      "threads", po::value(&a.threads)->default_value(a.threads), "CPU threads (0: every core)");
  po::variables_map vm;
  if (!train::parse_command_line(argc, argv, opts, {},
                                 {{"max-new-tokens", "max_new_tokens"},
                                  {"top-k", "top_k"},
                                  {"top-p", "top_p"},
                                  {"ignore-eos", "ignore_eos"}},
                                 vm))
    return false;
  a.prompt = train::unescape(a.prompt);
  a.system = train::unescape(a.system);
  NDT_CHECK(a.chat || vm.count("system") == 0, "--system is for --chat (a system message before the prompt)");
  NDT_CHECK(!a.model.empty(), "--model is required: a Hugging Face model folder or a train_gpt checkpoint");
  NDT_CHECK(a.sample.max_new_tokens >= 1, "--max_new_tokens must be >= 1, got ", a.sample.max_new_tokens);
  NDT_CHECK(a.sample.temperature >= 0 && std::isfinite(a.sample.temperature),
            "--temperature must be >= 0 (0: greedy), got ", a.sample.temperature);
  NDT_CHECK(a.sample.top_k >= 0, "--top_k must be >= 0 (0: every token), got ", a.sample.top_k);
  NDT_CHECK(a.sample.top_p > 0 && a.sample.top_p <= 1, "--top_p must be in (0, 1], got ", a.sample.top_p);
  NDT_CHECK(seed >= 0, "--seed must be >= 0, got ", seed);
  a.sample.seed = static_cast<uint64_t>(seed);
  NDT_CHECK(a.dtype == "float32" || a.dtype == "bfloat16", "--dtype takes float32 or bfloat16, got '",
            a.dtype, "'");
  NDT_CHECK(a.threads >= 0, "--threads must be >= 0, got ", a.threads);
  return true;
}

// The model at --model, its weights on `device`, and what it says ends a text.
struct Loaded {
  std::unique_ptr<models::GPT> gpt;
  nn::FlatParams params;
  std::vector<int32_t> eos;
  std::string tokenizer;  // the folder's tokenizer.json, if any
  std::string what;       // for the first line
};

Loaded load(const Args& a, Device device) {
  Loaded l;
  const std::optional<DType> compute =
      a.dtype == "bfloat16" ? std::optional<DType>(DType::bf16) : std::nullopt;
  const ckpt::WeightSource src = ckpt::find_weights(a.model);         // a folder, a checkpoint, a file
  l.gpt = std::make_unique<models::GPT>(ckpt::model_config_of(src));  // sizes in train_gpt's ranges
  ckpt::check_weights(src, *l.gpt);  // every tensor's shape, before the model is allocated
  if (!a.adapter.empty()) {          // merged into float32 weights on the host, then copied to `device`
    nn::FlatParams host = nn::materialize(l.gpt->units(), Device::cpu(), DType::f32, 0);
    ckpt::load_weights(src, *l.gpt, host);
    std::cerr << "generate: merged the " << ckpt::merge_adapter(a.adapter, *l.gpt) << "\n";
    l.params = nn::materialize(l.gpt->units(), device, DType::f32, 0, nn::ShardSpec{}, compute);
    for (size_t i = 0; i < host.units.size(); ++i)
      l.params.units[i].data.copy_(host.units[i].data.to(device));
    l.params.refresh_compute();
  } else {
    l.params = nn::materialize(l.gpt->units(), device, DType::f32, 0, nn::ShardSpec{}, compute);
    ckpt::load_weights(src, *l.gpt, l.params);
  }
  if (src.hf) {  // what a Hugging Face folder says ends a text, and its tokenizer
    for (int64_t id : src.hf->config().eos_token_id) l.eos.push_back(static_cast<int32_t>(id));
    l.tokenizer = data::TextCodec::find_in_folder(src.hf->dir());
  } else if (src.kind == ckpt::WeightSource::Kind::kSharded) {  // the tokenizer it carries, if any
    const ckpt::TokenizerFiles t = ckpt::read_tokenizer_files(src.path);
    for (int64_t id : t.eos_token_id) l.eos.push_back(static_cast<int32_t>(id));
    if (!t.vocabulary.empty()) l.tokenizer = (fs::path(src.path) / t.vocabulary).string();
  }
  l.what = src.str();
  return l;
}

// --chat: the user message (after --system) through the chat template of the model's folder,
// else of the tokenizer's, with the assistant's turn opened; its end-of-turn token's id.
std::vector<int32_t> chat_prompt(const Args& a, const data::TextCodec& codec, const std::string& tok_path,
                                 std::optional<int32_t>& end_of_turn) {
  const tok::Tokenizer* tk = codec.tokenizer();
  NDT_CHECK(tk, "--chat needs the model's tokenizer.json, not ", codec.source());
  std::error_code ec;
  const fs::path tok_dir =
      fs::is_directory(tok_path, ec) ? fs::path(tok_path) : fs::path(tok_path).parent_path();
  std::string dir;
  for (const fs::path& d : {fs::path(a.model), tok_dir})
    if (dir.empty() && fs::is_directory(d, ec) && tok::ChatTemplate::folder_has_template(d.string()))
      dir = d.string();
  NDT_CHECK(!dir.empty(), "--chat: neither ", a.model, " nor ", tok_dir.string(),
            " has a chat template (chat_template.jinja, or \"chat_template\" in tokenizer_config.json); "
            "use a chat (Instruct) model's folder");
  const tok::ChatTemplate t = tok::ChatTemplate::from_folder(dir);
  std::vector<tok::ChatMessage> messages;
  if (!a.system.empty()) messages.push_back({"system", a.system});
  messages.push_back({"user", a.prompt});
  const std::string text = t.render(messages, {.add_generation_prompt = true});
  const std::string eot = t.end_of_turn();
  end_of_turn = tk->id_of(eot);
  NDT_CHECK(end_of_turn, "--chat: the template's end-of-turn ", eot, " is not a token of ", codec.source());
  std::vector<int32_t> ids = tk->encode(text, false);
  std::cerr << "generate: chat prompt of " << ids.size() << " tokens through " << t.source() << "; stops at "
            << eot << " (id " << *end_of_turn << ")\n"
            << text << "\n";
  return ids;
}

}  // namespace

int main(int argc, char** argv) {
  use_cpu_defaults(argv);
  Args a;
  Device device = Device::cpu();
  Loaded l;
  std::optional<data::TextCodec> codec;
  std::vector<int32_t> prompt;
  try {                                   // everything a user gave: one line and exit code 2
    if (!parse(argc, argv, a)) return 0;  // --help
    device = Device::parse(a.device);
    NDT_CHECK(!device.is_cuda() || cuda::available(), "--device ", a.device, ": no CUDA device is visible");
    set_num_threads(a.threads);
    l = load(a, device);
    const std::string tok = !a.tokenizer.empty() ? a.tokenizer : l.tokenizer;
    NDT_CHECK(!tok.empty(), "--tokenizer is needed for ", l.what,
              " (it holds no tokenizer): the tokenizer.json, or the vocab.json that "
              "prepare_text wrote beside the shards the model was trained on");
    codec = data::TextCodec::load(tok);
    NDT_CHECK(codec->vocab_size() <= l.gpt->cfg.vocab_size, "the tokenizer ", codec->source(), " has ",
              codec->vocab_size(), " tokens but the model only ", l.gpt->cfg.vocab_size,
              ": not the model's tokenizer");
    std::optional<int32_t> end_of_turn;
    if (a.chat) {
      prompt = chat_prompt(a, *codec, tok, end_of_turn);
    } else {
      prompt = codec->encode_prompt(a.prompt);
    }
    a.sample.vocab_limit = codec->vocab_size();  // the ids past the tokenizer's have no text
    if (!a.ignore_eos) {
      a.sample.stop_ids = l.eos;
      if (codec->eos_id()) a.sample.stop_ids.push_back(*codec->eos_id());
      if (end_of_turn) a.sample.stop_ids.push_back(*end_of_turn);
    }
  } catch (const std::exception& e) {
    std::cerr << "generate: error: " << e.what() << "\n";
    return 2;
  }
  try {
    std::cerr << "generate: " << l.gpt->cfg.str() << " from " << l.what << "; tokenizer " << codec->describe()
              << "; " << device.str() << " " << a.dtype << "\n";
    if (codec->vocab_size() < l.gpt->cfg.vocab_size)
      std::cerr << "generate: drawing from the tokenizer's " << codec->vocab_size() << " ids (the model has "
                << l.gpt->cfg.vocab_size << ": the ids past them have no text)\n";
    if (!a.chat) std::cout << a.prompt << std::flush;  // a chat prints the reply alone
    data::TextCodec::Stream out(*codec);
    int64_t n = 0;
    const auto t0 = std::chrono::steady_clock::now();
    models::generate(*l.gpt, prompt, a.sample, device, [&](int32_t id) {
      ++n;
      const bool stop =
          std::find(a.sample.stop_ids.begin(), a.sample.stop_ids.end(), id) != a.sample.stop_ids.end();
      if (!stop) std::cout << out.push(id) << std::flush;  // the end-of-text token is not text
      return true;
    });
    std::cout << out.flush() << "\n";
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "generate: %lld tokens after a prompt of %zu in %.2f s (%.1f tokens/s)\n",
                 (long long)n, prompt.size(), s, n / s);
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "generate: error: " << e.what() << "\n";
    return 1;
  }
}
