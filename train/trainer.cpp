// The training run: setup (devices, the mesh of ranks) -> describe (the model's parameters
// as names and global shapes, and the layout's plan: dist::plan_layout) -> parallelize
// (every parallel dimension in order, then this rank's shards: dist/parallelize.h) ->
// materialize (weights, data, AdamW, resume) -> the loop (each step's micro-batches through
// ParallelModel::train, whatever the layout; clipping, eval, sampling, checkpoints), then the
// report.
#include "train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <iostream>
#include <memory>
#include <thread>

#include "autograd/node.h"
#include "dist/comm/mpi.h"
#include "dist/comm/nccl.h"
#include "dist/mesh.h"
#include "dist/parallelize.h"
#include "dist/trace.h"
#include "models/gpt.h"
#include "optim/adamw.h"
#include "tensor/checked.h"
#include "tensor/cpu/onednn_gemm.h"
#include "tensor/cuda/runtime.h"
#include "tensor/threads.h"
#include "train/agree.h"
#include "train/checkpoint/checkpoint.h"
#include "train/checkpoint/load.h"
#include "train/checkpoint/lora.h"
#include "train/checkpoint/whole.h"
#include "train/data/data.h"
#include "train/data/preparation.h"
#include "train/data/text.h"
#include "train/io/files.h"
#include "train/io/format.h"
#include "train/planner/block_kinds.h"
#include "train/planner/cluster.h"
#include "train/report.h"
#include "train/run_log.h"
#include "train/samples.h"

namespace ndt::train {
namespace {

using Clock = std::chrono::steady_clock;

// A stream that drops everything: the output of ranks other than 0.
class NullBuffer : public std::streambuf {
 protected:
  int overflow(int c) override { return c; }
};

// The training run in five phases (run()): setup -> describe -> parallelize ->
// materialize -> loop. Rank 0 prints and writes the logs; every rank trains.
class Trainer {
 public:
  Trainer(const Config& c, std::shared_ptr<dist::Communicator> world, std::ostream& out, Watchdog& watchdog,
          dist::FlightRecorder& flight)
      : c_(c),
        world_(std::move(world)),
        out_(world_->rank() == 0 ? out : null_out_),
        log_(c, world_->rank(), world_->size(), out_),
        watchdog_(watchdog),
        flight_(flight) {}
  int run() {
    setup();
    describe();
    parallelize();
    materialize();
    return loop();
  }

 private:
  void setup();      // devices, threads, the mesh, outputs and the checkpoint lock
  bool open_mesh();  // setup's mesh: true when the collectives go over NCCL
  void print_setup(bool nccl);
  void claim_outputs();  // setup's output checks and checkpoint lock
  void open_flight_record();
  void describe();     // the model as a description: names, global shapes, init rules
  void parallelize();  // every parallel dimension, and this rank's memory (dist/parallelize.h)
  void materialize();  // weights (init_from), data, optimizer, resume
  void open_data();
  void open_vocabulary();
  void open_optimizer();
  int loop();  // the steps, with evaluation, samples and checkpoints; then the end

  // the loop's parts
  // one optimizer step, timed: its loss, norm, lr, time, bytes (this rank's, under the ring
  // model: dist/comm) and memory; log_step adds the run's figures and logs it
  StepLog step_and_time(int64_t step);
  void log_step(int64_t step, StepLog s, double avg_sec);
  // Work between steps that may fail on one rank: every rank learns it, the steps done are
  // saved, then the run ends naming what failed.
  void between_steps(int64_t step, const char* what, const std::function<void()>& local_fn);
  [[noreturn]] void saved_then_fail(int64_t step, const std::string& what, bool failed_here,
                                    const std::string& err);
  double evaluation(int64_t step);  // the validation loss (collective), logged
  void sampling(int64_t step);
  int stopped(int64_t step, int sig);           // a stop signal after `step`: save, exit code
  int finish(double last_val, double avg_sec);  // after the last step: save, eval, sample, report

