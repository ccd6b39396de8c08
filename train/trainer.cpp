// The training loop: config -> model (described, materialized in flat buffers) -> data ->
// AdamW -> steps with gradient accumulation, clipping, eval, sampling, checkpoints, report.
#include "train/trainer.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "autograd/engine.h"
#include "autograd/node.h"
#include "autograd/ops.h"
#include "models/gpt.h"
#include "optim/adamw.h"
#include "tensor/checked.h"
#include "tensor/cuda/runtime.h"
#include "tensor/threads.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/data.h"
#include "train/files.h"
#include "train/guard.h"
#include "train/report.h"
#include "train/sample.h"
#include "train/vocab.h"

namespace fs = std::filesystem;

namespace ndt::train {
namespace {

using Clock = std::chrono::steady_clock;

std::string human_bytes(double b) {
  char s[32];
  if (b >= 1 << 30)
    std::snprintf(s, sizeof(s), "%.2f GiB", b / (1 << 30));
  else
    std::snprintf(s, sizeof(s), "%.1f MiB", b / (1 << 20));
  return s;
}

std::string human_time(double sec) {
  char s[32];
  const int64_t t = static_cast<int64_t>(sec + 0.5);
  if (t >= 3600)
    std::snprintf(s, sizeof(s), "%lldh%02lldm", (long long)(t / 3600), (long long)(t % 3600 / 60));
  else
    std::snprintf(s, sizeof(s), "%lldm%02llds", (long long)(t / 60), (long long)(t % 60));
  return s;
}

std::string printable(const std::string& s) {
  std::string o;
  for (char c : s) o += c == '\n' ? std::string("\n  ") : std::string(1, c);
  return o;
}

class Trainer {
 public:
  Trainer(const Config& c, std::ostream& out) : c_(c), out_(out) {}
  int run();  // the exit code: 0, or kExitPreempted

 private:
  double evaluate();
  void sample(int64_t step);
  void log_json(const nlohmann::json& j);

