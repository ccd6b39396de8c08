// ndtrain: fused attention through cuDNN's scaled-dot-product attention (see sdpa.h).
// Legend: B batch, NH heads, NKV key/value heads, Tq queries, Tk keys, HS head size.
//
// Grouped-query attention needs nothing but the shapes: K, V (and dK, dV) are described with
// NKV heads, and cuDNN's SDPA pairs query head h with kv head h / (NH/NKV) (its "b (hkv g)"
// grouping, Hugging Face's repeat_kv order) and sums dK, dV over each group itself.
//
// No kernels of our own: each call describes a small cuDNN graph (the frontend's sdpa or
// sdpa_backward node), builds it once per shape and strides, and executes it on the
// device's compute stream:
//   forward:  q, k, v -> out = softmax(scale * q k^T + mask) v,  Stats = lse   (graph A)
//   backward: q, k, v, out, dout, Stats -> dq, dk, dv                         (graph B)
// Built graphs stay in a cache owned by this file (one mutex); a cudnnHandle_t per device is
// bound to ndtrain's compute stream; workspaces come from ndtrain's stream-ordered pool.
//
// Without NDT_WITH_CUDNN_SDPA (no frontend headers: scripts/setup.sh fetches them) this file
// compiles to stubs: sdpa_supported() says why not, and attention uses the composed path.
#include "tensor/cuda/sdpa.h"

#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "tensor/cuda/host.h"
#include "tensor/cuda/runtime.h"

#ifdef NDT_WITH_CUDNN_SDPA
#define CUDNN_FRONTEND_SKIP_JSON_LIB  // graph serialization unused; keeps the frontend's json out
#include <cudnn.h>

#include <cudnn_frontend.h>

namespace fe = cudnn_frontend;

