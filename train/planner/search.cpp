// The layout search: enumerate, plan, keep what fits, time, rank.
#include "train/planner/search.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <utility>

#include "dist/parallelize.h"

namespace ndt::train {
namespace {

std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> d;
  for (int64_t i = 1; i * i <= n; ++i)
    if (n % i == 0) {
      d.push_back(i);
      if (i != n / i) d.push_back(n / i);
    }
  std::sort(d.begin(), d.end());
  return d;
}

// "1 x 2 x 4 x 1 x 1 x 1" as pp x dp_replicate x dp_shard x cp x sp x tp (", ep 2" with experts split)
std::string sizes(const dist::ParallelDims& D) {
  char s[100];
  std::snprintf(s, sizeof(s), "%lld x %lld x %lld x %lld x %lld x %lld", (long long)D.pp,
                (long long)D.dp_replicate, (long long)D.dp_shard, (long long)D.cp, (long long)D.sp,
                (long long)D.tp);
  return D.ep > 1 ? std::string(s) + ", ep " + std::to_string(D.ep) : std::string(s);
}

// "1f1b", "interleaved x2"; "-" without a pipeline
std::string schedule_of(const Plan& p) {
  if (p.dims.pp == 1) return "-";
  return p.pp_schedule + (p.pp_virtual > 1 ? " x" + std::to_string(p.pp_virtual) : "");
}

std::string describe(const Candidate& x) {
  return sizes(x.plan.dims) + " (" + x.plan.strategy + "), " +
         (x.plan.dims.pp > 1 ? "schedule " + schedule_of(x.plan) + ", " : "") + "micro-batch " +
         std::to_string(x.plan.micro_batch) + ", checkpointing " + x.plan.ac;
}

bool same_layout(const Plan& a, const Plan& b) {
  return a.dims.pp == b.dims.pp && a.dims.dp_replicate == b.dims.dp_replicate &&
         a.dims.dp_shard == b.dims.dp_shard && a.dims.cp == b.dims.cp && a.dims.sp == b.dims.sp &&
         a.dims.tp == b.dims.tp && a.dims.ep == b.dims.ep && schedule_of(a) == schedule_of(b);
}

std::string ms(double s) {
  char b[32];
  std::snprintf(b, sizeof(b), "%.1f ms", s * 1e3);
  return b;
}

// Whether any (pp, tp, cp, sp, data-parallel) split of `world` devices passes the trainer's
// rules for c's model and sequence, with the batch splitting among the data-parallel ranks
// (pipeline stages no more than the blocks, as the search takes them).
bool some_layout_divides(const Config& c, int64_t world, int64_t batch) {
  for (int64_t pp : divisors(world)) {
    if (pp > c.model.n_layer) continue;
    for (int64_t tp : divisors(world / pp))
      for (int64_t cp : divisors(world / (pp * tp)))
        for (int64_t sp : divisors(world / (pp * tp * cp))) {
          const int64_t dp = world / (pp * tp * cp * sp);
          if (batch % dp) continue;
          dist::ParallelDims dims;
          dims.pp = pp;
          dims.dp_shard = dp;
          dims.cp = cp;
          dims.sp = sp;
          dims.tp = tp;
          try {
            dist::check_parallel_model(c.model, dims, c.train.seq_len);
            return true;
          } catch (const Error&) {
          }
        }
  }
  return false;
}

// Why the first beats the second: the part of the step that differs most.
std::string why_first(const std::vector<Candidate>& r) {
  if (r.empty()) return "no plan fits in memory";
  const StepTime& a = r[0].time;
  if (r.size() == 1) return "it is the only plan that fits";
  // the best plan of another layout (the runner-up often differs only in micro-batch)
  const Candidate* other = nullptr;
  for (size_t i = 1; i < r.size() && !other; ++i)
    if (!same_layout(r[i].plan, r[0].plan)) other = &r[i];
  if (!other) other = &r[1];
  const StepTime& b = other->time;
  const double d_compute = b.compute_s - a.compute_s, d_re = b.recompute_s - a.recompute_s,
               d_exp = b.exposed_s - a.exposed_s;
  std::string part;
  if (d_exp >= d_compute && d_exp >= d_re) {
    std::string dim;
    double most = -1;
    for (const auto& [k, s] : b.exposed_by_dim) {
      const auto it = a.exposed_by_dim.find(k);
      const double d = s - (it == a.exposed_by_dim.end() ? 0.0 : it->second);
      if (d > most) most = d, dim = k;
    }
    part = "waits " + ms(d_exp) + " more on communication (" + dim + " " + ms(std::max(0.0, most)) + ")";
  } else if (d_re >= d_compute) {
    part = "recomputes " + ms(d_re) + " more (activation checkpointing " + other->plan.ac + ")";
  } else {
    part = "computes " + ms(d_compute) + " more (micro-batch " + std::to_string(other->plan.micro_batch) +
           " and its shapes)";
  }
  char pct[32];
  std::snprintf(pct, sizeof(pct), "%.0f%%", 100 * (b.step_s / a.step_s - 1));
  return "the best other layout, " + sizes(other->plan.dims) + " (" + other->plan.strategy +
         (other->plan.dims.pp > 1 ? ", " + schedule_of(other->plan) : std::string()) + "), is " + pct +
         " slower (" + ms(b.step_s) + " against " + ms(a.step_s) + "): it " + part;
}

// The splits of dp data-parallel ranks into replicas (the rest shards), each with expert
// parallelism's degrees for a MoE model: 1, and the divisors of the shard group (of the
// replicas without FSDP) that divide model.n_experts (the ep ranks are consecutive data ranks:
// dist::ParallelDims::set_expert_parallel). A dense model: ep 1.
std::vector<std::pair<int64_t, int64_t>> replicas_and_experts(const Config& c, int64_t dp) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int64_t rep : divisors(dp)) {
    const int64_t shard = dp / rep;
    for (int64_t ep : divisors(shard > 1 ? shard : rep))
      if (ep == 1 || (c.model.moe() && c.model.n_experts % ep == 0)) out.emplace_back(rep, ep);
  }
  return out;
}

