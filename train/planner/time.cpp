// The predicted time of a step (train/planner/time.h): the step replayed on the cluster
// (train/planner/replay.h, on the links and clock of train/planner/timeline.h), then read:
// its parts, the bytes that cross hosts, the bottleneck in words; and the host's shared
// links between hosts (SharedLink), which the replay's timeline sends over.
#include "train/planner/time.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <utility>
#include <vector>

#include "dist/pipeline_parallel/schedule.h"
#include "models/gpt.h"
#include "train/planner/replay.h"
#include "train/planner/shapes.h"
#include "train/planner/timeline.h"

namespace ndt::train {

namespace {

// The step's FLOPs by the model's count (forward and backward, no recomputation) against
// the world's peak
double mfu(const Config& c, const Plan& p, const Cluster& k, double step_s) {
  models::GPTConfig mc = c.model;
  const double model_flops = models::GPT(mc).flops_per_token(p.seq_len) * double(p.tokens);
  return k.peak_flops > 0 ? model_flops / step_s / double(p.dims.world()) / k.peak_flops : 0;
}

// The plan's bytes by where they go: a rank's bytes go to its ring successor (the ring
// model), on another host for its link's cross_share of them; and the dimensions that cross
void count_bytes(const Plan& p, const Links& links, StepTime& t) {
  for (const PlanComm& x : p.comm) {
    const int64_t inter = static_cast<int64_t>(std::llround(double(x.bytes) * links.of(x.dim).cross_share));
    t.bytes_inter += inter;
    t.bytes_intra += x.bytes - inter;
  }
  const std::pair<const char*, const Link*> named[] = {
      {"pp", &links.pp},         {"dp_replicate", &links.replicate},
      {"dp_shard", &links.fsdp}, {"cp", &links.cp},
      {"sp", &links.sp},         {"tp", &links.tp},
      {"ep", &links.ep}};
  for (const auto& [name, l] : named)
    if (l->crosses) t.across_hosts.emplace_back(name);
}

// The bottleneck in words: the largest share of the step
std::string bottleneck(const StepTime& t, const dist::ParallelDims& dims, const Links& links) {
  auto pct = [&](double s) { return static_cast<int>(std::lround(100 * s / t.step_s)); };
  std::string worst_dim;
  double worst = 0;
  for (const auto& [dim, s] : t.exposed_by_dim)
    if (s > worst) worst = s, worst_dim = dim;
  const std::map<std::string, std::string> words = {
      {"fsdp", "FSDP's all-gathers and reduce-scatters"},
      {"replicate", dims.sharded() ? "HSDP's all-reduce of the gradient shards" : "DP's gradient all-reduce"},
      {"tp", "tensor parallelism's all-reduces (each waited for)"},
      {"cp", "ring attention's K/V exchange"},
      {"sp", "Ulysses' all-to-alls (each waited for)"},
      {"pp", "the pipeline's bubble and its messages between stages"},
      {"ep", "expert parallelism's all-to-alls of the routed rows (each waited for)"},
      {"scalars", "the loss and norm all-reduces (latency)"}};
  if (worst > 0.2 * t.step_s)
    return "communication: " + words.at(worst_dim) + " not hidden, " + std::to_string(pct(worst)) +
           "% of the step" + (links.of(worst_dim).crosses ? ", across hosts" : ", inside a host");
  if (t.recompute_s > 0.2 * t.step_s)
    return "recomputation: activation checkpointing's forward again, " + std::to_string(pct(t.recompute_s)) +
           "% of the step";
  const double ew = t.compute_s + t.recompute_s - t.gemm_s;
  return t.gemm_s >= ew
             ? "compute: matrix products, " + std::to_string(pct(t.gemm_s)) + "% of the step"
             : "compute: element-wise passes over memory, " + std::to_string(pct(ew)) + "% of the step";
}

// The stages of a pipeline: each replayed alone, the schedule simulated with their costs.
StepTime predict_pipeline_time(const Config& c, const Plan& p, const Cluster& k) {
  const dist::ParallelDims& D = p.dims;
  const int64_t P = D.pp, V = p.pp_virtual, S = D.stage_size();
  std::vector<StageCosts> costs;
  StepTime t;
  double planned_total = 0;  // the planned stage's replay, all its work and its waits
  int64_t emb_shard = 0;     // the tied embeddings' gradient shard, of the first stage
  for (int64_t s = 0; s < P; ++s) {
    const Plan ps = s == p.stage ? p : plan_stage(c, D.world(), s);
    StepReplay replay(ps, k, shapes_of(ps, c.train.device));
    replay.run();
    costs.push_back(replay.costs());
    if (s == 0) emb_shard = ps.unit_shard_numel.front();
    if (s != p.stage) continue;
    const Timeline& timeline = replay.timeline();
    planned_total = timeline.now();
    t.compute_s = timeline.compute();
    t.recompute_s = timeline.recompute();
    t.gemm_s = timeline.gemm();
    t.exposed_by_dim = timeline.exposed();
    count_bytes(p, replay.links(), t);
  }
  const dist::pp::Schedule schedule =
      dist::pp::make_schedule(dist::pp::parse_kind(p.pp_schedule), static_cast<int>(P),
                              static_cast<int>(p.accum), static_cast<int>(V));
  dist::pp::StageTiming timing;
  for (int64_t vs = 0; vs < P * V; ++vs) {
    const StageCosts& x = costs[static_cast<size_t>(vs % P)];
    const auto chunk = static_cast<size_t>(vs / P);
    timing.stage.push_back(schedule.split_backward
                               ? dist::pp::Timing{x.f[chunk], x.b[chunk] - x.w[chunk], x.w[chunk]}
                               : dist::pp::Timing{x.f[chunk], x.b[chunk], 0.0});
  }
  // every rank of stage `from` sends to the same rank of stage `to` at once: those that leave
  // their host share its links; the slowest pair's time
  auto between = [&](int64_t from, int64_t to, double bytes, bool all_reduce) {
    std::map<int64_t, int64_t> leaving;  // host -> its ranks sending to another host
    for (int64_t i = 0; i < S; ++i)
      if (k.host_of(from * S + i) != k.host_of(to * S + i)) ++leaving[k.host_of(from * S + i)];
    double worst = 0;
    for (int64_t i = 0; i < S; ++i) {
      const Link l = link_between(from * S + i, to * S + i, k, leaving[k.host_of(from * S + i)]);
      if (from != to) t.messages_cross = t.messages_cross || (l.crosses && !all_reduce);
      worst = std::max(worst, all_reduce ? all_reduce_s(bytes, 2, l) : exchange_s(bytes, l));
    }
    return worst;
  };
  for (int64_t vs = 0; vs + 1 < P * V; ++vs)
    timing.hop.push_back(between(vs % P, (vs + 1) % P, double(p.io_bytes), false));
  const dist::pp::Simulation sim = dist::pp::simulate(schedule, timing);
  // each stage's end, the ends after summing the tied embeddings' gradient
  const double tied = c.model.tied() ? between(0, P - 1, double(emb_shard) * 4, true) : 0.0;
  double end = 0;
  for (int64_t s = 0; s < P; ++s)
    end = std::max(end, sim.finish[static_cast<size_t>(s)] + costs[static_cast<size_t>(s)].tail +
                            (s == 0 || s == P - 1 ? tied : 0.0));
  // the loss's sum and the norm's over the stages, which every stage waits for
  const Link pp_link = links_of(D, k).pp;
  t.step_s = end + 2 * all_reduce_s(8, P, pp_link);
  t.exposed_by_dim["pp"] = std::max(0.0, t.step_s - planned_total);
  for (const auto& [dim, s] : t.exposed_by_dim) t.exposed_s += s;
  t.pipeline_s = sim.makespan;
  t.bubble = sim.bubble;
  for (double h : timing.hop) t.message_s = std::max(t.message_s, h);
  t.tokens_per_s = double(p.tokens) / t.step_s;
  t.mfu = mfu(c, p, k, t.step_s);
  t.bottleneck = bottleneck(t, p.dims, links_of(D, k));
  return t;
}

}  // namespace

StepTime predict_time(const Config& c, const Plan& p, const Cluster& k) {
  NDT_CHECK(p.dims.world() == k.devices(), "internal: a plan of ", p.dims.world(), " ranks on a cluster of ",
            k.devices(), " devices");
  if (p.dims.pp > 1) return predict_pipeline_time(c, p, k);
  StepReplay replay(p, k, shapes_of(p, c.train.device));
  replay.run();
  const Timeline& timeline = replay.timeline();
  StepTime t;
  t.step_s = timeline.now();
  t.compute_s = timeline.compute();
  t.recompute_s = timeline.recompute();
  t.gemm_s = timeline.gemm();
  t.exposed_by_dim = timeline.exposed();
  for (const auto& [dim, s] : t.exposed_by_dim) t.exposed_s += s;
  t.tokens_per_s = double(p.tokens) / t.step_s;
  t.mfu = mfu(c, p, k, t.step_s);
  count_bytes(p, replay.links(), t);
  t.bottleneck = bottleneck(t, p.dims, replay.links());
  return t;
}

void print_cluster(const Cluster& k, std::ostream& o) {
  char line[320];
  std::snprintf(line, sizeof(line),
                "cluster: %s, %lld hosts x %lld devices; %.3g TFLOP/s reached per device (peak %.3g), memory "
                "%.3g GB/s, "
                "%.3g GB per device\n",
                k.name.c_str(), (long long)k.hosts, (long long)k.devices_per_host, k.flops / 1e12,
                k.peak_flops / 1e12, k.memory_bps / 1e9, k.memory_bytes / 1e9);
  o << line;
  if (k.dtype == "bfloat16" && k.bf16_memory_bps != k.memory_bps) {
    std::snprintf(line, sizeof(line), "  element-wise on bfloat16 values: %.3g GB/s (their 2 bytes each)\n",
                  k.bf16_memory_bps / 1e9);
    o << line;
  }
  std::snprintf(
      line, sizeof(line),
      "  links per device and direction: inside a host %.3g GB/s (%.3g us), between hosts %.3g GB/s "
      "(%.3g us)\n",
      k.intra_bps / 1e9, k.intra_latency_s * 1e6, k.inter_bps / 1e9, k.inter_latency_s * 1e6);
  o << line;
  if (k.intra_cpu_share > 0 || k.inter_cpu_share > 0) {
    std::snprintf(
        line, sizeof(line),
        "  a transfer takes from the computation under it: %.2g of its time inside a host, %.2g between "
        "hosts\n",
        k.intra_cpu_share, k.inter_cpu_share);
    o << line;
  }
  if (k.attention_flops > 0) {
    std::snprintf(line, sizeof(line),
                  "  the fused attention core: products at %.3g TFLOP/s, %.3g ns a score and a pass of its "
                  "softmax\n",
                  k.attention_flops / 1e12, k.score_pass_s * 1e9);
    o << line;
  }
  if (k.expert_flops > 0) {
    std::snprintf(line, sizeof(line), "  the MoE MLP's grouped GEMMs at %.3g TFLOP/s\n",
                  k.expert_flops / 1e12);
    o << line;
  }
}

void print_time(const Plan& p, const StepTime& t, const Cluster& k, std::ostream& o) {
  char line[320];
  print_cluster(k, o);
  o << "time per step (predicted):\n";
  auto ms = [](double s) { return s * 1e3; };
  std::snprintf(line, sizeof(line), "  step           %10.1f ms  %.0f tokens/s, MFU %.1f%%\n", ms(t.step_s),
                t.tokens_per_s, 100 * t.mfu);
  o << line;
  std::snprintf(line, sizeof(line),
                "  compute        %10.1f ms  (matrix products %.1f ms of compute and recompute)\n",
                ms(t.compute_s), ms(t.gemm_s));
  o << line;
  std::snprintf(line, sizeof(line), "  recompute      %10.1f ms\n", ms(t.recompute_s));
  o << line;
  std::string by;
  for (const auto& [dim, s] : t.exposed_by_dim) {
    char b[64];
    std::snprintf(b, sizeof(b), "%s%s %.1f ms", by.empty() ? "" : ", ", dim.c_str(), ms(s));
    by += b;
  }
  std::snprintf(line, sizeof(line), "  exposed comm   %10.1f ms  %s\n", ms(t.exposed_s), by.c_str());
  o << line;
  std::string across;
  for (const std::string& a : t.across_hosts) across += (across.empty() ? "" : ", ") + a;
  std::snprintf(
      line, sizeof(line),
      "  sent per step  %10.2f MiB inside a host, %.2f MiB to other hosts, a rank on average (%s)\n",
      double(t.bytes_intra) / (1 << 20), double(t.bytes_inter) / (1 << 20),
      across.empty() ? "no dimension crosses hosts" : ("across hosts: " + across).c_str());
  o << line;
  if (t.pipeline_s > 0) {
    std::snprintf(
        line, sizeof(line),
        "  pipeline       %10.1f ms  the schedule (%s over %lld micro-batches), bubble %.1f%% of the stages' "
        "time; a message %.3g ms %s\n",
        ms(t.pipeline_s), p.pp_schedule.c_str(), (long long)p.accum, 100 * t.bubble, ms(t.message_s),
        t.messages_cross ? "between hosts" : "inside a host");
    o << line;
  }
  o << "  bottleneck: " << t.bottleneck << "\n";
}

nlohmann::json time_to_json(const StepTime& t) {
  return {{"step_s", t.step_s},
          {"compute_s", t.compute_s},
          {"recompute_s", t.recompute_s},
          {"exposed_s", t.exposed_s},
          {"gemm_s", t.gemm_s},
          {"exposed_by_dim", t.exposed_by_dim},
          {"tokens_per_s", t.tokens_per_s},
          {"mfu", t.mfu},
          {"bytes_intra", t.bytes_intra},
          {"bytes_inter", t.bytes_inter},
          {"across_hosts", t.across_hosts},
          {"bottleneck", t.bottleneck},
          {"pipeline_s", t.pipeline_s},
          {"bubble", t.bubble},
          {"message_s", t.message_s},
          {"messages_cross_hosts", t.messages_cross}};
}

nlohmann::json cluster_to_json(const Cluster& k) {
  return {{"name", k.name},
          {"hosts", k.hosts},
          {"devices_per_host", k.devices_per_host},
          {"flops", k.flops},
          {"peak_flops", k.peak_flops},
          {"memory_bps", k.memory_bps},
          {"bf16_memory_bps", k.bf16_memory_bps},
          {"memory_bytes", k.memory_bytes},
          {"intra_bps", k.intra_bps},
          {"intra_latency_s", k.intra_latency_s},
          {"inter_bps", k.inter_bps},
          {"inter_latency_s", k.inter_latency_s},
          {"intra_cpu_share", k.intra_cpu_share},
          {"inter_cpu_share", k.inter_cpu_share},
          {"attention_flops", k.attention_flops},
          {"score_pass_s", k.score_pass_s},
          {"expert_flops", k.expert_flops}};
}

}  // namespace ndt::train