// cuDNN's own calls (handle, stream): like NDT_CUDA_CHECK.
#define NDT_CUDNN_CHECK(expr)                                                               \
  do {                                                                                      \
    const cudnnStatus_t ndt_st_ = (expr);                                                   \
    if (ndt_st_ != CUDNN_STATUS_SUCCESS)                                                    \
      ::ndt::detail::throw_error(                                                           \
          __FILE__, __LINE__,                                                               \
          ::ndt::detail::cat("cuDNN error ", cudnnGetErrorString(ndt_st_), " in ", #expr)); \
  } while (0)

// A frontend step (validate, build, execute) that failed: one line with the step, the shapes
// and the frontend's message, and the way around it.
#define NDT_CUDNN_FE_CHECK(expr, what)                                                                   \
  do {                                                                                                   \
    fe::error_t ndt_fe_ = (expr);                                                                        \
    if (ndt_fe_.is_bad())                                                                                \
      ::ndt::detail::throw_error(__FILE__, __LINE__,                                                     \
                                 ::ndt::detail::cat("cuDNN SDPA ", what, ": ", ndt_fe_.get_message(),    \
                                                    " (set NDT_SDPA=0 to use the composed attention)")); \
  } while (0)
#endif

namespace ndt::cuda {

#ifdef NDT_WITH_CUDNN_SDPA

namespace {

constexpr int kMaxDevices = 16;  // as in runtime.cu

// ---- per-device cuDNN handle, bound to the compute stream ------------------------------
// Never destroyed, like the cuBLAS handles (runtime.cu): the runtime may be gone at exit.
cudnnHandle_t cudnn(int device) {
  struct Slot {
    std::once_flag once;
    cudnnHandle_t handle = nullptr;
  };
  static auto* slots = new std::array<Slot, kMaxDevices>();
  NDT_CHECK(device >= 0 && device < kMaxDevices, "cuDNN SDPA: cuda:", device, " is out of range");
  Slot& s = (*slots)[device];
  std::call_once(s.once, [&] {
    cudaStream_t st = stream(device);
    DeviceGuard g(device);
    NDT_CUDNN_CHECK(cudnnCreate(&s.handle));
    NDT_CUDNN_CHECK(cudnnSetStream(s.handle, st));
  });
  return s.handle;
}

// ---- the graphs -------------------------------------------------------------------------
// Tensor uids in the variant packs.
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV };

// Everything a built graph depends on: direction, device, sizes, q/k/v strides (out, dout,
// dq, dk, dv and lse are always contiguous), mask and scale.
struct Problem {
  bool backward = false;
  int device = 0;
  int64_t B = 0, NH = 0, NKV = 0, Tq = 0, Tk = 0, HS = 0;
  std::array<int64_t, 3> qs{}, ks{}, vs{};  // strides of dims 0..2 (the last is 1)
  bool causal = false;
  double scale = 0;

  std::vector<int64_t> key() const {
    int64_t scale_bits = 0;
    std::memcpy(&scale_bits, &scale, sizeof scale);
    return {backward, device, B,     NH,    NKV,   Tq,    Tk,    HS,     qs[0],     qs[1],
            qs[2],    ks[0],  ks[1], ks[2], vs[0], vs[1], vs[2], causal, scale_bits};
  }
  std::string str() const {
    return detail::cat(backward ? "backward" : "forward", " B=", B, " NH=", NH, " NKV=", NKV, " Tq=", Tq,
                       " Tk=", Tk, " HS=", HS, causal ? " causal" : " unmasked", " on cuda:", device);
  }
};

Problem problem_of(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale,
                   bool backward) {
  Problem p;
  p.backward = backward;
  p.device = q.device().index;
  p.B = q.size(0), p.NH = q.size(1), p.NKV = k.size(1), p.Tq = q.size(2), p.Tk = k.size(2), p.HS = q.size(3);
  for (int d = 0; d < 3; ++d) p.qs[d] = q.strides()[d], p.ks[d] = k.strides()[d], p.vs[d] = v.strides()[d];
  p.causal = causal;
  p.scale = scale;
  return p;
}

std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& dim) {
  std::vector<int64_t> s(dim.size(), 1);
  for (int i = static_cast<int>(dim.size()) - 2; i >= 0; --i) s[i] = s[i + 1] * dim[i + 1];
  return s;
}

using GraphPtr = std::shared_ptr<fe::graph::Graph>;

// Describes the graph of p; build() below turns it into an executable plan. The forward
// lets the frontend choose its SDPA node (the unified one on cuDNN >= 9.13.1 for unmasked
// attention, the composite one otherwise) unless composite is asked for; the backward has
// only the composite node and an optional deterministic algorithm.
GraphPtr describe(const Problem& p, bool deterministic, bool composite) {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  auto tensor = [&](const char* name, int64_t uid, const std::vector<int64_t>& dim,
                    const std::vector<int64_t>& stride) {
    return g->tensor(
        fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(dim).set_stride(stride));
  };
  // q, out, dout, dq with NH heads; k, v, dk, dv with NKV (grouped-query attention when fewer)
  const std::vector<int64_t> qdim = {p.B, p.NH, p.Tq, p.HS}, kdim = {p.B, p.NKV, p.Tk, p.HS};
  const std::vector<int64_t> stats_dim = {p.B, p.NH, p.Tq, 1}, stats_stride = {p.NH * p.Tq, p.Tq, 1, 1};
  auto Q = tensor("Q", kQ, qdim, {p.qs[0], p.qs[1], p.qs[2], 1});
  auto K = tensor("K", kK, kdim, {p.ks[0], p.ks[1], p.ks[2], 1});
  auto V = tensor("V", kV, kdim, {p.vs[0], p.vs[1], p.vs[2], 1});

  if (!p.backward) {
    // out = softmax(scale * Q K^T + mask) V; Stats (B,NH,Tq,1) = the row's log-sum-exp
    auto opts = fe::graph::SDPA_attributes()
                    .set_name("ndt_attention")
                    .set_generate_stats(true)
                    .set_attn_scale(static_cast<float>(p.scale));
    if (composite) opts.set_implementation(fe::AttentionImplementation_t::COMPOSITE);
    if (p.causal)  // key j visible to query i iff j <= i: the diagonal from the top-left corner
      opts.set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT).set_diagonal_band_right_bound(0);
    auto [O, Stats] = g->sdpa(Q, K, V, opts);
    O->set_output(true).set_uid(kO).set_dim(qdim).set_stride(contiguous_strides(qdim));
    Stats->set_output(true)
        .set_uid(kStats)
        .set_data_type(fe::DataType_t::FLOAT)
        .set_dim(stats_dim)
        .set_stride(stats_stride);
  } else {
    // the same forward, differentiated for a given dO (no dStats: see attention.cpp)
    auto O = tensor("O", kO, qdim, contiguous_strides(qdim));
    auto dO = tensor("dO", kDO, qdim, contiguous_strides(qdim));
    auto Stats = g->tensor(fe::graph::Tensor_attributes()
                               .set_name("Stats")
                               .set_uid(kStats)
                               .set_dim(stats_dim)
                               .set_stride(stats_stride)
                               .set_data_type(fe::DataType_t::FLOAT));
    auto opts = fe::graph::SDPA_backward_attributes()
                    .set_name("ndt_attention_backward")
                    .set_attn_scale(static_cast<float>(p.scale))
                    .set_deterministic_algorithm(deterministic);
    if (p.causal)
      opts.set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT).set_diagonal_band_right_bound(0);
    auto [dQ, dK, dV] = g->sdpa_backward(Q, K, V, O, dO, Stats, opts);
    dQ->set_output(true).set_uid(kDQ).set_dim(qdim).set_stride(contiguous_strides(qdim));
    dK->set_output(true).set_uid(kDK).set_dim(kdim).set_stride(contiguous_strides(kdim));
    dV->set_output(true).set_uid(kDV).set_dim(kdim).set_stride(contiguous_strides(kdim));
  }
  return g;
}

