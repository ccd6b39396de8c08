#include "train/run_log.h"

#include <chrono>
#include <sstream>

#include "dist/parallelize.h"
#include "dist/trace.h"
#include "tokenizer/unicode.h"
#include "train/io/format.h"

namespace ndt::train {

std::string describe_parameters(const dist::ParallelModel& pm, int world_size, int64_t lora_rank,
                                double lora_scale) {
  std::ostringstream out;
  const bool lora = !pm.base.units.empty();
  if (lora)
    out << "frozen base: " << pm.base.describe() << "\nLoRA adapters (rank " << lora_rank << ", scale "
        << lora_scale << "), trained: " << pm.params.describe() << "\n";
  else
    out << "parameters: " << pm.params.describe() << "\n";
  const std::string per_rank = io::format_bytes(static_cast<double>(pm.params.shard_bytes() * 2));
  if (world_size > 1 && lora)  // the base: its shard's values alone
    out << "strategy: " << pm.strategy->name() << "; each rank holds "
        << io::format_bytes(static_cast<double>(pm.base.shard_bytes())) << " of the frozen base and "
        << per_rank << " of adapters, their gradients and AdamW moments\n";
  else if (world_size > 1)
    out << "strategy: " << pm.mesh().dims().strategy() << "; each rank holds " << per_rank
        << " of parameters, gradients and AdamW moments\n";
  return out.str();
}
namespace {

std::string num(double v) {
  std::ostringstream o;
  o << v;
  return o.str();
}

// A sample on the console: every line indented under its heading.
std::string printable(const std::string& s) {
  std::string o;
  for (char c : s) o += c == '\n' ? std::string("\n  ") : std::string(1, c);
  return o;
}

}  // namespace

RunLog::RunLog(const Config& c, int rank, int world_size, std::ostream& out)
    : c_(c), rank_(rank), world_size_(world_size), out_(out), last_line_(std::chrono::steady_clock::now()) {}

void RunLog::open(int64_t start, bool spans_hosts) {
  if (!c_.log.metrics.empty() && (lead() || c_.log.metrics_every_rank)) {
    const std::string path = lead() ? c_.log.metrics : dist::trace_path_for_rank(c_.log.metrics, rank_);
    if (start > 0) {
      EarlierMetrics e = read_earlier_metrics(path, start, world_size_, c_.train.steps, spans_hosts);
      if (e.dropped > 0) {
        std::string kept;
        for (const std::string& line : e.lines) kept += line + "\n";
        io::write_file_atomic(path, kept);
        out_ << "metrics: " << path << " as it stood at step " << start << " (" << e.dropped
             << " later or damaged lines dropped), appending\n";
      }
      if (lead() && !c_.log.report.empty()) history_ = std::move(e.history);
    }
    metrics_.open(path, /*append=*/start > 0);
  }
  if (lead() && !c_.log.tensorboard.empty()) {
    tensorboard_.open(c_.log.tensorboard);
    if (start > 0) tensorboard_.write_session_start(start + 1);  // the steps from here on are this run's
    out_ << "tensorboard: " << tensorboard_.path() << " (tensorboard --logdir " << c_.log.tensorboard
         << ")\n";
  }
}

void RunLog::json(const nlohmann::json& j) {
  if (!metrics_.is_open()) return;
  // replace: a sample of a byte-level vocabulary need not be valid UTF-8 (dump would throw)
  metrics_.write_line(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  if (!metrics_.error().empty() && !metrics_warned_) {  // loud now, an error at the end
    out_ << "warning: " << metrics_.error() << "; no more metrics are written, training goes on" << std::endl;
    metrics_warned_ = true;
  }
}

void RunLog::scalars(int64_t step, const io::Scalars& values) {
  if (!tensorboard_.is_open()) return;
  tensorboard_.write_scalars(step, values);
  if (!tensorboard_.error().empty() && !tensorboard_warned_) {
    out_ << "warning: " << tensorboard_.error()
         << "; no more TensorBoard scalars are written, training goes on" << std::endl;
    tensorboard_warned_ = true;
  }
}

void RunLog::step(const StepLog& s) {
  const auto now = std::chrono::steady_clock::now();
  const bool overdue = c_.log.progress_seconds > 0 &&
                       std::chrono::duration<double>(now - last_line_).count() >= c_.log.progress_seconds;
  if (s.step % c_.log.every == 0 || s.step == c_.train.steps - 1 || overdue) {
    out_ << step_line(s) << std::endl;  // flushed: progress shows through pipes and tee
    last_line_ = now;
  }
  json(step_json(s));
  if (lead() && !c_.log.report.empty()) history_.steps.push_back(s);
  scalars(s.step + 1, step_scalars(s));
}

void RunLog::validation(int64_t step, double loss) {
  if (lead() && !c_.log.report.empty()) history_.val.push_back({step, loss});
  json({{"step", step}, {"val_loss", loss}});
  scalars(step, {{"loss/val", loss}});
}

void RunLog::sample(int64_t step, const std::string& text) {
  if (!lead()) return;
  out_ << "sample at step " << step << ":\n  " << printable(text) << "\n";
  json({{"step", step}, {"sample", text}});
  if (!c_.log.report.empty()) history_.samples.push_back({step, text});
  if (tensorboard_.is_open()) {  // as a Markdown code block (every line indented), valid UTF-8
    std::string block = "    ";
    for (char ch : tok::utf8_replace_invalid(text))
      block += ch == '\n' ? std::string("\n    ") : std::string(1, ch);
    tensorboard_.write_text(step, "samples", block);
  }
}

// The report of the steps this process ran (after a resume: those since it, and before
// it what the metrics kept).
void RunLog::report(ReportInfo info, int64_t tokens_per_step) {
  if (!lead() || c_.log.report.empty()) return;
  const std::vector<StepLog>& st = history_.steps;
  if (!st.empty()) {
    info.summary.push_back("steps " + std::to_string(st.front().step + 1) + " to " +
                           std::to_string(st.back().step + 1) + " of " + std::to_string(c_.train.steps) +
                           ", final train loss " + num(st.back().loss));
    if (st.size() > 1) {  // the first step warms caches
      double sec = 0;
      for (size_t i = 1; i < st.size(); ++i) sec += st[i].sec;
      sec /= static_cast<double>(st.size() - 1);
      info.summary.push_back("average " + num(sec * 1e3) + " ms/step, " +
                             num(static_cast<double>(tokens_per_step) / sec) + " tokens/s");
    }
  }
  if (!history_.val.empty())
    info.summary.push_back("validation loss " + num(history_.val.back().second) + " after step " +
                           std::to_string(history_.val.back().first));
  write_report(c_.log.report, info, history_);
  out_ << "report: " << c_.log.report << "\n";
}

void RunLog::check_complete() const {
  if (!metrics_.error().empty())
    throw Error(metrics_.error() +
                "; training finished (and its checkpoint is saved) but the metrics are incomplete");
}

}  // namespace ndt::train