  const Config& c_;
  std::ostream& out_;
  Device device_;
  std::unique_ptr<models::GPT> gpt_;
  nn::FlatParams params_;
  std::unique_ptr<optim::AdamW> opt_;
  std::unique_ptr<data::DataLoader> train_, val_;
  std::unique_ptr<data::Vocab> vocab_;
  io::LineWriter metrics_;
  bool metrics_warned_ = false;
  std::unique_ptr<RunLock> lock_;
  LossCurves curves_;
};

void Trainer::log_json(const nlohmann::json& j) {
  if (!metrics_.is_open()) return;
  metrics_.write_line(j.dump());
  if (!metrics_.error().empty() && !metrics_warned_) {  // loud now, an error at the end
    out_ << "warning: " << metrics_.error() << "; no more metrics are written, training goes on" << std::endl;
    metrics_warned_ = true;
  }
}

double Trainer::evaluate() {
  autograd::NoGradGuard no_grad;
  val_->reset();  // the same validation batches every time
  double total = 0;
  for (int64_t i = 0; i < c_.eval_steps; ++i) {
    data::Batch b = val_->next();
    total += gpt_->forward(b.inputs.to(device_), b.targets.to(device_)).loss.item();
  }
  return total / static_cast<double>(c_.eval_steps);
}

void Trainer::sample(int64_t step) {
  if (!vocab_ || c_.sample_length == 0) return;
  std::vector<int32_t> prompt;
  for (uint16_t t : vocab_->encode(c_.prompt)) prompt.push_back(t);
  std::vector<int32_t> ids =
      generate(*gpt_, prompt, c_.sample_length, c_.temperature, c_.top_k, c_.seed + step, device_);
  out_ << "sample at step " << step << ":\n  " << printable(vocab_->decode(ids)) << "\n";
  log_json({{"step", step}, {"sample", vocab_->decode(ids)}});
}

int Trainer::run() {
  // ---- devices and threads
  set_num_threads(c_.threads);
  device_ = Device::parse(c_.device);
  if (device_.is_cuda()) {
    if (!cuda::available())
      throw ConfigError("train.device = " + c_.device + " but no CUDA device is visible" +
                        (cuda::compiled() ? "" : " (this build has no CUDA backend)") +
                        "; use train.device = cpu");
    cuda::set_device(device_.index);
  }
  if (device_.is_cpu())
    out_ << "device: cpu, " << num_threads() << " threads, OpenBLAS kernel " << blas_core() << "\n";
  else
    out_ << "device: " << device_.str() << "\n";
  for (const std::string& w : warnings(c_)) out_ << "warning: " << w << "\n";
  // ---- model: describe, then materialize
  models::GPTConfig mc;
  mc.n_layer = c_.n_layer;
  mc.n_head = c_.n_head;
  mc.n_embd = c_.n_embd;
  mc.vocab_size = c_.vocab_size;
  mc.block_size = c_.block_size;
  mc.vocab_multiple = c_.vocab_multiple;
  try {
    mc.validate();
  } catch (const Error& e) {
    throw ConfigError(e.what());
  }
  // ---- outputs, before any work: writable, and the checkpoint directory ours alone
  check_output_paths(c_);
  if (!c_.ckpt_dir.empty()) {
    lock_ = std::make_unique<RunLock>(c_.ckpt_dir);
    clean_temporaries(c_.ckpt_dir);
  }
  gpt_ = std::make_unique<models::GPT>(mc);
  if (c_.activation_checkpointing) gpt_->add_unit_wrapper(nn::activation_checkpointing());
  int64_t param_count = 0;
  for (const nn::ParamSpec& p : gpt_->parameters())
    param_count = checked_add(param_count, numel_of(p.shape), "parameter count");
  check_fits_in_memory(param_count, device_);
  params_ = nn::materialize(gpt_->units(), device_, DType::f32, c_.seed);
  out_ << "model: " << mc.str() << "\n";
  out_ << "parameters: " << params_.param_count() << " in " << params_.units.size() << " flat buffers:";
  for (const nn::FlatUnit& u : params_.units) out_ << " " << u.name << "=" << u.param_count();
  out_ << "\n";
  if (!c_.init_from.empty()) {
    ckpt::load_weights(c_.init_from, *gpt_, params_);
    out_ << "initialized from " << c_.init_from << "\n";
  }
  // ---- data
  train_ = std::make_unique<data::DataLoader>(c_.train_data, c_.micro_batch_size, c_.seq_len, 0, 1,
                                              c_.shuffle, c_.seed, c_.vocab_size);
  if (!c_.val_data.empty())
    val_ = std::make_unique<data::DataLoader>(c_.val_data, c_.micro_batch_size, c_.seq_len, 0, 1, false,
                                              c_.seed, c_.vocab_size);
  std::string vocab_path = c_.vocab;
  if (vocab_path.empty()) {
    const fs::path guess = fs::path(data::glob_paths(c_.train_data)[0]).parent_path() / "vocab.json";
    if (fs::exists(guess)) vocab_path = guess.string();
  }
  if (!vocab_path.empty()) vocab_ = std::make_unique<data::Vocab>(data::Vocab::load(vocab_path));
  if (vocab_ && vocab_->size() > c_.vocab_size)
    throw ConfigError("the vocabulary " + vocab_path + " has " + std::to_string(vocab_->size()) +
                      " tokens but model.vocab_size is " + std::to_string(c_.vocab_size));
  if (vocab_ && c_.sample_every >= 0 && c_.sample_length > 0) {  // fail now, not after training
    try {
      vocab_->encode(c_.prompt);
    } catch (const Error& e) {
      throw ConfigError("sample.prompt cannot be encoded with " + vocab_path + ": " + e.what());
    }
  }
  const int64_t dp = 1;
  const int64_t tokens_per_step = c_.micro_batch_size * c_.grad_accum_steps * dp * c_.seq_len;
  out_ << "batch: " << c_.micro_batch_size << " x " << c_.grad_accum_steps << " accum x " << dp
       << " data-parallel x " << c_.seq_len << " = " << tokens_per_step << " tokens per step; train data "
       << train_->total_tokens() << " tokens (" << train_->windows_per_epoch()
       << " micro-batches per epoch)\n";
  // ---- optimizer, schedule
  opt_ = std::make_unique<optim::AdamW>(params_,
                                        optim::AdamWConfig{c_.beta1, c_.beta2, c_.eps, c_.weight_decay});
  optim::Schedule sched{optim::Schedule::parse(c_.schedule), c_.lr, c_.min_lr_frac, c_.warmup_steps,
                        c_.steps};
  // ---- resume
  int64_t start = 0;
  if (c_.resume) {
    if (auto latest = ckpt::latest_checkpoint(c_.ckpt_dir)) {
      ckpt::TrainState st = ckpt::load_checkpoint(*latest, *gpt_, params_, *opt_);
      if (st.step > c_.steps)  // going on would save the later weights under an earlier step
        throw ConfigError("checkpoint " + *latest + " is at step " + std::to_string(st.step) +
                          " but train.steps is " + std::to_string(c_.steps) +
                          "; raise train.steps to continue, or use another checkpoint.dir");
      train_->restore(st.loader);
      start = st.step;
      out_ << "resumed from " << *latest << " at step " << start << "\n";
    } else {
      out_ << "no checkpoint in " << c_.ckpt_dir << " yet; starting from scratch\n";
    }
  }
  if (!c_.metrics.empty()) metrics_.open(c_.metrics, /*append=*/start > 0);
  // ---- the loop
  const double flops_per_step = gpt_->flops_per_token(c_.seq_len) * static_cast<double>(tokens_per_step);
  const double peak = c_.peak_tflops > 0 ? c_.peak_tflops * 1e12 : 67e12;
  int64_t saved_step = start;  // the newest step on disk (or where we began)
  auto save = [&](int64_t step) {
    if (c_.ckpt_dir.empty() || (step == saved_step && step > 0 && step != c_.steps)) return;
    ckpt::TrainState st;
    st.step = step;
    st.loader = train_->state();
    st.extra["model"] = mc.str();
    const std::string where = ckpt::save_checkpoint(c_.ckpt_dir, *gpt_, params_, *opt_, st, c_.ckpt_keep);
    saved_step = step;
    out_ << "checkpoint: " << where << std::endl;
  };
  // An evaluation or a sample that fails between steps must not cost the steps since the
  // last checkpoint: save them first, then report the failure.
  auto between_steps = [&](int64_t step, const char* what, auto&& fn) {
    try {
      fn();
    } catch (const std::exception& e) {
      if (c_.ckpt_dir.empty() || step == saved_step) throw;
      save(step);
      throw Error(std::string(what) + " failed at step " + std::to_string(step) +
                  " (checkpoint saved): " + e.what());
    }
  };
  double time_sum = 0;
  int64_t timed = 0;
  double last_val = NAN;
  for (int64_t step = start; step < c_.steps; ++step) {
    if (val_ && c_.eval_every > 0 && step % c_.eval_every == 0) {
      between_steps(step, "evaluation", [&] { last_val = evaluate(); });
      curves_.val.push_back({step, last_val});
      out_ << "step " << step << " | val loss " << last_val << std::endl;
      log_json({{"step", step}, {"val_loss", last_val}});
    }
    if (c_.sample_every > 0 && step > 0 && step % c_.sample_every == 0)
      between_steps(step, "sampling", [&] { sample(step); });

    const auto t0 = Clock::now();
    reset_peak_memory(device_);
    params_.zero_grad();
    double loss_sum = 0;
    for (int64_t micro = 0; micro < c_.grad_accum_steps; ++micro) {
      data::Batch b = train_->next();
      Tensor loss = gpt_->forward(b.inputs.to(device_), b.targets.to(device_)).loss;
      loss_sum += loss.item();
      // mean over micro-batches: each backward adds 1/accum of its gradient
      backward(c_.grad_accum_steps == 1 ? loss : scale(loss, 1.0 / static_cast<double>(c_.grad_accum_steps)));
    }
    const double loss = loss_sum / static_cast<double>(c_.grad_accum_steps);
    const double norm = optim::grad_norm(params_);
    check_step_finite(step + 1, loss, norm);  // a non-finite step is neither applied nor saved
    const double lr = optim::lr_at(step, sched);
    opt_->step(lr, optim::clip_scale(norm, c_.grad_clip));
    if (device_.is_cuda()) cuda::synchronize(device_.index);
    const double sec = std::chrono::duration<double>(Clock::now() - t0).count();
    if (step > start) {  // the first step warms caches
      time_sum += sec;
      ++timed;
    }
    const double avg = timed ? time_sum / timed : sec;
    const double tok_s = static_cast<double>(tokens_per_step) / sec;
    const MemoryStats mem = memory_stats(device_);
    curves_.train.push_back({step, loss});
    if (step % c_.log_every == 0 || step == c_.steps - 1) {
      char line[512];
      const double gflops = flops_per_step / sec / 1e9;
      std::string speed = device_.is_cuda()
                              ? "MFU " + std::to_string(static_cast<int>(100 * gflops * 1e9 / peak)) + "%"
                              : std::to_string(static_cast<int>(gflops)) + " GFLOP/s";
      std::snprintf(line, sizeof(line),
                    "step %5lld/%lld | loss %.4f | lr %.2e | norm %.3f | %.1f ms | %.0f tok/s | %s | mem %s "
                    "(peak %s) | eta %s",
                    (long long)step + 1, (long long)c_.steps, loss, lr, norm, sec * 1e3, tok_s, speed.c_str(),
                    human_bytes(static_cast<double>(mem.in_use)).c_str(),
                    human_bytes(static_cast<double>(mem.peak)).c_str(),
                    human_time(avg * static_cast<double>(c_.steps - step - 1)).c_str());
      out_ << line << std::endl;  // flushed: progress shows through pipes and tee
    }
    log_json({{"step", step + 1},
              {"loss", loss},
              {"lr", lr},
              {"grad_norm", norm},
              {"ms", sec * 1e3},
              {"tokens_per_sec", tok_s},
              {"gflops_per_sec", flops_per_step / sec / 1e9},
              {"mem_in_use", mem.in_use},
              {"mem_peak", mem.peak}});
    if (c_.stop_after > 0 && step + 1 - start == c_.stop_after && step + 1 < c_.steps) {
      save(step + 1);
      out_ << "stopped after " << c_.stop_after
           << " steps (train.stop_after); resume with checkpoint.resume = true\n";
      return 0;
    }
    if (c_.ckpt_every > 0 && (step + 1) % c_.ckpt_every == 0 && step + 1 < c_.steps) save(step + 1);
    if (stop_requested() && step + 1 < c_.steps) {  // preempted: this step is done; save it, go
      save(step + 1);
      out_ << "stopped by signal " << stop_signal() << " after step " << step + 1
           << (c_.ckpt_dir.empty() ? " (no checkpoint.dir: nothing saved)"
                                   : "; resume with checkpoint.resume = true")
           << std::endl;
      return kExitPreempted;
    }
  }
  // ---- the end: checkpoint first (nothing after it may cost the run), eval, sample, report
  if (start < c_.steps || c_.ckpt_every == 0) save(c_.steps);
  if (stop_requested()) {
    out_ << "stopped by signal " << stop_signal() << " after the last step, its checkpoint saved"
         << std::endl;
    return kExitPreempted;
  }
  if (val_) {
    last_val = evaluate();
    curves_.val.push_back({c_.steps, last_val});
    out_ << "final val loss " << last_val << "\n";
    log_json({{"step", c_.steps}, {"val_loss", last_val}});
  }
  if (c_.sample_every >= 0) sample(c_.steps);
  if (timed) {
    const double avg = time_sum / timed;
    out_ << "average " << avg * 1e3 << " ms/step, " << static_cast<double>(tokens_per_step) / avg
         << " tok/s\n";
  }
  if (!c_.report.empty()) {
    std::vector<std::string> summary = {mc.str(), "steps " + std::to_string(c_.steps) + ", " +
                                                      std::to_string(tokens_per_step) + " tokens per step"};
    if (!curves_.train.empty())
      summary.push_back("final train loss " + std::to_string(curves_.train.back().second));
    if (std::isfinite(last_val)) summary.push_back("final val loss " + std::to_string(last_val));
    if (timed)
      summary.push_back("average " + std::to_string(time_sum / timed * 1e3) + " ms/step on " + device_.str());
    write_report(c_.report, "ndtrain: " + mc.str(), curves_, summary);
    out_ << "report: " << c_.report << "\n";
  }
  if (!metrics_.error().empty())
    throw Error(metrics_.error() +
                "; training finished (and its checkpoint is saved) but the metrics are incomplete");
  return 0;
}

}  // namespace

int train_main(int argc, const char* const* argv, std::ostream& out, std::ostream& err) {
  Config c;
  try {
    std::string help;
    if (!parse_config(argc, argv, c, help)) {
      out << help;
      return 0;
    }
    StopSignals signals;  // SIGINT/SIGTERM: finish the step, checkpoint, exit kExitPreempted
    return Trainer(c, out).run();
  } catch (const ConfigError& e) {
    err << "train_gpt: config error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    err << "train_gpt: error: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace ndt::train