// Validates and builds g into an execution plan for the current device; the first failing
// step comes back as a frontend error.
fe::error_t build(fe::graph::Graph& g, cudnnHandle_t handle) {
  if (auto e = g.validate(); e.is_bad()) return e;
  if (auto e = g.build_operation_graph(handle); e.is_bad()) return e;
  if (auto e = g.create_execution_plans({fe::HeurMode_t::A}); e.is_bad()) return e;
  if (auto e = g.check_support(); e.is_bad()) return e;
  return g.build_plans();
}

// The built graph for p, from the cache or built now; nullptr (and *why) when cuDNN cannot
// build it, a result that is cached as well (no second attempt for the same key). The
// backward asks for cuDNN's deterministic algorithm first (ndtrain's kernels reduce in a
// fixed order; NDT_SDPA_DETERMINISTIC=0 skips it: faster on Hopper, dq summed with atomics)
// and takes the default one where that is not supported. Anything the
// frontend or cuDNN throws (sdpa() throws std::runtime_error when no implementation fits,
// cudnnCreate may fail on a broken install) counts as "cannot build".
const fe::graph::Graph* find_or_build(const Problem& p, std::string* why) {
  static std::mutex mutex;
  static auto* cache = new std::map<std::vector<int64_t>, GraphPtr>();      // never destroyed, as the handles
  static auto* failed = new std::map<std::vector<int64_t>, std::string>();  // and why
  std::lock_guard<std::mutex> lock(mutex);
  const std::vector<int64_t> key = p.key();
  if (auto it = cache->find(key); it != cache->end()) return it->second.get();
  if (auto it = failed->find(key); it != failed->end()) {
    if (why) *why = it->second;
    return nullptr;
  }
  std::string msg;
  // forward: the frontend's choice of node, then the composite node; backward: the
  // deterministic algorithm, then the default one
  const char* det = std::getenv("NDT_SDPA_DETERMINISTIC");
  const int first = p.backward && det && std::strcmp(det, "0") == 0 ? 1 : 0;
  for (int attempt = first; attempt < 2; ++attempt) {
    try {
      cudnnHandle_t handle = cudnn(p.device);
      DeviceGuard guard(p.device);
      GraphPtr g = p.backward ? describe(p, /*deterministic=*/attempt == 0, /*composite=*/false)
                              : describe(p, /*deterministic=*/false, /*composite=*/attempt == 1);
      fe::error_t st = build(*g, handle);
      if (st.is_good()) {
        if (p.backward && attempt > first)  // said once per shape: results vary run to run
          std::fprintf(
              stderr,
              "ndtrain: cuDNN has no deterministic SDPA backward for %s (%s); using its default one\n",
              p.str().c_str(), msg.c_str());
        return cache->emplace(key, std::move(g)).first->second.get();
      }
      msg += detail::cat(attempt > first ? "; then: " : "", st.get_message());
    } catch (const std::exception& e) {
      msg += detail::cat(attempt > first ? "; then: " : "", e.what());
    }
  }
  msg = detail::cat("cuDNN SDPA cannot build the graph for ", p.str(), ": ", msg);
  failed->emplace(key, msg);
  // said once per shape: the run goes on, slower, through the composed attention
  std::fprintf(stderr, "ndtrain: %s; attention takes the composed path for this shape\n", msg.c_str());
  if (why) *why = msg;
  return nullptr;
}