// A pipeline of pp stages (1: none) and its schedule.
struct Pipeline {
  int64_t pp;
  const char* schedule;
  int64_t virtual_stages;
};

// Every plan of one layout -- pipeline, tp, cp, Ulysses' sp (usp), the rest data parallel --
// into `out`: each split of the data-parallel ranks into replicas and shards, micro-batch,
// checkpointing mode and (with tp) sequence parallelism.
void search_layout(const Config& c, const Cluster& k, const Pipeline& pipe, int64_t tp, int64_t cp,
                   int64_t usp, SearchResult& out) {
  const char* modes[] = {"none", "selective", "full"};
  const int64_t W = out.world, dp = W / (pipe.pp * tp * cp * usp);
  const int64_t sps = tp > 1 ? 2 : 1;  // with tp, sequence parallelism off and on
  if (out.batch % dp) {
    const int64_t n = static_cast<int64_t>(replicas_and_experts(c, dp).size()) * 3 * sps;
    out.refused += n;
    out.tried += n;
    out.refusals["the batch of " + std::to_string(out.batch) + " sequences per step does not split among " +
                 std::to_string(dp) + " data-parallel ranks (tp " + std::to_string(tp) + ", cp " +
                 std::to_string(cp) + (usp > 1 ? ", sp " + std::to_string(usp) : "") +
                 (pipe.pp > 1 ? ", pp " + std::to_string(pipe.pp) : "") + ")"] += n;
    return;
  }
  const int64_t per_rank = out.batch / dp;
  for (const auto& [rep, ep] : replicas_and_experts(c, dp))
    for (int64_t micro : divisors(per_rank))
      for (const char* mode : modes)
        for (int64_t sp = 0; sp < sps; ++sp) {
          ++out.tried;
          Config x = c;
          x.parallel.pp_size = pipe.pp;
          x.parallel.pp_schedule = pipe.schedule;
          x.parallel.pp_virtual = pipe.virtual_stages;
          x.parallel.pp_split = "";  // balanced by cost
          x.parallel.sequence_parallel = sp == 1;
          x.parallel.dp_replicate_size = rep;
          x.parallel.dp_shard_size = dp / rep;
          x.parallel.cp_size = cp;
          x.parallel.sp_size = usp;
          x.parallel.tp_size = tp;
          x.parallel.ep_size = ep;
          x.train.micro_batch_size = micro;
          x.train.grad_accum_steps = per_rank / micro;  // under a pipeline, its micro-batches
          x.train.activation_checkpointing = mode;
          x.train.ac_every = 1;
          if (micro * x.train.seq_len > (int64_t(1) << 31)) {
            ++out.refused;
            ++out.refusals["a micro-batch of over 2^31 tokens"];
            continue;
          }
          Candidate cand;
          try {
            cand.plan = plan(x, W);
          } catch (const ConfigError&
                       e) {  // tp, cp, sp or the stages the model, the sequence or the schedule cannot take
            ++out.refused;
            ++out.refusals[e.what()];
            continue;
          }
          if (double(cand.plan.peak_bytes) > 0.9 * k.memory_bytes) {
            ++out.too_big;
            continue;
          }
          cand.time = predict_time(x, cand.plan, k);
          out.ranked.push_back(std::move(cand));
        }
}

}  // namespace

