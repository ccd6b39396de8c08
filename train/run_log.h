// ndtrain: what a run leaves behind as it goes: the console's step lines and samples,
// log.metrics (one JSON line per step, evaluation and sample), TensorBoard's event file
// (log.tensorboard) and the history that the report (log.report) is drawn from.
//
//   RunLog log(c, rank, out, /*writes=*/rank == 0 || c.log.metrics_every_rank);
//   log.open(start_step, spans_hosts);          // a resumed run keeps its metrics up to start
//   log.step(step_log);                         // every step
//   log.validation(step, loss); log.sample(step, text);
//   log.report({title, layout, config}, tokens_per_step);  // rank 0: the page, with a summary
//   log.check_complete();                       // a metrics file that failed is an error at the end
//
// A failed write warns once and training goes on (losing the run for a full disk would be
// worse); the metrics' failure is reported again at the end. Rank 0 alone prints, keeps the
// history and writes TensorBoard and the report; log.metrics_every_rank gives every rank
// its own metrics file.
#pragma once

#include <chrono>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>

#include "train/config.h"
#include "train/io/files.h"
#include "train/io/tensorboard.h"
#include "train/report.h"
#include "train/step_log.h"

namespace ndt::dist {
class ParallelModel;
}

namespace ndt::train {

// The start-up lines of what the run trains and what each rank holds: "parameters: ..." (or,
// with LoRA, the frozen base and the adapters of that rank and scale) and, on several ranks,
// the strategy and each rank's bytes.
std::string describe_parameters(const dist::ParallelModel& pm, int world_size, int64_t lora_rank,
                                double lora_scale);

class RunLog {
 public:
  // out: rank 0's console (other ranks pass a stream that drops everything)
  RunLog(const Config& c, int rank, int world_size, std::ostream& out);

  // log.metrics: a new file; or, resuming after step `start`, the file as it stood at the
  // checkpoint (later lines are of steps trained again now, and a line cut short by a crash
  // is damaged: both dropped, said) with this run's lines appended, and the report's history
  // from it. TensorBoard: a new event file, starting at `start`.
  void open(int64_t start, bool spans_hosts);

  // the console every log.every steps, the last, and whenever log.progress_seconds have
  // passed since the last line; the rest always
  void step(const StepLog& s);
  void validation(int64_t step, double loss);
  void sample(int64_t step, const std::string& text);
  void json(const nlohmann::json& j);  // one metrics line

  // Rank 0's report (log.report): info's title, layout and config, a summary of the history.
  void report(ReportInfo info, int64_t tokens_per_step);
  // Throws ndt::Error when a metrics line could not be written.
  void check_complete() const;

 private:
  void scalars(int64_t step, const io::Scalars& values);
  bool lead() const { return rank_ == 0; }

  const Config& c_;
  const int rank_, world_size_;
  std::ostream& out_;
  io::LineWriter metrics_;
  bool metrics_warned_ = false;
  io::EventWriter tensorboard_;
  bool tensorboard_warned_ = false;
  RunHistory history_;                               // rank 0, with log.report
  std::chrono::steady_clock::time_point last_line_;  // the console's last step line
};

}  // namespace ndt::train