// Workspace from ndtrain's pool, ordered on the compute stream like the execution, so it can
// be freed as soon as the execution is enqueued.
class Workspace {
 public:
  Workspace(const fe::graph::Graph& g, int device) : device_(device) {
    int64_t n = 0;
    NDT_CUDNN_FE_CHECK(g.get_workspace_size(n), "workspace size");
    if (n > 0) p_ = alloc(static_cast<size_t>(n), device);
  }
  ~Workspace() {
    if (p_) free(p_, device_);
  }
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  void* get() const { return p_; }

 private:
  int device_;
  void* p_ = nullptr;
};

void execute(const Problem& p, std::unordered_map<int64_t, void*>& pack) {
  std::string why;
  const fe::graph::Graph* built = find_or_build(p, &why);
  NDT_CHECK(built, why,
            " (sdpa_prepare() should have said so; set NDT_SDPA=0 to use the composed attention)");
  const fe::graph::Graph& g = *built;
  DeviceGuard guard(p.device);
  Workspace ws(g, p.device);
  NDT_CUDNN_FE_CHECK(g.execute(cudnn(p.device), pack, ws.get()), detail::cat("execute ", p.str()));
  NDT_CUDA_CHECK_LAUNCH();
}

bool fail(std::string* why, const std::string& msg) {
  if (why) *why = msg;
  return false;
}

}  // namespace

bool sdpa_compiled() { return true; }

bool sdpa_supported(const Tensor& q, const Tensor& k, const Tensor& v, int64_t q_offset, int64_t k_offset,
                    std::string* why) {
  if (const char* env = std::getenv("NDT_SDPA"); env && std::strcmp(env, "0") == 0)
    return fail(why, "NDT_SDPA=0 in the environment");
  for (const Tensor* t : {&q, &k, &v}) {
    if (!t->device().is_cuda()) return fail(why, "tensors on " + t->device().str() + ", not cuda");
    if (t->dtype() != DType::bf16)
      return fail(why, "dtype " + std::string(dtype_name(t->dtype())) + ", not bf16");
    if (t->dim() != 4) return fail(why, "not (B, NH, T, HS): " + t->shape_str());
  }
  if (k.device() != q.device() || v.device() != q.device()) return fail(why, "q, k, v on different devices");
  // k, v may have fewer heads than q, a divisor of them (grouped-query attention)
  if (k.shape() != v.shape() || k.size(0) != q.size(0) || k.size(1) == 0 || q.size(1) % k.size(1) != 0 ||
      k.size(3) != q.size(3))
    return fail(why,
                "q " + q.shape_str() + ", k " + k.shape_str() + ", v " + v.shape_str() + " do not match");
  const int64_t Tq = q.size(2), Tk = k.size(2), HS = q.size(3);
  if (q.numel() == 0 || k.numel() == 0) return fail(why, "empty tensors");
  if (Tq == 1 && Tk == 1) return fail(why, "Tq = Tk = 1 (cuDNN's SDPA backward does not support it)");
  if (HS % 8 != 0 || HS > 128)
    return fail(why, detail::cat("head size ", HS, " (cuDNN: a multiple of 8, at most 128)"));
  for (const Tensor* t : {&q, &k, &v}) {
    if (t->strides()[3] != 1)
      return fail(why, "the head dim is not contiguous (strides " + shape_str(t->strides()) + ")");
    for (int d = 0; d < 3; ++d)
      if (t->strides()[d] % 8 != 0)
        return fail(why, "strides " + shape_str(t->strides()) + " not 16-byte aligned");
    if (reinterpret_cast<uintptr_t>(t->data_ptr()) % 16 != 0) return fail(why, "data not 16-byte aligned");
  }
  const bool all_visible = k_offset + Tk - 1 <= q_offset;
  const bool top_left_causal = q_offset == k_offset && Tq == Tk;
  if (!all_visible && !top_left_causal)
    return fail(why, detail::cat("mask (q_offset ", q_offset, ", k_offset ", k_offset, ", Tq ", Tq, ", Tk ",
                                 Tk, ") is neither causal from the top-left corner nor empty"));
  if (cudnnGetVersion() < 90000)
    return fail(why, detail::cat("cuDNN ", cudnnGetVersion(), " is older than 9.0"));
  int major = 0;
  NDT_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, q.device().index));
  if (major < 8)
    return fail(why, detail::cat("compute capability ", major, ".x (cuDNN SDPA needs 8.0 or newer)"));
  if (why) why->clear();
  return true;
}

