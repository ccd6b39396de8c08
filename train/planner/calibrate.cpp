// The measurement behind a calibrated cluster file (train/planner/calibrate.h).
#include "train/planner/calibrate.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <functional>
#include <set>
#include <sstream>
#include <thread>

#include "autograd/engine.h"
#include "autograd/ops.h"
#include "dist/comm/mpi.h"
#include "dist/mesh.h"
#include "models/gpt.h"
#include "nn/flat.h"
#include "nn/moe.h"
#include "optim/adamw.h"
#include "tensor/kernels.h"
#include "tensor/threads.h"
#include "train/io/files.h"
#include "train/planner/block_kinds.h"
#include "train/planner/cluster.h"
#include "train/planner/plan.h"
#include "train/planner/shapes.h"
#include "train/planner/time.h"

namespace ndt::train {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// fn() repeated until `at_least` seconds have passed (after one warm-up call): seconds per call.
template <class Fn>
double time_per_call(Fn fn, double at_least) {
  fn();
  const auto t0 = std::chrono::steady_clock::now();
  int64_t n = 0;
  do {
    fn();
    ++n;
  } while (seconds_since(t0) < at_least);
  return seconds_since(t0) / double(n);
}

// The mean of x over the ranks that measured it (weight 1) or not (weight 0).
double mean_over(dist::Communicator& world, double x, bool measured) {
  Tensor t = Tensor::empty({2}, DType::f64);
  static_cast<double*>(t.data_ptr())[0] = measured ? x : 0.0;
  static_cast<double*>(t.data_ptr())[1] = measured ? 1.0 : 0.0;
  world.all_reduce(t, dist::ReduceOp::kSum)->wait();
  const double* v = static_cast<const double*>(t.data_ptr());
  return v[1] > 0 ? v[0] / v[1] : 0.0;
}

// The largest x over the ranks.
double max_over(dist::Communicator& world, double x) {
  Tensor t = Tensor::full({1}, x, DType::f64);
  world.all_reduce(t, dist::ReduceOp::kMax)->wait();
  return static_cast<const double*>(t.data_ptr())[0];
}

// The matrix products of one micro-step of the config's model on one rank (tp = cp = 1),
// forward; backward runs each shape twice more (its transposes), at about the same rate.
// Under bf16 the linears and lm_head take bf16 operands (oneDNN where the CPU has bf16
// instructions); the attention core computes in f32 either way (autograd/ops/attention.cpp).
// c_attn has A + 2 KV columns (A = n_head hd, C unless llama's model.head_dim says otherwise;
// KV = n_kv_head hd: grouped-query attention; A for gpt2), c_proj A rows, the
// MLP's products are its block kind's (BlockKind::mlp_gemms); each query head's scores are
// as multi-head's.
std::vector<Gemm> model_gemms(const Config& c) {
  const models::GPTConfig& m = c.model;
  const int64_t B = c.train.micro_batch_size, T = c.train.seq_len, C = m.n_embd, NH = m.n_head;
  const int64_t N = B * T, L = m.n_layer, V = m.padded_vocab(), HS = m.head_dim(), KV = m.kv_heads() * HS,
                A = NH * HS, I = m.mlp_hidden();
  const DType w = c.train.dtype == "bfloat16" ? DType::bf16 : DType::f32, f = DType::f32;
  std::vector<Gemm> gemms = {{"c_attn", 1, N, C, A + 2 * KV, L, w}, {"attn c_proj", 1, N, A, C, L, w}};
  const std::vector<Gemm> mlp = block_kind(m.arch).mlp_gemms(N, C, I, L, w);
  gemms.insert(gemms.end(), mlp.begin(), mlp.end());
  gemms.insert(
      gemms.end(),
      {{"q k^T", B * NH, T, HS, T, L, f}, {"p v", B * NH, T, T, HS, L, f}, {"lm_head", 1, N, C, V, 1, w}});
  return gemms;
}

// All-reduces of `small` and `large` bytes on a group of two: 2 latency + S / bandwidth each.
struct LinkFit {
  double bps = 0, latency = 0;
};
// The pair's two members must make the same number of calls: a fixed count, not a time.
LinkFit fit_pair(dist::Communicator& world, dist::Communicator& pair, bool measure) {
  constexpr int64_t kSmall = 1024, kLarge = int64_t(1) << 20;  // floats: 4 KiB, 4 MiB
  Tensor small = Tensor::full({kSmall}, 1.0), large = Tensor::full({kLarge}, 1.0);
  auto per_call = [&](const Tensor& t, int calls) {
    pair.all_reduce(t, dist::ReduceOp::kSum)->wait();  // warm-up
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) pair.all_reduce(t, dist::ReduceOp::kSum)->wait();
    return seconds_since(t0) / calls;
  };
  double t_small = 0, t_large = 0;
  world.barrier();
  if (measure) t_small = per_call(small, 100);
  world.barrier();
  if (measure) t_large = per_call(large, 8);
  // the slowest pair: the links are shared unevenly, and a step waits for its last rank
  t_small = max_over(world, t_small);
  t_large = max_over(world, t_large);
  LinkFit f;
  const double dbytes = double(kLarge - kSmall) * 4;
  f.bps = dbytes / std::max(1e-9, t_large - t_small);
  f.latency = std::max(0.0, (t_small - double(kSmall) * 4 / f.bps) / 2);
  return f;
}