SearchResult search(const Config& c, const Cluster& k) {
  SearchResult out;
  out.world = k.devices();
  const int64_t W = out.world;
  if (c.plan_batch > 0) {
    out.batch = c.plan_batch;
  } else {  // the config's batch per step
    const ParallelSection& P = c.parallel;
    const int64_t shard =
        P.dp_shard_size > 0
            ? P.dp_shard_size
            : std::max<int64_t>(1, W / (P.pp_size * P.dp_replicate_size * P.cp_size * P.sp_size * P.tp_size));
    out.batch = c.train.micro_batch_size * c.train.grad_accum_steps * P.dp_replicate_size * shard;
  }
  // pipeline stages: none, or a divisor of the world no larger than the blocks, each with
  // 1f1b, zb-h1 and, when every rank can hold two chunks, interleaved over 2
  std::vector<Pipeline> pipelines;
  for (int64_t pp : divisors(W)) {
    if (pp > c.model.n_layer) continue;
    if (pp == 1) {
      pipelines.push_back({1, "1f1b", 1});
      continue;
    }
    pipelines.push_back({pp, "1f1b", 1});
    pipelines.push_back({pp, "zb-h1", 1});
    if (2 * pp <= c.model.n_layer) pipelines.push_back({pp, "interleaved", 2});
  }
  // sequence splits: cp's ring, Ulysses' sp, and both (USP: sp inside cp)
  for (const Pipeline& pipe : pipelines)
    for (int64_t tp : divisors(W / pipe.pp))
      for (int64_t cp : divisors(W / (pipe.pp * tp)))
        for (int64_t usp : divisors(W / (pipe.pp * tp * cp))) search_layout(c, k, pipe, tp, cp, usp, out);
  std::stable_sort(out.ranked.begin(), out.ranked.end(),
                   [](const Candidate& a, const Candidate& b) { return a.time.step_s < b.time.step_s; });
  out.why = why_first(out.ranked);
  if (out.ranked.empty() && out.too_big == 0) {  // every plan refused: say why, and where plans exist
    out.why = "no layout of " + std::to_string(W) + " devices passes the trainer's rules";
    for (int64_t d = 1; d <= W && out.nearest_worlds.size() < 2; ++d)
      for (const int64_t w : {W - d, W + d})
        if (w >= 1 && out.nearest_worlds.size() < 2 && some_layout_divides(c, w, out.batch))
          out.nearest_worlds.push_back(w);
  }
  return out;
}