bool sdpa_prepare(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale, bool backward,
                  std::string* why) {
  if (!find_or_build(problem_of(q, k, v, causal, scale, /*backward=*/false), why)) return false;
  if (backward && !find_or_build(problem_of(q, k, v, causal, scale, /*backward=*/true), why)) return false;
  if (why) why->clear();
  return true;
}

// q (B,NH,Tq,HS), k, v (B,NKV,Tk,HS) -> out (B,NH,Tq,HS), lse (B,NH,Tq)
void sdpa_forward(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale,
                  const Tensor& out, const Tensor& lse) {
  const int64_t B = q.size(0), NH = q.size(1), Tq = q.size(2), HS = q.size(3);
  NDT_CHECK(out.shape() == Shape({B, NH, Tq, HS}) && out.dtype() == DType::bf16 && out.is_contiguous(),
            "sdpa_forward: out must be contiguous bf16 (B, NH, Tq, HS), got ", out.desc());
  NDT_CHECK(lse.shape() == Shape({B, NH, Tq}) && lse.dtype() == DType::f32 && lse.is_contiguous(),
            "sdpa_forward: lse must be contiguous f32 (B, NH, Tq), got ", lse.desc());
  const Problem p = problem_of(q, k, v, causal, scale, /*backward=*/false);
  std::unordered_map<int64_t, void*> pack = {{kQ, q.data_ptr()},
                                             {kK, k.data_ptr()},
                                             {kV, v.data_ptr()},
                                             {kO, out.data_ptr()},
                                             {kStats, lse.data_ptr()}};
  execute(p, pack);
}

// q, k, v, out, lse, dout -> dq (B,NH,Tq,HS), dk, dv (B,NKV,Tk,HS)
void sdpa_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                   const Tensor& dout, bool causal, double scale, const Tensor& dq, const Tensor& dk,
                   const Tensor& dv) {
  for (const Tensor* t : {&out, &dout, &dq})
    NDT_CHECK(t->shape() == q.shape() && t->dtype() == DType::bf16 && t->is_contiguous(),
              "sdpa_backward: out, dout, dq must be contiguous bf16 ", q.shape_str(), ", got ", t->desc());
  for (const Tensor* t : {&dk, &dv})
    NDT_CHECK(t->shape() == k.shape() && t->dtype() == DType::bf16 && t->is_contiguous(),
              "sdpa_backward: dk, dv must be contiguous bf16 ", k.shape_str(), ", got ", t->desc());
  NDT_CHECK(lse.shape() == Shape({q.size(0), q.size(1), q.size(2)}) && lse.dtype() == DType::f32 &&
                lse.is_contiguous(),
            "sdpa_backward: lse must be contiguous f32 (B, NH, Tq), got ", lse.desc());
  const Problem p = problem_of(q, k, v, causal, scale, /*backward=*/true);
  std::unordered_map<int64_t, void*> pack = {
      {kQ, q.data_ptr()},   {kK, k.data_ptr()},     {kV, v.data_ptr()},
      {kO, out.data_ptr()}, {kDO, dout.data_ptr()}, {kStats, lse.data_ptr()},
      {kDQ, dq.data_ptr()}, {kDK, dk.data_ptr()},   {kDV, dv.data_ptr()}};
  execute(p, pack);
}

#else  // built without the cuDNN frontend headers

namespace {
[[noreturn]] void no_sdpa(const char* what) {
  NDT_FAIL(what,
           ": ndtrain was built without the cuDNN frontend headers (scripts/setup.sh fetches them "
           "into third_party/cudnn_frontend); attention uses the composed kernels");
}
}  // namespace

bool sdpa_compiled() { return false; }
bool sdpa_supported(const Tensor&, const Tensor&, const Tensor&, int64_t, int64_t, std::string* why) {
  if (why) *why = "built without the cuDNN frontend headers (NDT_WITH_CUDNN_SDPA)";
  return false;
}
bool sdpa_prepare(const Tensor&, const Tensor&, const Tensor&, bool, double, bool, std::string* why) {
  if (why) *why = "built without the cuDNN frontend headers (NDT_WITH_CUDNN_SDPA)";
  return false;
}
void sdpa_forward(const Tensor&, const Tensor&, const Tensor&, bool, double, const Tensor&, const Tensor&) {
  no_sdpa("sdpa_forward");
}
void sdpa_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                   bool, double, const Tensor&, const Tensor&, const Tensor&) {
  no_sdpa("sdpa_backward");
}

#endif

}  // namespace ndt::cuda