  double train_step(int64_t step);  // one optimizer step on batches_; returns the mean loss
  std::string read_batches();       // the next step's micro-batches into batches_; "" or the error
  std::vector<data::Batch> read_val_batches();         // this rank's evaluation batches (no collective)
  std::vector<int32_t> generate_sample(int64_t step);  // collective under FSDP and TP
  void save(int64_t step);
  void resume_from(const std::string& path);
  void write_report();  // rank 0, log.report
  void write_trace();
  static std::vector<dist::ParallelModel::Batch> whole_sequences(const std::vector<data::Batch>& batches);
  bool lead() const { return world_->rank() == 0; }
  // tokens per micro-step over the data-parallel ranks: the loader's unit of position
  int64_t window_tokens() const { return c_.train.micro_batch_size * dims_.dp() * c_.train.seq_len; }
  // What decides the last bits of the numbers: a resume elsewhere continues, not bit for bit.
  std::string compute_identity() const {
    return device_.is_cpu() ? "cpu, " + cpu::gemm_libraries() : device_.str();
  }

  const Config& c_;
  std::shared_ptr<dist::Communicator> world_;
  NullBuffer null_buf_;
  std::ostream null_out_{&null_buf_};
  std::ostream& out_;
  ckpt::PruneLog prune_log_{&out_};  // old checkpoints that checkpoint.keep could not delete
  Device device_;
  dist::ParallelDims dims_;
  dist::PipelineLayout layout_;  // planned for the model (dist::plan_layout): the blocks, the step's schedule
  std::unique_ptr<dist::DeviceMesh> mesh_;
  std::string gpu_name_;            // the driver's name of this rank's GPU ("" on CPU)
  double peak_flops_ = 0;           // its dense peak FLOP/s for the training dtype (0: not known, no MFU)
  int64_t across_hosts_timed_ = 0;  // this rank's bytes to other hosts over the timed steps
  std::unique_ptr<dist::Trace> trace_;
  models::GPTConfig mc_;
  std::unique_ptr<models::GPT> gpt_;
  ckpt::WeightSource init_from_;  // model.init_from, opened once (describe checks it, materialize reads it)
  std::unique_ptr<dist::ParallelModel> pm_;  // this rank's buffers, the strategy, the layout's answers
  std::unique_ptr<optim::AdamW> opt_;
  optim::Schedule sched_;
  double lr_ = 0;  // optim.lr after lr_scaling
  std::unique_ptr<data::DataLoader> train_, val_;
  std::unique_ptr<data::TextCodec> vocab_;
  ckpt::TokenizerFiles tokenizer_;  // what the checkpoints carry of the run's tokenizer
  int64_t tokens_per_step_ = 0, start_ = 0, saved_step_ = 0;
  RunLog log_;  // the console's steps and samples, log.metrics, TensorBoard, the report
  std::unique_ptr<RunLock> lock_;
  Watchdog& watchdog_;
  dist::FlightRecorder& flight_;  // the step each collective belongs to
  // the next step's micro-batches, read ahead so that a failed read is agreed on by every
  // rank before any collective; batches_from_ is the loader's position before them
  std::vector<data::Batch> batches_;
  data::LoaderState batches_from_;
};

// ---- phase 1: setup ----------------------------------------------------------------

void Trainer::setup() {
  // every rank started with the same config and sees the same data (a stale gpt.ini on one
  // node would train silently wrong, or hang): checked before anything depends on it
  check_same_config(c_, *world_);
  // devices: one process per GPU, the GPU chosen by the rank's place on its node
  device_ = open_device(c_, world_->size());
  if (device_.is_cuda()) {
    // MFU's denominator: one device's dense peak for the training dtype
    gpu_name_ = cuda::device_name(device_.index);
    peak_flops_ =
        1e12 * (c_.log.peak_tflops > 0 ? c_.log.peak_tflops
                                       : device_peak_tflops(gpu_name_, c_.train.dtype, c_.train.tf32));
  }
  // threads: this rank's share of the node's cores (train.threads = 0)
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  set_num_threads(c_.train.threads > 0 ? c_.train.threads
                                       : std::max(1, cores / std::max(1, dist::local_size())));
  const bool nccl = open_mesh();
  print_setup(nccl);
  claim_outputs();
  world_->barrier();  // every rank's checks passed
  open_flight_record();
}

// From here on a failure leaves this job's flight records (dist/flight.h), and only its:
// rank 0, which holds the checkpoint directory's lock, removes the records of earlier jobs.
void Trainer::open_flight_record() {
  if (lead()) remove_flight_records(c_);
  flight_.set_job(agree_on_job_id(*world_));
}

// The mesh: dp_replicate x dp_shard x cp x tp ranks, a communicator per dimension. Returns
// whether the collectives go over NCCL.
bool Trainer::open_mesh() {
  // every rank finds the same error in the same sizes: rank 0 says it once, no rank aborts
  std::string error;
  try {
    dims_ = dist::ParallelDims::resolve(c_.parallel, world_->size());
  } catch (const Error& e) {
    error = e.what();
  }
  agree_on_start(error, *world_);
  std::shared_ptr<dist::Communicator> world = world_;
  const bool nccl = c_.parallel.backend == "nccl" ||
                    (c_.parallel.backend == "auto" && device_.is_cuda() && world_->size() > 1);
  if (nccl)  // a missed deadline is found by NCCL's watch thread: the same line, record and exit code
    world = dist::nccl_communicator(world_, device_.index, end_job_on_missed_deadline(*world_, watchdog_));
  mesh_ = std::make_unique<dist::DeviceMesh>(dims_, world);  // collective: it learns every rank's host
  flight_.set_hosts(mesh_->hosts());
  if (!c_.log.trace.empty()) {
    trace_ = std::make_unique<dist::Trace>(world_->rank());
    for (dist::Communicator* comm : mesh_->all()) comm->set_trace(trace_.get());
  }
  return nccl;
}

void Trainer::print_setup(bool nccl) {
  if (device_.is_cpu())
    out_ << "device: cpu, " << num_threads() << " threads per rank, " << cpu::gemm_libraries() << "\n";
  else
    out_ << "device: " << device_.str()
         << (world_->size() > 1 ? " (rank 0; cuda:<local rank> on every rank)" : "")
         << (c_.train.dtype == "float32" ? (c_.train.tf32 ? ", float32 GEMMs in TF32" : ", strict float32")
                                         : "")
         << (nccl ? ", collectives over NCCL" : "") << "\n"
         << mfu_peak_line(gpu_name_, peak_flops_, c_.train.dtype) << "\n";
  if (world_->size() > 1) out_ << mesh_->describe();
  if (mesh_ && mesh_->spans_hosts())
    if (const std::string note = launcher_keepalive_note(c_.parallel.timeout_s); !note.empty())
      out_ << "note: " << note << "\n";
  for (const std::string& w : warnings(c_)) out_ << "warning: " << w << "\n";
  if (!c_.lora.taken.empty()) out_ << c_.lora.taken << "\n";
}

// Outputs, before any work: writable, and the checkpoint directory ours alone.
void Trainer::claim_outputs() {
  check_output_paths(c_, world_->rank());
  if (lead() && !c_.checkpoint.dir.empty()) {
    lock_ = std::make_unique<RunLock>(c_.checkpoint.dir);
    clean_temporaries(c_.checkpoint.dir);
  }
  if (lead()) check_no_earlier_run(c_);
  // every rank that writes (sharded: the first replica's) or reads the checkpoints must see
  // rank 0's directory: found now, not at the first save after hours of training
  // (LoRA: rank 0 writes the adapters, whole, in either format)
  const bool sharded = c_.checkpoint.format == "sharded" && !c_.lora.on();
  check_checkpoint_dir_shared(c_, ckpt::writes_checkpoints(sharded, *mesh_), *world_);
}

// ---- phase 2: describe -------------------------------------------------------------

void Trainer::describe() {
  mc_ = c_.model;  // [model] is a GPTConfig (and init_from)
  // the model, and how the layout splits it (TP's heads, key/value heads, MLP units and
  // vocabulary; CP's and sequence parallelism's tokens), before anything is allocated. Every
  // rank finds the same error in the same config: rank 0 says it once, and no rank aborts
  std::string error;
  try {
    mc_.validate();
    layout_ = dist::plan_layout(mc_, dims_, c_.parallel, c_.train.seq_len, c_.train.grad_accum_steps,
                                block_cost(mc_, c_.train.seq_len));
  } catch (const Error& e) {
    error = e.what();
  }
  agree_on_start(error, *world_);
  // names, global shapes, init rules; no memory yet: only the part of the model this rank
  // holds in the layout (dist::model_part)
  if (const std::string line = layout_.describe(); !line.empty()) out_ << line << "\n";
  gpt_ = std::make_unique<models::GPT>(mc_, dist::model_part(layout_, *mesh_));
  if (c_.lora.on()) {  // the adapters on the linears lora.targets names (nn/lora.h)
    try {
      gpt_->add_lora(c_.lora);
      const int64_t tokens = c_.train.micro_batch_size * c_.train.seq_len;  // a rank's per micro-step
      gpt_->lora_dropout->place(c_.train.seed, mesh_->dp_rank() * tokens);  // lora.dropout's mask
    } catch (const Error& e) {
      error = e.what();
    }
    agree_on_start(error, *world_);
  }
  if (!c_.model.init_from.empty()) {  // its tensors against the model, before anything is allocated
    init_from_ = c_.model.init_source ? *c_.model.init_source : ckpt::find_weights(c_.model.init_from);
    ckpt::check_weights(init_from_, *gpt_);
  }
  int64_t param_count = 0;
  for (const nn::ParamSpec& p : gpt_->parameters())
    param_count = checked_add(param_count, numel_of(p.shape), "parameter count");
  check_fits_in_memory(param_count / dims_.fsdp(), device_);  // this rank's share
  out_ << "model: " << mc_.str() << "\n";
}

// ---- phase 3: parallelize ----------------------------------------------------------

void Trainer::parallelize() {
  // every dimension, in order: TP, CP, activation checkpointing, this rank's memory, FSDP/DP
  // (the layout was checked against the model in describe)
  const bool bf16 = c_.train.dtype == "bfloat16";
  dist::ParallelizeOptions o;
  o.device = device_;
  o.seed = static_cast<uint64_t>(c_.train.seed);  // the counter-based RNG: the same numbers on every layout
  if (bf16) o.compute_dtype = DType::bf16;        // mixed precision: an f32 master, bf16 copies
  if (bf16 && c_.parallel.reduce_dtype == "bfloat16") o.reduce_dtype = DType::bf16;
  o.seq_len = c_.train.seq_len;
  o.sequence_parallel = c_.parallel.sequence_parallel;
  o.reshard_after_forward = c_.parallel.reshard_after_forward;
  o.ac = ac_mode(c_.train);
  o.ac_every = c_.train.ac_every;
  o.trace = trace_.get();
  o.layout = layout_;
  pm_ = dist::parallelize(*gpt_, *mesh_, o);
  if (o.ac != nn::ACMode::none)
    out_ << "activation checkpointing: " << nn::describe_checkpointing(o.ac, c_.train.ac_every) << "\n";
  out_ << describe_parameters(*pm_, world_->size(), c_.lora.rank, c_.lora.scale());
}

// ---- phase 4: materialize ----------------------------------------------------------

void Trainer::materialize() {
  out_ << ckpt::load_start_weights(init_from_, c_.model.init_from, c_.lora.init_from, *gpt_,
                                   pm_->model_params(), pm_->params, lead() ? &std::cerr : nullptr);
  // what materializing (and loading) cost in resident memory, on the rank that paid most:
  // random init and loading must both stay near the rank's shards, never the whole model
  if (const int64_t hwm = peak_resident_bytes(); hwm > 0)
    out_ << "resident memory after materialize: peak "
         << io::format_bytes(world_->all_reduce_scalar(static_cast<double>(hwm), dist::ReduceOp::kMax))
         << " (the largest rank's VmHWM)\n";
  open_data();
  open_vocabulary();
  open_optimizer();
  // resume: the newest checkpoint, written by any layout
  if (c_.checkpoint.resume) {
    if (auto latest = ckpt::latest_checkpoint(c_.checkpoint.dir)) {
      resume_from(*latest);
      world_->barrier();  // said once every rank has loaded its part (a rank that failed ends the job)
      out_ << "resumed from " << *latest << " at step " << start_ << "\n";
    } else {
      out_ << "no checkpoint in " << c_.checkpoint.dir << " yet; starting from scratch\n";
    }
  }
  saved_step_ = start_;
  log_.open(start_, mesh_->spans_hosts());
}

// Rank r of the dp ranks reads its own micro-batches; tp and cp ranks share them.
void Trainer::open_data() {
  const int dp_rank = static_cast<int>(mesh_->dp_rank()), dp = static_cast<int>(dims_.dp());
  // train and val shards of one preparation (each loader checks its own)
  data::preparation_of(c_.data.train, c_.data.val);
  train_ = std::make_unique<data::DataLoader>(c_.data.train, c_.train.micro_batch_size, c_.train.seq_len,
                                              dp_rank, dp, c_.data.shuffle,
                                              static_cast<uint64_t>(c_.train.seed), c_.model.vocab_size);
  if (!c_.data.val.empty())
    val_ = std::make_unique<data::DataLoader>(c_.data.val, c_.train.micro_batch_size, c_.train.seq_len,
                                              dp_rank, dp, false, static_cast<uint64_t>(c_.train.seed),
                                              c_.model.vocab_size);
  train_->set_grad_accum(c_.train.grad_accum_steps);  // packed rows: an epoch of whole steps
}

// The vocabulary of the samples' text (train/samples.h), and the tokenizer the checkpoints carry.
void Trainer::open_vocabulary() {
  vocab_ = open_sample_vocabulary(c_, out_);
  // the tokenizer the checkpoints carry (every rank reads it alike; an unreadable file is one error)
  std::string error, note;
  try {
    tokenizer_ = ckpt::run_tokenizer(vocab_ ? vocab_->source() : "",
                                     c_.model.init_from.empty() ? nullptr : &init_from_, &note);
  } catch (const Error& e) {
    error = e.what();
  }
  agree_on_start(error, *world_);
  if (!note.empty()) out_ << "note: " << note << "\n";
  if (vocab_) check_sample_prompt(c_, *vocab_);  // fail now, not after training
}

// The effective batch (micro x accum x dp_replicate x dp_shard sequences), AdamW on this
// rank's shards, and the learning rate and schedule for that batch.
void Trainer::open_optimizer() {
  const int64_t dp = dims_.dp();
  const int64_t seqs =
      checked_mul(checked_mul(c_.train.micro_batch_size, c_.train.grad_accum_steps, "batch"), dp, "batch");
  tokens_per_step_ = checked_mul(seqs, c_.train.seq_len, "tokens per step");
  out_ << "batch: " << c_.train.micro_batch_size << " sequences x " << c_.train.grad_accum_steps
       << " accumulation x " << dp << " data-parallel = " << seqs << " sequences = " << tokens_per_step_
       << " tokens per step; train data " << train_->total_tokens() << " tokens ("
       << train_->windows_per_epoch() << " micro-steps of " << c_.train.micro_batch_size * dp
       << " sequences per epoch)\n";
  if (train_->has_documents())
    out_ << data::packing_line(train_->packing(), tokens_per_step_ / c_.train.seq_len, c_.train.seq_len)
         << "\n";
  // the optimizer on this rank's shards, and the learning rate for this batch
  opt_ = std::make_unique<optim::AdamW>(pm_->params, c_.optim /* an AdamWConfig */);
  lr_ = optim::scaled_lr(c_.optim.lr, c_.optim.lr_scaling, seqs, c_.optim.lr_base_batch);
  if (c_.optim.lr_scaling != "none")
    out_ << "lr: " << c_.optim.lr << " x " << (c_.optim.lr_scaling == "linear" ? "" : "sqrt") << "(" << seqs
         << " / " << c_.optim.lr_base_batch << ") = " << lr_ << " (optim.lr_scaling = " << c_.optim.lr_scaling
         << ")\n";
  sched_ = optim::Schedule{optim::Schedule::parse(c_.optim.schedule), lr_, c_.optim.min_lr_frac,
                           c_.optim.warmup_steps, c_.train.steps};
}

void Trainer::resume_from(const std::string& path) {
  // one warning, not one per rank
  ckpt::TrainState st = ckpt::resume_run(path, mc_, *gpt_, *pm_, *opt_, lead() ? &std::cerr : nullptr);
  ckpt::carry_tokenizer(tokenizer_, st.tokenizer);  // what the run knew before goes on
  if (st.step > c_.train.steps)  // going on would save the later weights under an earlier step
    throw ConfigError("checkpoint " + path + " is at step " + std::to_string(st.step) +
                      " but train.steps is " + std::to_string(c_.train.steps) +
                      "; raise train.steps to continue, or use another checkpoint.dir");
  if (auto it = st.extra.find("compute"); it != st.extra.end() && it->second != compute_identity())
    out_ << "note: the checkpoint was computed with " << it->second << ", this run with "
         << compute_identity() << ": the losses continue, but not bit for bit\n";
  std::string note;
  try {
    st.loader = data::continue_loader(*train_, st.loader, st.extra, c_.train.micro_batch_size * dims_.dp(),
                                      window_tokens(), c_.data.shuffle, note);
  } catch (const Error& e) {
    throw Error("checkpoint " + path + ": " + e.what());
  }
  if (!note.empty()) out_ << "warning: " << note << "\n";
  train_->restore(st.loader);
  start_ = st.step;
}

void Trainer::save(int64_t step) {
  if (c_.checkpoint.dir.empty() || (step == saved_step_ && step > 0 && step != c_.train.steps)) return;
  watchdog_.beat();  // a long write is progress, not a hang
  ckpt::TrainState st;
  st.step = step;
  // the position of the step after `step`: before the batches read ahead for it, if any
  st.loader = batches_.empty() ? train_->state() : batches_from_;
  st.extra["model"] = mc_.str();
  st.extra["layout"] = dims_.str();
  st.extra.merge(
      data::loader_extra(*train_, st.loader, c_.train.micro_batch_size * dims_.dp(), window_tokens()));
  st.extra["compute"] = compute_identity();  // a resume on other kernels is not bit-exact: said then
  if (gpt_->has_lora())  // the [lora] settings and the base (export_weights' PEFT folder and merge)
    st.extra.merge(ckpt::lora_metadata(
        *gpt_, std::filesystem::absolute(c_.model.init_from).lexically_normal().string()));
  st.tokenizer = tokenizer_;
  const bool sharded = c_.checkpoint.format == "sharded" && !gpt_->has_lora();  // LoRA: the adapters, whole
  const std::string where =
      ckpt::save_run(c_.checkpoint.dir, sharded, c_.checkpoint.keep, st, mc_, *pm_, *opt_,
                     &prune_log_);  // collective
  saved_step_ = step;
  out_ << "checkpoint: " << where << (sharded ? " (sharded)" : "") << std::endl;
}

void Trainer::write_trace() {
  if (!trace_) return;
  const std::string path = dist::trace_path_for_rank(c_.log.trace, world_->rank());
  io::write_file_atomic(path, trace_->to_json());
  out_ << "trace: " << path << (world_->size() > 1 ? " (and one per rank)" : "") << "\n";
}

// ---- phase 5: the loop --------------------------------------------------------------

std::vector<data::Batch> Trainer::read_val_batches() {
  val_->reset();  // the same validation batches every time
  std::vector<data::Batch> batches;
  for (int64_t i = 0; i < c_.train.eval_steps; ++i) batches.push_back(val_->next());
  return batches;
}

std::vector<dist::ParallelModel::Batch> Trainer::whole_sequences(const std::vector<data::Batch>& batches) {
  std::vector<dist::ParallelModel::Batch> out;
  for (const data::Batch& b : batches) out.push_back({b.inputs, b.targets, b.docs});
  return out;
}

std::vector<int32_t> Trainer::generate_sample(int64_t step) {
  if (!vocab_ || c_.sample.length == 0) return {};
  // every rank draws the same tokens: under FSDP or TP each takes part in the collectives,
  // and otherwise no rank waits in the next collective while rank 0 alone samples (a sample
  // longer than parallel.timeout_s would end a healthy job)
  return pm_->generate(vocab_->encode_prompt(c_.sample.prompt), sample_options(c_, step, *vocab_));
}

std::string Trainer::read_batches() {
  batches_from_ = train_->state();
  batches_.clear();
  try {
    for (int64_t micro = 0; micro < c_.train.grad_accum_steps; ++micro) batches_.push_back(train_->next());
  } catch (const std::exception& e) {
    train_->restore(batches_from_);
    batches_.clear();
    return e.what();
  }
  return "";
}

double Trainer::train_step(int64_t step) {
  NDT_CHECK(static_cast<int64_t>(batches_.size()) == c_.train.grad_accum_steps, "train_step: step ", step + 1,
            " has ", batches_.size(),
            " micro-batches read ahead, not train.grad_accum_steps = ", c_.train.grad_accum_steps);
  const std::vector<data::Batch> batches = std::move(batches_);
  batches_.clear();
  const int64_t accum = c_.train.grad_accum_steps;
  int64_t actions = 0;  // the schedule's forwards and backwards on this rank, in order
  nn::LoraDropoutStep dropout(gpt_->lora_dropout.get(), step);  // lora.dropout: on for these only
  const double loss = pm_->train(whole_sequences(batches), [&](int64_t micro) {
    flight_.set_micro(micro, accum);
    dropout.set_micro(micro);
    if (step + 1 == c_.parallel.fail_at_step && ++actions == 2 && world_->rank() == c_.parallel.fail_rank)
      throw Error("parallel.fail_at_step = " + std::to_string(step + 1) +
                  ": failing on purpose in the middle of the step (a rehearsal)");
  });
  flight_.set_micro(-1, accum);  // the gradient norm, the optimizer
  return loss;
}

// A failure between steps (reading evaluation or training data, printing a sample) must
// not cost the steps since the last checkpoint: save them first, then report it. Such work
// is rank-local (no collective inside), so that every rank can first learn whether any
// rank failed and all of them save together: a rank saving alone, or one leaving for the
// agreement while the others are inside the evaluation's collectives, would wait forever.
void Trainer::saved_then_fail(int64_t step, const std::string& what, bool failed_here,
                              const std::string& err) {
  const std::string why = failed_here ? err : "it failed on another rank";
  if (c_.checkpoint.dir.empty() || step == saved_step_)
    throw Error(what + " failed at step " + std::to_string(step) + ": " + why);
  save(step);
  throw Error(what + " failed at step " + std::to_string(step) + " (checkpoint saved): " + why);
}

void Trainer::between_steps(int64_t step, const char* what, const std::function<void()>& local_fn) {
  if (const LocalWork w = agree_on_local_work(local_fn, *world_); w.failed_anywhere)
    saved_then_fail(step, what, w.failed_here, w.error);
}

double Trainer::evaluation(int64_t step) {
  std::vector<data::Batch> batches;
  between_steps(step, "evaluation", [&] { batches = read_val_batches(); });
  const double loss = pm_->evaluate(whole_sequences(batches));  // collective: every rank has its batches
  log_.validation(step, loss);
  return loss;
}

void Trainer::sampling(int64_t step) {
  const std::vector<int32_t> ids = generate_sample(step);  // collective under FSDP and TP
  between_steps(step, "sampling", [&] {
    if (vocab_ && c_.sample.length > 0) log_.sample(step, vocab_->decode(ids));
  });
}

StepLog Trainer::step_and_time(int64_t step) {
  const auto t0 = Clock::now();
  reset_peak_memory(device_);
  const int64_t bytes0 = pm_->bytes_sent(), across0 = pm_->bytes_across_hosts();
  StepLog r;
  r.loss = train_step(step);
  r.aux_loss = pm_->aux_loss(), r.z_loss = pm_->z_loss();
  r.norm = pm_->strategy->grad_norm();  // global: the same number on every rank
  if (step == start_ && !c_.log.grads.empty())
    ckpt::write_whole_grads(c_.log.grads, mc_, *pm_, dims_.str(), *world_);
  check_step_finite(step + 1, r.loss, r.norm);  // a non-finite step is neither applied nor saved
  r.lr = optim::lr_at(step, sched_);
  {
    dist::Trace::Scope s(trace_.get(), "optimizer", dist::Trace::kCompute);
    opt_->step(r.lr, optim::clip_scale(r.norm, c_.optim.grad_clip));
    pm_->params.refresh_compute();  // mixed precision: the bf16 copies of the new parameters
  }
  pm_->strategy->end_step();
  if (device_.is_cuda()) cuda::synchronize(device_.index);
  r.sec = std::chrono::duration<double>(Clock::now() - t0).count();
  r.comm_bytes = pm_->bytes_sent() - bytes0;
  r.across_hosts = pm_->bytes_across_hosts() - across0;
  r.mem = memory_stats(device_);
  return r;
}

void Trainer::log_step(int64_t step, StepLog s, double avg_sec) {
  s.step = step;
  s.steps = c_.train.steps;
  s.tokens = static_cast<double>(tokens_per_step_);
  s.flops = gpt_->flops_per_token(c_.train.seq_len) * s.tokens;
  s.world_size = world_->size();
  s.peak_flops = peak_flops_;
  s.spans_hosts = mesh_->spans_hosts();
  s.eta_sec = avg_sec * static_cast<double>(c_.train.steps - step - 1);
  log_.step(s);
}

int Trainer::stopped(int64_t step, int sig) {
  save(step);         // preempted: this step is done; save it, go
  flight_.retract();  // the watchdog may have written one while a collective was slow
  out_ << "stopped by signal " << sig << " after step " << step
       << (c_.checkpoint.dir.empty() ? " (no checkpoint.dir: nothing saved)"
                                     : "; resume with checkpoint.resume = true")
       << std::endl;
  write_trace();
  try {  // the exit code says "preempted, resume me": a report that cannot be written must not change it
    write_report();
  } catch (const std::exception& e) {
    out_ << "warning: the report was not written: " << e.what() << std::endl;
  }
  return kExitPreempted;
}

int Trainer::loop() {
  // The first step's data, agreed on like every later step's (train_step reads none itself).
  if (start_ < c_.train.steps) {
    const std::string err = read_batches();
    if (agree_at_step_end(!err.empty(), *world_).data_failed)
      saved_then_fail(start_, "reading the training data", !err.empty(), err);
  }
  double time_sum = 0, last_val = NAN;
  int64_t timed = 0;
  for (int64_t step = start_; step < c_.train.steps; ++step) {
    if (val_ && c_.train.eval_every > 0 && step % c_.train.eval_every == 0) {
      last_val = evaluation(step);
      out_ << "step " << step << " | val loss " << last_val << std::endl;
    }
    if (c_.sample.every > 0 && step > 0 && step % c_.sample.every == 0) sampling(step);
    flight_.set_step(step + 1);
    const StepLog r = step_and_time(step);
    if (step > start_) {  // the first step warms caches
      time_sum += r.sec;
      ++timed;
      across_hosts_timed_ += r.across_hosts;
    }
    log_step(step, r, timed ? time_sum / static_cast<double>(timed) : r.sec);
    if (c_.train.stop_after > 0 && step + 1 - start_ == c_.train.stop_after && step + 1 < c_.train.steps) {
      save(step + 1);
      out_ << "stopped after " << c_.train.stop_after
           << " steps (train.stop_after); resume with checkpoint.resume = true\n";
      write_trace();
      write_report();
      return 0;
    }
    if (c_.checkpoint.every > 0 && (step + 1) % c_.checkpoint.every == 0 && step + 1 < c_.train.steps)
      save(step + 1);
    watchdog_.beat();
    if (step + 1 == c_.train.steps) break;
    // the next step's data, and whether any rank was asked to stop: one agreement
    const std::string err = read_batches();
    const StepAgreement next = agree_at_step_end(!err.empty(), *world_);
    if (next.data_failed) saved_then_fail(step + 1, "reading the training data", !err.empty(), err);
    if (next.signal) return stopped(step + 1, next.signal);
  }
  return finish(last_val, timed ? time_sum / static_cast<double>(timed) : NAN);
}

// The end: the checkpoint first (nothing after it may cost the run), then the final
// evaluation, sample and report.
int Trainer::finish(double last_val, double avg_sec) {
  if (start_ < c_.train.steps || c_.checkpoint.every == 0) save(c_.train.steps);
  write_trace();
  if (const int sig = agree_at_step_end(false, *world_).signal) {
    out_ << "stopped by signal " << sig << " after the last step, its checkpoint saved" << std::endl;
    return kExitPreempted;
  }
  // the final evaluation and sample: a failure in them (agreed by every rank) is reported
  // after the report and the metrics are written, never instead of them
  std::string failed;
  try {
    if (val_) {
      last_val = evaluation(c_.train.steps);
      out_ << "final val loss " << last_val << "\n";
    }
    if (c_.sample.every >= 0) sampling(c_.train.steps);
  } catch (const Error& e) {
    failed = e.what();
  }
  if (std::isfinite(avg_sec))
    out_ << "average " << avg_sec * 1e3 << " ms/step, " << static_cast<double>(tokens_per_step_) / avg_sec
         << " tok/s\n";
  if (mesh_->spans_hosts() && std::isfinite(avg_sec) && start_ + 1 < c_.train.steps) {
    // every rank's bytes to other hosts over the timed steps: one sum at the end, none per step
    const double all =
        world_->all_reduce_scalar(static_cast<double>(across_hosts_timed_), dist::ReduceOp::kSum);
    out_ << "across hosts: " << io::format_bytes(all / static_cast<double>(c_.train.steps - start_ - 1))
         << " per step from all ranks (ring model)\n";
  }
  write_report();
  log_.check_complete();
  if (!failed.empty())
    throw Error(failed + " (after the last step: its checkpoint, metrics and report are written)");
  return 0;
}

// The report of the steps this process ran (after a resume: those since it), the layout and
// the config's key values.
void Trainer::write_report() {
  ReportInfo info;
  info.title = "ndtrain: " + mc_.str();
  // the layout as the console names it: every dimension in use ("FSDP + TP", "PP")
  info.layout =
      dims_.str() + " (" + dims_.strategy() + ")" + (mesh_->spans_hosts() ? ", on several hosts" : "");
  info.config = report_config(c_, mc_.str(), device_.str(), tokens_per_step_, lr_, layout_.summary());
  log_.report(info, tokens_per_step_);
}

}  // namespace

int run_trainer(const Config& c, std::shared_ptr<dist::Communicator> world, std::ostream& out,
                Watchdog& watchdog, dist::FlightRecorder& flight) {
  return Trainer(c, std::move(world), out, watchdog, flight).run();
}

}  // namespace ndt::train