// Token ids, uniform in [0, V).
Tensor random_ids(int64_t B, int64_t T, int64_t V, uint64_t stream) {
  Tensor u = Tensor::empty({B, T});
  kernels::fill_uniform(u, 7, stream, 0, 0.0f, static_cast<float>(V));
  std::vector<int32_t> v;
  for (float x : u.to_vector<float>())
    v.push_back(std::min<int32_t>(static_cast<int32_t>(x), int32_t(V - 1)));
  return Tensor::from_vector(v, {B, T});
}

// Seconds of one optimizer step of the config's model on each rank alone (tp = cp = 1, one
// micro-step, no communication): forward, backward, the norm, AdamW; every rank at once,
// starting together (a barrier), and the slowest rank's time counts, as in training, where
// every step ends with the last rank (ranks sharing cores finish unevenly); the median of 9
// such steps after a warm-up. Under bf16 as the trainer runs it: bf16 copies over the f32
// master, the gradients folded into the master's, the copies made again after the step.
// With `behind`, each timed step calls it first (it starts transfers) and waits for what it
// returns (they are done) before the clock stops. Every rank calls this the same times.
using Behind = std::function<std::function<void()>()>;
double model_step_s(dist::Communicator& world, const Config& c, const Behind& behind = {}) {
  models::GPT gpt(c.model);
  const bool bf16 = c.train.dtype == "bfloat16";
  nn::FlatParams params =
      nn::materialize(gpt.units(), Device::cpu(), DType::f32, c.train.seed, nn::ShardSpec{},
                      bf16 ? std::optional<DType>(DType::bf16) : std::nullopt);
  optim::AdamW opt(params, c.optim);
  const int64_t B = c.train.micro_batch_size, T = c.train.seq_len, V = c.model.vocab_size;
  std::vector<double> times;
  for (int s = 0; s < 10; ++s) {
    Tensor x = random_ids(B, T, V, 2 * s), y = random_ids(B, T, V, 2 * s + 1);
    world.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    const std::function<void()> done = s > 0 && behind ? behind() : std::function<void()>{};
    params.zero_grad();
    backward(gpt.forward(x, y).loss);
    for (const nn::FlatUnit& u : params.units) nn::fold_grad(u);
    opt.step(1e-4, optim::clip_scale(optim::grad_norm(params), 1.0));
    params.refresh_compute();
    if (done) done();
    if (s > 0) times.push_back(max_over(world, seconds_since(t0)));
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// What a link's transfers cost the computation they run under, as a share of their own
// time: on CPU ranks the cores that compute also copy every byte (shared memory, TCP through
// the kernel) and poll the transfers on, so a transfer "behind" a step is not free. The
// model's step runs again (every rank at once, as in training) while each pair runs
// `kCalls` all-reduces behind it, sized to last about 0.7 of the step alone at the link's
// fitted rate: share = (step with them - step alone) / their time alone. Both members of a
// pair make the same calls: the size comes from figures every rank holds (means and
// maxima over the world).
double cpu_share(dist::Communicator& world, dist::Communicator& pair, bool measure, const Config& c,
                 double step_alone, const LinkFit& f) {
  constexpr int kCalls = 8;
  const double per_call = 0.7 * step_alone / kCalls;  // 2 latency + S / bandwidth each
  const int64_t floats = std::clamp<int64_t>(static_cast<int64_t>((per_call - 2 * f.latency) * f.bps / 4),
                                             1024, int64_t(1) << 24);
  const double call_s = 2 * f.latency + double(floats) * 4 / f.bps;
  Tensor t = Tensor::zeros({floats});
  std::vector<dist::WorkPtr> inflight;
  const Behind behind = [&]() -> std::function<void()> {
    inflight.clear();
    for (int i = 0; i < kCalls; ++i) inflight.push_back(pair.all_reduce(t, dist::ReduceOp::kSum));
    return [&] {
      for (const dist::WorkPtr& w : inflight) w->wait();
    };
  };
  world.barrier();
  const double alone = model_step_s(world, c);
  world.barrier();
  const double with = model_step_s(world, c, measure ? behind : Behind{});
  return mean_over(world, std::max(0.0, with - alone) / (kCalls * call_s), measure);
}

// The hosts the ranks sit on, in rank order: every host's ranks together and as many on
// each (ConfigError otherwise).
std::vector<std::string> hosts_in_order(const dist::DeviceMesh& mesh, int64_t world_size) {
  const std::vector<std::string>& names = mesh.hosts();
  std::vector<std::string> hosts;
  for (const std::string& h : names)
    if (hosts.empty() || hosts.back() != h) hosts.push_back(h);
  const int64_t host_count = static_cast<int64_t>(hosts.size()), per_host = world_size / host_count;
  const std::set<std::string> distinct(names.begin(), names.end());
  bool regular = static_cast<int64_t>(distinct.size()) == host_count && world_size % host_count == 0;
  for (int64_t r = 0; regular && r < world_size; ++r)
    regular = names[size_t(r)] == hosts[size_t(r / per_host)];
  if (!regular)
    throw ConfigError(
        "--plan.calibrate needs the same number of ranks on every host, in rank order (mpirun "
        "--map-by ppr:N:node); these ranks sit on " +
        std::to_string(distinct.size()) + " hosts unevenly or interleaved");
  return hosts;
}

// What one rank's computation reaches, every rank at once.
struct Rates {
  double flops = 0;                            // the matrix products of one micro-step, per second
  double memory_bps = 0, bf16_memory_bps = 0;  // element-wise, over f32 and bf16 values
  std::string gemm_lines;                      // each product's rate, for the file's comment
  // the fused attention core (Cluster::attention_flops, score_pass_s), measured at
  // attention_T tokens, and its seconds per score forward and backward at hd and at 4 hd
  double attention_flops = 0, score_pass_s = 0;
  int64_t attention_T = 0;
  double score_s_hd = 0, score_s_4hd = 0;
  // a mixture of experts' MLP (Cluster::expert_flops): its grouped GEMMs' rate, and its
  // forward and backward's seconds on one micro-step's rows
  double expert_flops = 0, moe_mlp_s = 0;
};

// The matrix products of one micro-step, every rank at once: their FLOPs over their time.
void measure_gemms(dist::Communicator& world, const Config& c, Rates& rates) {
  double flops = 0, secs = 0;
  std::ostringstream shapes;
  for (const Gemm& g : model_gemms(c)) {
    Tensor a = Tensor::empty(g.batch > 1 ? Shape{g.batch, g.m, g.k} : Shape{g.m, g.k}),
           b = Tensor::empty(g.batch > 1 ? Shape{g.batch, g.k, g.n} : Shape{g.k, g.n}),
           o = Tensor::empty(g.batch > 1 ? Shape{g.batch, g.m, g.n} : Shape{g.m, g.n}, g.dtype);
    kernels::fill_uniform(a, 1, 0, 0, -1, 1);
    kernels::fill_uniform(b, 1, 1, 0, -1, 1);
    if (g.dtype != DType::f32) a = a.to(g.dtype), b = b.to(g.dtype);
    world.barrier();
    const double t =
        mean_over(world, time_per_call([&] { kernels::gemm(a, false, b, false, o); }, 0.3), true);
    const double f = 2.0 * double(g.batch) * double(g.m) * double(g.k) * double(g.n);
    flops += f * double(g.count);
    secs += t * double(g.count);
    char line[160];
    std::snprintf(line, sizeof(line), "  %-12s %4lld x %6lld x %5lld x %6lld  %-8s %8.1f GFLOP/s\n", g.what,
                  (long long)g.batch, (long long)g.m, (long long)g.k, (long long)g.n, dtype_name(g.dtype),
                  f / t / 1e9);
    shapes << line;
  }
  rates.flops = flops / secs;
  rates.gemm_lines = shapes.str();
}

// An element-wise pass, every rank at once: out = a + b reads two values and writes one; in
// f32, and under bf16 also in bf16 (the activations' passes: each value converted to f32
// and back).
void measure_elementwise(dist::Communicator& world, const Config& c, Rates& rates) {
  const int64_t n = int64_t(1) << 22;
  auto add_bps = [&](DType dt) {
    Tensor x = Tensor::full({n}, 1.0, dt), y = Tensor::full({n}, 2.0, dt), z = Tensor::empty({n}, dt);
    world.barrier();
    const double t_add = mean_over(world, time_per_call([&] { kernels::add(x, y, z); }, 0.3), true);
    return 3.0 * double(n) * double(dtype_size(dt)) / t_add;
  };
  rates.memory_bps = add_bps(DType::f32);
  rates.bf16_memory_bps = c.train.dtype == "bfloat16" ? add_bps(DType::bf16) : rates.memory_bps;
}

// Seconds per score of the fused attention core, forward and backward (ndt::attention, the
// kernel Ulysses and the ring run; self-attention's is the same), every rank at once: B
// sequences of T tokens, n_head query heads reading n_kv_head of head size hs.
double attention_score_s(dist::Communicator& world, const Config& c, int64_t T, int64_t hs) {
  const int64_t B = c.train.micro_batch_size, NH = c.model.n_head, NKV = c.model.kv_heads();
  Tensor q = Tensor::empty({B, NH, T, hs}), k = Tensor::empty({B, NKV, T, hs}),
         v = Tensor::empty({B, NKV, T, hs}), dout = Tensor::empty({B, NH, T, hs});
  uint64_t stream = 0;
  for (Tensor* t : {&q, &k, &v, &dout}) kernels::fill_uniform(*t, 3, stream++, 0, -1, 1);
  for (Tensor* t : {&q, &k, &v}) t->set_requires_grad(true);
  world.barrier();
  double t = 1e30;  // the fastest of 3 (the machine's other load only slows a measurement down)
  for (int i = 0; i < 3; ++i)
    t = std::min(t, time_per_call(
                        [&] {
                          backward({ndt::attention(q, k, v).out}, {dout});
                          for (Tensor* x : {&q, &k, &v}) x->set_grad(Tensor());
                        },
                        0.1));
  return mean_over(world, t, true) / (double(B * NH) * causal_pairs(T));
}

// The fused attention core's rates: its cost per score is about flat in T (one block of 64
// queries' scores at a time) and grows with the head size through its products, so two head
// sizes split it: 14 hs FLOPs a score (4 hs forward, 10 backward) at attention_flops, and 5
// passes (2 forward, 3 backward: the softmax's, its exponentials) of score_pass_s each. T:
// the config's sequence, within [256, 2048] tokens (cheap: about a second in all).
void measure_attention(dist::Communicator& world, const Config& c, Rates& rates) {
  const int64_t hd = c.model.head_dim(), T = std::clamp<int64_t>(c.train.seq_len, 256, 2048) / 64 * 64;
  const double u1 = attention_score_s(world, c, T, hd), u4 = attention_score_s(world, c, T, 4 * hd);
  // of u1, the products' share (u4 - u1 is 3 times it); a noisy pair is held to a tenth of
  // u1 at least for each part
  const double products_s = std::clamp((u4 - u1) / 3, 0.1 * u1, 0.9 * u1);
  rates.attention_flops = 14.0 * double(hd) / products_s;
  rates.score_pass_s = (u1 - products_s) / 5;
  rates.attention_T = T;
  rates.score_s_hd = u1;
  rates.score_s_4hd = u4;
}

// The config alone on one rank (tp = cp = 1, one micro-step, no checkpointing), and its plan.
Config one_rank(const Config& c) {
  Config c1 = c;
  c1.parallel = ParallelSection{};
  c1.train.grad_accum_steps = 1;
  c1.train.activation_checkpointing = "none";
  c1.train.device = "cpu";
  return c1;
}

// Seconds of a mixture of experts' MLP (nn::MoeMLP: the router, top k, sort, dispatch, the
// grouped GEMMs, combine; the shared expert), forward and backward on one micro-step's B T
// rows of the config, every rank at once: the fastest of 3 (as the attention core's).
double moe_mlp_s(dist::Communicator& world, const Config& c) {
  const models::GPTConfig& m = c.model;
  const bool bf16 = c.train.dtype == "bfloat16";
  nn::MoeMLP mlp({.C = m.n_embd,
                  .experts = m.n_experts,
                  .k = m.n_experts_per_tok,
                  .intermediate = m.moe_intermediate_size,
                  .normalize = m.norm_topk_prob,
                  .shared = m.shared_expert_intermediate_size},
                 0.02f, 0.02f);
  nn::FlatParams params =
      nn::materialize({{"mlp", mlp.parameters("mlp")}}, Device::cpu(), DType::f32, c.train.seed,
                      nn::ShardSpec{}, bf16 ? std::optional<DType>(DType::bf16) : std::nullopt);
  Tensor x = Tensor::empty({c.train.micro_batch_size, c.train.seq_len, m.n_embd}),
         dy = Tensor::empty(x.shape());
  kernels::fill_uniform(x, 5, 0, 0, -1, 1);
  kernels::fill_uniform(dy, 5, 1, 0, -1, 1);
  if (bf16) x = x.to(DType::bf16), dy = dy.to(DType::bf16);
  world.barrier();
  double t = 1e30;
  for (int i = 0; i < 3; ++i)
    t = std::min(t, time_per_call(
                        [&] {
                          params.zero_grad();
                          backward({mlp.forward(x, nullptr, 0)}, {dy});
                        },
                        0.1));
  return mean_over(world, t, true);
}

// A MoE model's grouped GEMMs (Cluster::expert_flops): what is left of the MoE MLP's measured
// time after the planner's model of the rest of it (a MoE block's MLP pieces, BlockKind::work:
// the router's and the shared expert's products at `flops`, the element-wise passes at the
// memory rate), held to a tenth of the time at least, for their FLOPs.
void measure_moe_mlp(dist::Communicator& world, const Config& c, Rates& rates) {
  if (c.model.moe_layers() == 0) return;
  const double t = moe_mlp_s(world, c);
  const Config c1 = one_rank(c);
  const Shapes s = moe_block(shapes_of(plan(c1, 1), "cpu"));
  const BlockWork w = s.kind->work(s);
  const double bps = s.act_bytes < 4 ? rates.bf16_memory_bps : rates.memory_bps;
  double rest = 0, grouped = 0;
  std::vector<Work> pieces = {w.mlp};
  for (const auto& [input_grad, weight_grad] : w.mlp_in)
    pieces.insert(pieces.end(), {input_grad, weight_grad});
  for (const Work& p : pieces) {
    rest += p.flops / rates.flops + p.floats * double(s.act_bytes) / bps;
    grouped += p.grouped_flops;
  }
  rates.moe_mlp_s = t;
  rates.expert_flops = grouped / std::max(t - rest, 0.1 * t);
}

// The step the rates predict for one rank alone (tp = cp = 1, one micro-step, no
// checkpointing), by the planner's own model.
double predicted_step_s(const Config& c, const Rates& rates) {
  Cluster one;
  one.name = "one rank";
  one.hosts = one.devices_per_host = 1;
  one.flops = one.peak_flops = rates.flops;
  one.memory_bps = rates.memory_bps;
  one.bf16_memory_bps = rates.bf16_memory_bps;
  one.attention_flops = rates.attention_flops;
  one.score_pass_s = rates.score_pass_s;
  one.expert_flops = rates.expert_flops;
  one.memory_bytes = 1e18;
  const Config c1 = one_rank(c);
  return predict_time(c1, plan(c1, 1), one).step_s;
}

// The links inside a host: pairs of a host's ranks, every pair at once.
void measure_intra_host(dist::Communicator& world, const Config& c, double step_measured, Cluster& k) {
  const int64_t W = world.size(), me = world.rank(), D = k.devices_per_host;
  const int64_t local = me % D;
  const bool paired = local / 2 * 2 + 1 < D;  // an odd last rank of a host sits out
  auto pair = world.split(int(paired ? me / 2 : W + me), int(me), "calibration pair inside a host");
  const LinkFit f = fit_pair(world, *pair, paired);
  k.intra_bps = f.bps;
  k.intra_latency_s = f.latency;
  k.intra_cpu_share = cpu_share(world, *pair, paired, c, step_measured, f);
}

// The links between hosts: pairs across two hosts, every pair at once; returns a line on
// what they reached, for the file's comment.
std::string measure_between_hosts(dist::Communicator& world, const Config& c, double step_measured,
                                  Cluster& k) {
  const int64_t W = world.size(), me = world.rank(), D = k.devices_per_host, H = k.hosts;
  const int64_t h = me / D;
  const bool paired = h % 2 == 1 || h + 1 < H;  // an odd last host sits out
  const int64_t partner = h % 2 == 0 ? me + D : me - D;
  auto pair =
      world.split(int(paired ? std::min(me, partner) : W + me), int(me), "calibration pair across hosts");
  // every pair at once: each rank's share when all of a host's ranks send together
  const LinkFit all = fit_pair(world, *pair, paired);
  // one pair alone (ranks 0 and D): what one stream gets of a host's links
  const LinkFit one = fit_pair(world, *pair, me == 0 || me == D);
  // A step's transfers reach the second figure, not the first, on the simulated cluster
  // (docs/planner.md, "Checked against measurement"): a host's links count as what one
  // pair moves, shared by the host's ranks (inter_gbps x devices_per_host = that).
  k.inter_bps = std::min(all.bps, one.bps / double(D));
  k.inter_latency_s = one.latency;
  // (as a share of the time the model gives a transfer: at inter_bps)
  k.inter_cpu_share =
      cpu_share(world, *pair, paired, c, step_measured, LinkFit{k.inter_bps, k.inter_latency_s});
  return "between hosts: every pair at once " + std::to_string(all.bps / 1e6) +
         " MB/s per rank, one pair alone " + std::to_string(one.bps / 1e6) + " MB/s\n";
}

// What was measured, for the file's comment.
struct Measured {
  Rates rates;
  double step_measured = 0, step_predicted = 0, factor = 1;
  std::string inter_note;
};

// Rank 0 writes the cluster file: the measurement's story, then the [cluster] keys.
void write_cluster_file(const Config& c, const std::vector<std::string>& hosts, const Measured& m,
                        const Cluster& k, std::ostream& out) {
  std::string host_list;
  for (const std::string& h : hosts) host_list += (host_list.empty() ? "" : ", ") + h;
  char when[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(when, sizeof(when), "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  std::ostringstream head;
  head << "measured by train_gpt --plan.calibrate on " << when << ": " << k.devices() << " ranks on "
       << k.hosts << " hosts (" << host_list
       << ")\nthe matrix products of one micro-step of the model (n_layer " << c.model.n_layer << ", n_embd "
       << c.model.n_embd << ", micro-batch " << c.train.micro_batch_size << " x " << c.train.seq_len << ", "
       << c.train.dtype << "), every rank at once:\n"
       << m.rates.gemm_lines << "element-wise (a + b): " << m.rates.memory_bps / 1e9 << " GB/s"
       << (c.train.dtype == "bfloat16"
               ? " (bfloat16: " + std::to_string(m.rates.bf16_memory_bps / 1e9) + " GB/s)"
               : "")
       << "; the fused attention core at " << m.rates.attention_T
       << " tokens, forward and backward: " << m.rates.score_s_hd * 1e9 << " ns a score at head size "
       << c.model.head_dim() << ", " << m.rates.score_s_4hd * 1e9 << " at " << 4 * c.model.head_dim()
       << (m.rates.moe_mlp_s > 0
               ? "\nthe MoE MLP (router, sort, grouped GEMMs, combine), forward and backward: " +
                     std::to_string(m.rates.moe_mlp_s * 1e3) + " ms, its grouped GEMMs at " +
                     std::to_string(m.rates.expert_flops / 1e9) + " GFLOP/s"
               : std::string())
       << "\nthe model's step alone on every rank at once (the slowest): " << m.step_measured * 1e3
       << " ms, which these rates predict as " << m.step_predicted * 1e3 << " ms:\nboth are scaled by "
       << m.factor << " below\n"
       << m.inter_note
       << "the step with all-reduces behind it (8 per pair, about 0.7 of the step alone) took longer by "
          "this share of their own time: inside a host "
       << k.intra_cpu_share << ", between hosts " << k.inter_cpu_share << "\n";
  const std::string ini = cluster_ini(k, head.str());
  io::write_file_atomic(c.plan_calibrate, ini);
  out << ini << "written to " << c.plan_calibrate << "\n";
}

// Every measurement, in the order every rank makes it; the cluster it gives.
Cluster measure(dist::Communicator& world, const Config& c, int64_t hosts, Measured& m) {
  measure_gemms(world, c, m.rates);
  measure_elementwise(world, c, m.rates);
  measure_attention(world, c, m.rates);
  measure_moe_mlp(world, c, m.rates);
  // the model's own step, every rank at once: what the two rates above leave out (the
  // element-wise kernels that compute more than they move, the autograd engine, threads
  // sharing cores) becomes a factor on both, so that they predict this step
  world.barrier();
  m.step_measured = model_step_s(world, c);
  m.step_predicted = predicted_step_s(c, m.rates);
  m.factor = m.step_predicted / m.step_measured;
  Cluster k;
  k.name = "calibrated";
  k.dtype = c.train.dtype;
  k.hosts = hosts;
  k.devices_per_host = world.size() / hosts;
  k.flops = k.peak_flops = m.rates.flops * m.factor;
  k.memory_bps = m.rates.memory_bps * m.factor;
  k.bf16_memory_bps = m.rates.bf16_memory_bps * m.factor;
  // (the attention core was timed whole, as the step runs it: its rates stand as measured)
  k.attention_flops = m.rates.attention_flops;
  k.score_pass_s = m.rates.score_pass_s;
  k.expert_flops = m.rates.expert_flops;  // (the MoE MLP timed whole too)
  k.memory_bytes =
      double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGE_SIZE)) / double(k.devices_per_host);
  if (k.devices_per_host > 1) measure_intra_host(world, c, m.step_measured, k);
  if (k.hosts > 1) m.inter_note = measure_between_hosts(world, c, m.step_measured, k);
  return k;
}

}  // namespace

int calibrate_main(const Config& c, std::ostream& out, std::ostream& err) {
  std::shared_ptr<dist::Communicator> world;
  try {
    if (c.train.device != "cpu")
      throw ConfigError(
          "--plan.calibrate measures CPU ranks (train.device = cpu); for GPUs start from a preset "
          "(cluster.preset = h100-sxm-8, ...) and set cluster.efficiency");
    world = dist::init_world();
    world->set_timeout(c.parallel.timeout_s);
    const int64_t W = world->size();
    dist::DeviceMesh mesh(dist::ParallelDims::resolve(1, W, 1, 1, 1, W), world);
    const std::vector<std::string> hosts = hosts_in_order(mesh, W);
    const int64_t per_host = W / static_cast<int64_t>(hosts.size());
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    set_num_threads(c.train.threads > 0 ? c.train.threads : std::max(1, cores / int(per_host)));
    Measured m;
    const Cluster k = measure(*world, c, static_cast<int64_t>(hosts.size()), m);
    if (world->rank() == 0) write_cluster_file(c, hosts, m, k, out);
    world->barrier();
    return 0;
  } catch (const ConfigError& e) {
    if (!world || world->rank() == 0) err << "train_gpt: config error: " << e.what() << "\n";
    if (world && world->size() > 1) world->abort(2);
    return 2;
  } catch (const std::exception& e) {
    err << "train_gpt: --plan.calibrate: " << e.what() << "\n";
    if (world && world->size() > 1) world->abort(1);
    return 1;
  }
}

}  // namespace ndt::train
