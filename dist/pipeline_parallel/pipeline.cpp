#include "dist/pipeline_parallel/pipeline.h"

#include <optional>

#include "autograd/defer.h"
#include "autograd/engine.h"
#include "autograd/node.h"
#include "autograd/ops.h"
#include "nn/moe.h"

namespace ndt::dist {
namespace {
std::string name_of(const pp::Action& a, int v) {
  std::string s(1, a.op == pp::Op::kF ? 'F' : a.op == pp::Op::kB ? 'B' : 'W');
  s += std::to_string(a.micro);
  if (v > 1) {
    s += '.';
    s += std::to_string(a.chunk);
  }
  return s;
}
}  // namespace

Pipeline::Pipeline(const models::GPT& gpt, Communicator& pp, Strategy& strategy, pp::Schedule schedule,
                   IoShape io_shape, DType io_dtype, Trace* trace)
    : gpt_(gpt),
      comm_(pp),
      strategy_(strategy),
      schedule_(std::move(schedule)),
      io_shape_(std::move(io_shape)),
      io_dtype_(io_dtype),
      trace_(trace),
      rank_(pp.rank()) {
  NDT_CHECK(schedule_.p == pp.size(), "Pipeline: a schedule for ", schedule_.p, " stages on a pipeline of ",
            pp.size(), " ranks");
  NDT_CHECK(static_cast<int64_t>(gpt.part().chunks.size()) == schedule_.v, "Pipeline: the model part holds ",
            gpt.part().chunks.size(), " chunks, the schedule runs ", schedule_.v, " per rank");
}

// F of stage s > 0 receives the activation from stage s - 1; B of stage s < last the
// gradient from stage s + 1.
int Pipeline::source_of(const pp::Action& a, std::string& what) const {
  const int s = schedule_.stage_of(rank_, a.chunk);
  if (a.op == pp::Op::kF && s > 0) {
    what = "receive the activation of micro-batch " + std::to_string(a.micro) + " from stage " +
           std::to_string(s - 1);
    return rank_of_stage(s - 1);
  }
  if (a.op == pp::Op::kB && s < last_stage()) {
    what = "receive the gradient of micro-batch " + std::to_string(a.micro) + " from stage " +
           std::to_string(s + 1);
    return rank_of_stage(s + 1);
  }
  return -1;
}

StageComm::Layout Pipeline::message(const Tensor& idx) const {
  StageComm::Layout m{{io_shape_(idx), io_dtype_}};
  if (routes_) m.push_back({Shape{2 * gpt_.cfg.n_experts + 4}, DType::f64});  // RouterLoss::totals
  return m;
}

StageComm::Message Pipeline::with_router(const Tensor& t, const Slot& slot) const {
  if (!slot.router) return {t};
  const std::vector<double> v = slot.router->totals();
  return {t, Tensor::from_vector(v, {static_cast<int64_t>(v.size())}).to(t.device())};
}

StageComm::Message Pipeline::act(const pp::Action& a, const Batch& b, const StageComm::Message& in,
                                 bool training, double loss_scale, int& to, std::string& what) {
  to = -1;
  const int s = schedule_.stage_of(rank_, a.chunk);
  const auto key = std::make_pair(a.micro, a.chunk);
  Trace::Scope scope(trace_, name_of(a, schedule_.v), Trace::kCompute);
  if (a.op == pp::Op::kF) {
    Slot slot;
    if (routes_) slot.router = gpt_.router_loss();
    if (s > 0) {
      slot.in = in[0];
      if (training) slot.in.set_requires_grad(true);  // a leaf: its gradient goes back to stage s - 1
      if (routes_) slot.router->carry(in[1].to_vector<double>());  // the earlier stages' layers
    }
    slot.out =
        gpt_.forward_chunk(static_cast<size_t>(a.chunk), b.idx, slot.in, b.targets, 0, b.docs, slot.router);
    StageComm::Message out;
    if (s == last_stage()) {
      losses_.push_back({slot.out.detach(), b.weight});
    } else {
      to = rank_of_stage(s + 1);
      what = "send the activation of micro-batch " + std::to_string(a.micro) + " to stage " +
             std::to_string(s + 1);
      out = with_router(slot.out, slot);
    }
    if (training) live_[key] = std::move(slot);
    return out;
  }
  if (a.op == pp::Op::kW) {  // zero-bubble: the weight gradients its B deferred
    auto it = deferred_.find(key);
    NDT_CHECK(it != deferred_.end(), "Pipeline: ", name_of(a, schedule_.v), " before its backward");
    autograd::DeferredWeightGrads w = std::move(it->second);
    deferred_.erase(it);
    w.run();
    return {};
  }
  auto it = live_.find(key);
  NDT_CHECK(it != live_.end(), "Pipeline: ", name_of(a, schedule_.v), " before its forward");
  Slot slot = std::move(it->second);
  live_.erase(it);
  {
    // a split schedule's B: the input gradients now, the linears' weight gradients queued for W
    std::optional<autograd::DeferredWeightGrads::Scope> defer;
    if (schedule_.split_backward) defer.emplace(deferred_[key]);
    if (const double w = loss_scale * b.weight; s == last_stage()) {
      backward(w == 1.0 ? slot.out : scale(slot.out, w));
    } else {
      if (routes_)
        slot.router->take_totals(in[1].to_vector<double>());  // the whole model's, and d loss / d aux
      backward({slot.out}, {in[0]});                          // d loss / d output, from stage s + 1
    }
  }
  if (s == 0) return {};
  to = rank_of_stage(s - 1);
  what = "send the gradient of micro-batch " + std::to_string(a.micro) + " to stage " + std::to_string(s - 1);
  return with_router(slot.in.grad(), slot);
}

void Pipeline::run(const std::vector<pp::Action>& actions, const std::vector<Batch>& micro, bool training,
                   double loss_scale, const std::function<void(int64_t)>& on_micro) {
  losses_.clear();
  routes_ = training && gpt_.router_loss() != nullptr;
  // the last backward (or weight pass) of each chunk syncs the chunk's units: no gradient
  // reaches them after it in this step
  std::vector<size_t> last_grad(static_cast<size_t>(schedule_.v), actions.size());
  for (size_t i = 0; i < actions.size(); ++i)
    if (actions[i].op != pp::Op::kF) last_grad[static_cast<size_t>(actions[i].chunk)] = i;
  // A micro-step begins before each action but a B that continues its F's (schedule.h),
  // and the F then takes the B's sync.
  auto syncs = [&](size_t i) {
    const size_t j = pp::continues_micro_step(actions, i + 1) ? i + 1 : i;
    return j == last_grad[static_cast<size_t>(actions[j].chunk)];
  };
  // the receive of action i's input (comm.h says when it is posted)
  auto incoming = [&](size_t i) {
    std::string what;
    const int from = source_of(actions[i], what);
    return comm_.post_recv(message(micro[static_cast<size_t>(actions[i].micro)].idx), from, what);
  };
  const bool ahead = comm_.posts_ahead();
  StageComm::Incoming next = actions.empty() ? StageComm::Incoming{} : incoming(0);
  for (size_t i = 0; i < actions.size(); ++i) {
    const pp::Action& a = actions[i];
    if (on_micro) on_micro(a.micro);
    const StageComm::Message received = comm_.wait(next);
    if (ahead && i + 1 < actions.size()) next = incoming(i + 1);  // runs under this action
    if (training && !pp::continues_micro_step(actions, i)) strategy_.begin_micro(syncs(i));
    int to = -1;
    std::string what_out;
    const StageComm::Message out =
        act(a, micro[static_cast<size_t>(a.micro)], received, training, loss_scale, to, what_out);
    if (training && a.op != pp::Op::kF) strategy_.end_micro();
    if (ahead) {
      comm_.send(out, to, what_out);
    } else if (i + 1 < actions.size()) {  // NCCL: this output goes and the next input comes as one group
      std::string what_in;
      const int from = source_of(actions[i + 1], what_in);
      next = comm_.exchange(out, to, what_out, message(micro[static_cast<size_t>(actions[i + 1].micro)].idx),
                            from, what_in);
    } else {
      comm_.send(out, to, what_out);
    }
  }
  comm_.wait_sent();
  NDT_CHECK(live_.empty() && deferred_.empty(), "Pipeline: ", live_.size(),
            " forwards without their backward and ", deferred_.size(),
            " backwards without their weight pass at the end of the step");
}

double Pipeline::sum_losses() {
  double sum = 0;
  for (const auto& [l, w] : losses_)
    sum += w * l.item();  // the host waits for the device once per loss, at the end
  losses_.clear();
  // only the last stage has losses: the others add nothing
  return comm_.group().all_reduce_scalar(sum, ReduceOp::kSum);
}

double Pipeline::train(const std::vector<Batch>& micro, double loss_scale,
                       const std::function<void(int64_t)>& on_micro) {
  NDT_CHECK(static_cast<int>(micro.size()) == schedule_.m, "Pipeline: ", micro.size(),
            " micro-batches for a schedule of ", schedule_.m);
  run(schedule_.ranks[static_cast<size_t>(rank_)], micro, /*training=*/true, loss_scale, on_micro);
  return sum_losses();
}

// Each micro-batch through every chunk in turn: F(j, 0), F(j, 1), ... for j = 0, 1, ...
double Pipeline::evaluate(const std::vector<Batch>& micro) {
  autograd::NoGradGuard no_grad;
  std::vector<pp::Action> actions;
  for (int j = 0; j < static_cast<int>(micro.size()); ++j)
    for (int c = 0; c < schedule_.v; ++c) actions.push_back({pp::Op::kF, j, c});
  run(actions, micro, /*training=*/false, 1.0, {});
  return sum_losses();
}

Tensor Pipeline::next_token_logits(const Tensor& idx, int64_t pos_offset) {
  autograd::NoGradGuard no_grad;
  const int B = static_cast<int>(idx.size(0));
  routes_ = false;
  const StageComm::Layout io = message(idx);
  Tensor x, logits = Tensor::empty({B, gpt_.cfg.padded_vocab()}, DType::f32, comm_.group().device());
  for (int c = 0; c < schedule_.v; ++c) {
    const int s = schedule_.stage_of(rank_, c);
    StageComm::Incoming incoming;
    if (s > 0)
      incoming = comm_.post_recv(io, rank_of_stage(s - 1),
                                 "receive the activation of the sample from stage " + std::to_string(s - 1));
    const StageComm::Message got = comm_.wait(incoming);
    const Tensor in = got.empty() ? Tensor() : got[0];
    if (s == last_stage()) {
      logits.copy_(gpt_.next_token_logits_chunk(static_cast<size_t>(c), idx, in, pos_offset).to(DType::f32));
    } else {
      x = gpt_.forward_chunk(static_cast<size_t>(c), idx, in, Tensor(), pos_offset);
      comm_.send({x}, rank_of_stage(s + 1),
                 "send the activation of the sample to stage " + std::to_string(s + 1));
    }
  }
  comm_.wait_sent();
  comm_.group().broadcast(logits, rank_of_stage(last_stage()))->wait();
  return logits;
}

}  // namespace ndt::dist