// Why no plan exists when the trainer's rules refused every one: the rules, most plans
// first, and the nearest world sizes that have plans.
void print_refusals(const SearchResult& s, std::ostream& o) {
  o << s.why << ":\n";
  std::vector<std::pair<int64_t, std::string>> rules;
  for (const auto& [why, n] : s.refusals) rules.emplace_back(n, why);
  std::stable_sort(rules.begin(), rules.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  for (size_t i = 0; i < rules.size() && i < 4; ++i)
    o << "  " << rules[i].first << " plans: " << rules[i].second << "\n";
  if (rules.size() > 4) o << "  and " << rules.size() - 4 << " more rules\n";
  if (s.nearest_worlds.empty()) {
    o << "no world size up to " << 2 * s.world
      << " has a plan: change the model, the sequence or the batch\n";
    return;
  }
  o << "the nearest world sizes with plans:";
  for (int64_t w : s.nearest_worlds) o << " " << w;
  o << " devices (or another batch: --plan.batch)\n";
}

void print_search(const SearchResult& s, const Cluster& k, int64_t top, std::ostream& o) {
  print_cluster(k, o);
  o << "search: " << s.world << " devices, " << s.batch << " sequences per step; " << s.tried
    << " plans (layouts with cp, sp or both and pipeline schedules x micro-batches x checkpointing x "
       "sequence parallelism with tp), "
    << s.refused << " refused by the trainer's rules, " << s.too_big << " over 90% of a device's memory, "
    << s.ranked.size() << " ranked\n";
  if (s.ranked.empty() && s.too_big == 0) return print_refusals(s, o);
  char line[400];
  std::snprintf(line, sizeof(line),
                "%4s  %-31s %-27s %-14s %-7s %-9s %10s %11s %6s %10s %10s %10s %7s %9s  %s\n", "#",
                "pp x rep x shard x cp x sp x tp", "strategy", "schedule", "micro", "AC", "step ms",
                "tokens/s", "MFU", "compute", "exposed", "recompute", "bubble", "peak GB", "across hosts");
  o << line;
  for (size_t i = 0; i < s.ranked.size() && int64_t(i) < top; ++i) {
    const Plan& p = s.ranked[i].plan;
    const StepTime& t = s.ranked[i].time;
    std::string across;
    for (const std::string& a : t.across_hosts) across += (across.empty() ? "" : ",") + a;
    char bubble[16] = "-";
    if (p.dims.pp > 1) std::snprintf(bubble, sizeof(bubble), "%.1f%%", 100 * t.bubble);
    std::snprintf(line, sizeof(line),
                  "%4zu  %-31s %-27s %-14s %2lld x %-2lld %-9s %10.1f %11.0f %5.1f%% %10.1f %10.1f %10.1f "
                  "%7s %9.2f  %s\n",
                  i + 1, sizes(p.dims).c_str(), p.strategy.c_str(), schedule_of(p).c_str(),
                  (long long)p.micro_batch, (long long)p.accum, p.ac.c_str(), t.step_s * 1e3, t.tokens_per_s,
                  100 * t.mfu, t.compute_s * 1e3, t.exposed_s * 1e3, t.recompute_s * 1e3, bubble,
                  double(p.peak_bytes) / 1e9, across.empty() ? "-" : across.c_str());
    o << line;
  }
  if (!s.ranked.empty()) {
    o << "best: " << describe(s.ranked[0]) << "; " << s.ranked[0].time.bottleneck << "\n";
    o << "why: " << s.why << "\n";
    const Plan& p = s.ranked[0].plan;
    o << "run it: ";
    if (p.dims.pp > 1) {
      o << "--parallel.pp_size " << p.dims.pp << " --parallel.pp_schedule " << p.pp_schedule;
      if (p.pp_virtual > 1) o << " --parallel.pp_virtual " << p.pp_virtual;
      o << " ";
    }
    o << "--parallel.dp_replicate_size " << p.dims.dp_replicate << " --parallel.dp_shard_size "
      << p.dims.dp_shard << " --parallel.cp_size " << p.dims.cp << " --parallel.sp_size " << p.dims.sp
      << " --parallel.tp_size " << p.dims.tp
      << (p.n_experts > 0 ? " --parallel.ep_size " + std::to_string(p.dims.ep) : std::string())
      << " --train.micro_batch_size " << p.micro_batch << " --train.grad_accum_steps " << p.accum
      << " --train.activation_checkpointing " << p.ac
      << (p.dims.tp > 1
              ? std::string(" --parallel.sequence_parallel ") + (p.sequence_parallel ? "true" : "false")
              : "")
      << "\n";
  } else {
    o << "no plan fits in 90% of a device's " << k.memory_bytes / 1e9
      << " GB: a smaller model, a shorter sequence, a smaller batch (--plan.batch) or more devices\n";
  }
}

void print_search_json(const SearchResult& s, const Cluster& k, int64_t top, std::ostream& o) {
  nlohmann::json j;
  j["cluster"] = cluster_to_json(k);
  j["world"] = s.world;
  j["batch"] = s.batch;
  j["tried"] = s.tried;
  j["refused"] = s.refused;
  j["too_big"] = s.too_big;
  j["why"] = s.why;
  j["refusals"] = s.refusals;
  j["nearest_worlds"] = s.nearest_worlds;
  nlohmann::json plans = nlohmann::json::array();
  for (size_t i = 0; i < s.ranked.size() && int64_t(i) < top; ++i) {
    const Plan& p = s.ranked[i].plan;
    nlohmann::json x = time_to_json(s.ranked[i].time);
    x["layout"] = {{"pp", p.dims.pp},
                   {"pp_schedule", p.dims.pp > 1 ? p.pp_schedule : ""},
                   {"pp_virtual", p.pp_virtual},
                   {"dp_replicate", p.dims.dp_replicate},
                   {"dp_shard", p.dims.dp_shard},
                   {"cp", p.dims.cp},
                   {"sp", p.dims.sp},
                   {"tp", p.dims.tp},
                   {"ep", p.dims.ep},
                   {"strategy", p.strategy}};
    x["micro_batch_size"] = p.micro_batch;
    x["grad_accum_steps"] = p.accum;
    x["activation_checkpointing"] = p.ac;
    x["sequence_parallel"] = p.sequence_parallel;
    x["peak_bytes"] = p.peak_bytes;
    x["comm_bytes"] = p.comm_bytes;
    plans.push_back(x);
  }
  j["plans"] = plans;
  o << j.dump(2) << "\n";
}

}  // namespace ndt::train
