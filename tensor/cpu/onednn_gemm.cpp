// bf16 GEMMs on the CPU's bf16 instructions (AVX512-BF16's dot products, AMX's tiles) through
// oneDNN's matmul: bf16 operands, f32 accumulation, one rounding of the result to bf16 (the
// GPU's arithmetic). Debian's OpenBLAS has no bf16 GEMM, and converting both operands to f32
// for sgemm runs at f32's speed; oneDNN's bf16 kernels run about twice as fast as the best
// sgemm on a CPU with AVX512-BF16 (docs/PERFORMANCE.md, "On a Zen 5 with AVX512-BF16").
//
// Where the CPU has no bf16 instructions oneDNN would emulate them, slower than the f32 path,
// so bf16_gemm_native() says whether oneDNN's implementation for a bf16 matmul is a native
// one; tensor/cpu/matmul.cpp uses it only then (or when NDT_BF16_GEMM says so).
//
//   c (batch, m, n) = alpha op(a) (batch, m, k) @ op(b) (batch or shared, k, n) [+ bias (n)]
//                     + beta c
//
// f32 GEMMs can go the same way (f32_gemm_on_onednn()): on an AMD Zen 4 with AVX-512,
// oneDNN's f32 matmul (its brgemm kernels) runs a GPT step's GEMMs 4-12% faster than Debian's
// OpenBLAS (docs/PERFORMANCE.md, "Which BLAS on this CPU").
//
// Primitives are built once per shape and kept in a small table: building one (oneDNN picks
// and JIT-compiles a kernel) costs far more than running a small one.
#include "tensor/cpu/onednn_gemm.h"

#if NDT_WITH_ONEDNN
#include <oneapi/dnnl/dnnl.hpp>

#include <omp.h>

#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>
#endif

#include <cstdlib>
#include <string>

#include "tensor/error.h"
#include "tensor/threads.h"

namespace ndt::cpu {

#if NDT_WITH_ONEDNN
namespace {

using dnnl::memory;

// Everything a primitive depends on; the data pointers are given at each call.
struct Key {
  int64_t batch, m, n, k;
  bool ta, tb, b_shared, has_bias, dst_f32;
  float alpha, beta;
  bool src_f32;   // f32 operands (and bias, and result), else bf16
  bool any_rows;  // 2-D, a's row count (m, or k where a is transposed) given at each call (0 here)
  // any_rows: the threads it runs on, 1 inside a parallel region (each group of a grouped GEMM
  // on one thread: cpu::grouped_gemm). oneDNN lays its work out for the threads it was built
  // for, so a primitive runs where there are as many.
  int threads = 0;
  auto tie() const {
    return std::tie(batch, m, n, k, ta, tb, b_shared, has_bias, dst_f32, alpha, beta, src_f32, any_rows,
                    threads);
  }
  bool operator<(const Key& o) const { return tie() < o.tie(); }
};

// The CPU engine and the primitives built so far. oneDNN keeps its own cache too, but a
// primitive descriptor costs an implementation search each time it is made.
struct Primitive {
  dnnl::matmul matmul;
  memory::desc a, b, c, bias;
  memory::desc scratch;  // any_rows: the scratchpad each call brings (user mode), maybe empty
};
struct Library {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  std::mutex mutex;
  std::map<Key, Primitive> primitives;
};

Library& library() {
  static Library lib;
  return lib;
}

// (batch, rows, cols) of a row-major (rows, cols) matrix per batch, read as its transpose
// when trans: dims (batch, r, c) of op(x), strides of the stored layout.
memory::desc matrix(int64_t batch, int64_t r, int64_t c, bool trans, bool shared, memory::data_type t) {
  const int64_t batch_stride = shared ? 0 : r * c;
  const memory::dims strides = trans ? memory::dims{batch_stride, 1, r} : memory::dims{batch_stride, c, 1};
  return memory::desc({shared ? 1 : batch, r, c}, t, strides);
}

// (r, c) of a 2-D row-major (r, c) matrix, read as its transpose when trans: op(x)'s dims,
// the stored layout's strides (either may be DNNL_RUNTIME_DIM_VAL: given at each call)
memory::desc matrix2d(memory::dim r, memory::dim c, bool trans, memory::data_type t) {
  return memory::desc({r, c}, t, trans ? memory::dims{1, r} : memory::dims{c, 1});
}

// alpha as the output scale, beta as a sum post-op
dnnl::primitive_attr attributes(const Key& key) {
  dnnl::primitive_attr attr;
  if (key.alpha != 1.0f) attr.set_output_scales(0, {key.alpha});
  if (key.beta != 0.0f) {
    dnnl::post_ops ops;
    ops.append_sum(key.beta);
    attr.set_post_ops(ops);
  }
  return attr;
}

// f32, 2-D, a's row count left to each call: op(a) (m, k) has m rows, or k where a is read
// transposed. One primitive serves every row count (oneDNN's gemm:jit kernels).
// The scratchpad in user mode: each call brings its own, so that the threads of a parallel
// region may run one primitive at once (oneDNN's own scratchpad is shared by all primitives
// and ties each to the thread that built it).
dnnl::matmul::primitive_desc describe_any_rows(const Key& key, const dnnl::engine& engine) {
  const memory::dim any = DNNL_RUNTIME_DIM_VAL, m = key.ta ? key.m : any, k = key.ta ? any : key.k;
  using dt = memory::data_type;
  const dt t = key.src_f32 ? dt::f32 : dt::bf16, tc = key.dst_f32 ? dt::f32 : dt::bf16;
  dnnl::primitive_attr attr = attributes(key);
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return {dnnl::matmul::desc(matrix2d(m, k, key.ta, t), matrix2d(k, key.n, key.tb, t),
                             matrix2d(m, key.n, false, tc)),
          attr, engine};
}

dnnl::matmul::primitive_desc describe(const Key& key, const dnnl::engine& engine) {
  if (key.any_rows) return describe_any_rows(key, engine);
  using dt = memory::data_type;
  const dt src = key.src_f32 ? dt::f32 : dt::bf16;
  const memory::desc a = matrix(key.batch, key.m, key.k, key.ta, false, src);
  const memory::desc b = matrix(key.batch, key.k, key.n, key.tb, key.b_shared, src);
  const memory::desc c = matrix(key.batch, key.m, key.n, false, false, key.dst_f32 ? dt::f32 : dt::bf16);
  const dnnl::primitive_attr attr = attributes(key);
  if (key.has_bias) {
    const memory::desc bias({1, 1, key.n}, src, memory::dims{key.n, key.n, 1});
    return {dnnl::matmul::desc(a, b, bias, c), attr, engine};
  }
  return {dnnl::matmul::desc(a, b, c), attr, engine};
}

// A copy (oneDNN's objects are reference-counted handles), so that the table may be emptied
// while another thread runs one: a program that multiplies ever new shapes (prompts of every
// length) keeps at most kMaxPrimitives of them.
constexpr size_t kMaxPrimitives = 1024;
Primitive primitive(Library& lib, const Key& key) {
  std::lock_guard<std::mutex> lock(lib.mutex);
  auto it = lib.primitives.find(key);
  if (it == lib.primitives.end()) {
    if (lib.primitives.size() >= kMaxPrimitives) lib.primitives.clear();
    const dnnl::matmul::primitive_desc pd = describe(key, lib.engine);
    Primitive p{dnnl::matmul(pd),
                pd.src_desc(),
                pd.weights_desc(),
                pd.dst_desc(),
                key.has_bias ? pd.bias_desc() : memory::desc(),
                key.any_rows ? pd.scratchpad_desc() : memory::desc()};
    it = lib.primitives.emplace(key, std::move(p)).first;
  }
  return it->second;
}

// What oneDNN would run for a matmul of these operands on this CPU: for bf16
// "brg:avx512_core_bf16", "brg:avx512_core_amx", ... or an emulation ("ref:any", "gemm:jit"
// over f32 conversions); for f32 "brg:avx512_core", "gemm:jit", ...
std::string implementation(bool f32) {
  try {
    const Key probe{1, 256, 256, 256, false, false, false, false, f32, 1.0f, 0.0f, f32, false, 0};
    return describe(probe, library().engine).impl_info_str();
  } catch (const dnnl::error& e) {
    return std::string("none (") + e.what() + ")";
  }
}
std::string bf16_implementation() { return implementation(false); }

bool amd_cpu() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  return __builtin_cpu_is("amd");
#else
  return false;
#endif
}

}  // namespace

// Measured where oneDNN runs f32 on its AVX-512 brgemm kernels on an AMD CPU (a Zen 4: the
// GEMM list of a step 1.04-1.12x faster than OpenBLAS's SkylakeX kernel). Not measured on
// Intel CPUs, so OpenBLAS stays there (NDT_F32_GEMM=onednn tries it).
bool f32_gemm_prefers_onednn() {
  static const bool prefers = amd_cpu() && implementation(true).find("brg:avx512") != std::string::npos;
  return prefers;
}

std::string f32_gemm_library() {
  return f32_gemm_on_onednn() ? "oneDNN " + implementation(true) : "OpenBLAS kernel " + blas_core();
}

bool bf16_gemm_native() {
  static const bool native = [] {
    const std::string impl = bf16_implementation();
    return impl.find("bf16") != std::string::npos || impl.find("amx") != std::string::npos;
  }();
  return native;
}

// "none (...)" where oneDNN has no bf16 matmul for this CPU (one without AVX-512: its probe
// fails), as where ndtrain was built without oneDNN: the bf16 GEMMs then run through f32.
std::string bf16_gemm_library() {
  const std::string impl = bf16_implementation();
  return impl.rfind("none", 0) == 0 ? impl + ", in oneDNN on this CPU" : "oneDNN " + impl;
}

void onednn_gemm(const Tensor& a, bool ta, const Tensor& b, bool tb, const Tensor& c, float alpha, float beta,
                 const Tensor& bias) {
  const DType src = a.dtype();
  NDT_CHECK((src == DType::bf16 || src == DType::f32) && b.dtype() == src &&
                (c.dtype() == src || c.dtype() == DType::f32) && (!bias.defined() || bias.dtype() == src),
            "onednn_gemm: expected bf16 or f32 operands of one dtype, the result in theirs or f32");
  Key key{};
  key.src_f32 = src == DType::f32;
  key.batch = a.dim() == 3 ? a.size(0) : 1;
  key.m = ta ? a.size(-1) : a.size(-2);
  key.k = ta ? a.size(-2) : a.size(-1);
  key.n = tb ? b.size(-2) : b.size(-1);
  key.b_shared = b.dim() == 2 && a.dim() == 3;
  if (key.b_shared && !ta) {  // one GEMM over (batch*m, k) rows, as for sgemm
    key.m *= key.batch;
    key.batch = 1;
    key.b_shared = false;
  }
  key.ta = ta;
  key.tb = tb;
  key.has_bias = bias.defined();
  key.dst_f32 = c.dtype() == DType::f32;
  key.alpha = alpha;
  key.beta = beta;
  Library& lib = library();
  const Primitive p = primitive(lib, key);
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, memory(p.a, lib.engine, a.data_ptr())},
                                       {DNNL_ARG_WEIGHTS, memory(p.b, lib.engine, b.data_ptr())},
                                       {DNNL_ARG_DST, memory(p.c, lib.engine, c.data_ptr())}};
  if (key.has_bias) args.emplace(DNNL_ARG_BIAS, memory(p.bias, lib.engine, bias.data_ptr()));
  dnnl::stream stream(lib.engine);
  p.matmul.execute(stream, args);
  stream.wait();
}

void onednn_gemm_any_rows(const Tensor& a, bool ta, const Tensor& b, bool tb, const Tensor& c, float alpha,
                          float beta) {
  const bool f32 = a.dtype() == DType::f32;
  NDT_CHECK(a.dtype() == b.dtype() && (f32 ? c.dtype() == DType::f32 : a.dtype() == DType::bf16) &&
                a.dim() == 2 && b.dim() == 2 && c.dim() == 2,
            "onednn_gemm_any_rows: expected 2-D f32, or bf16 operands, got ", a.desc(), ", ", b.desc(), ", ",
            c.desc());
  const int64_t m = ta ? a.size(1) : a.size(0), k = ta ? a.size(0) : a.size(1),
                n = tb ? b.size(0) : b.size(1);
  Key key{};
  key.batch = 1, key.m = ta ? m : 0, key.k = ta ? 0 : k, key.n = n;  // a's row count: not in the key
  key.ta = ta, key.tb = tb, key.dst_f32 = c.dtype() == DType::f32, key.src_f32 = f32, key.any_rows = true;
  key.alpha = alpha, key.beta = beta;
  key.threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  Library& lib = library();
  const Primitive p = primitive(lib, key);
  using dt = memory::data_type;
  const dt t = f32 ? dt::f32 : dt::bf16, tc = key.dst_f32 ? dt::f32 : dt::bf16;
  std::unordered_map<int, memory> args{
      {DNNL_ARG_SRC, memory(matrix2d(m, k, ta, t), lib.engine, a.data_ptr())},
      {DNNL_ARG_WEIGHTS, memory(matrix2d(k, n, tb, t), lib.engine, b.data_ptr())},
      {DNNL_ARG_DST, memory(matrix2d(m, n, false, tc), lib.engine, c.data_ptr())}};
  thread_local std::vector<char> scratch;  // this thread's, reused from call to call
  if (const size_t bytes = p.scratch.get_size(); bytes > 0) {
    if (scratch.size() < bytes) scratch.resize(bytes);
    args.emplace(DNNL_ARG_SCRATCHPAD, memory(p.scratch, lib.engine, scratch.data()));
  }
  dnnl::stream stream(lib.engine);
  p.matmul.execute(stream, args);
  stream.wait();
}

#else  // built without oneDNN

bool bf16_gemm_native() { return false; }
std::string bf16_gemm_library() { return "none (built without oneDNN)"; }
bool f32_gemm_prefers_onednn() { return false; }
std::string f32_gemm_library() {
  return f32_gemm_on_onednn() ? "oneDNN (not in this build)" : "OpenBLAS kernel " + blas_core();
}
void onednn_gemm(const Tensor&, bool, const Tensor&, bool, const Tensor&, float, float, const Tensor&) {
  NDT_CHECK(false, "onednn_gemm: this build has no oneDNN (install libdnnl-dev and configure again)");
}
void onednn_gemm_any_rows(const Tensor&, bool, const Tensor&, bool, const Tensor&, float, float) {
  NDT_CHECK(false,
            "onednn_gemm_any_rows: this build has no oneDNN (install libdnnl-dev and configure again)");
}

#endif

bool bf16_gemm_on_onednn() {
  const char* env = std::getenv("NDT_BF16_GEMM");
  const std::string choice = env ? env : "";
  if (choice == "f32") return false;
  if (choice == "onednn") return true;
  NDT_CHECK(choice.empty() || choice == "auto", "NDT_BF16_GEMM=", choice, ": expected auto, onednn or f32");
  return bf16_gemm_native();
}

bool f32_gemm_on_onednn() {
  const char* env = std::getenv("NDT_F32_GEMM");
  const std::string choice = env ? env : "";
  if (choice == "openblas") return false;
#if NDT_WITH_ONEDNN
  if (choice == "onednn") return true;
#else
  NDT_CHECK(choice != "onednn",
            "NDT_F32_GEMM=onednn: this build has no oneDNN (install libdnnl-dev and configure again)");
#endif
  NDT_CHECK(choice.empty() || choice == "auto", "NDT_F32_GEMM=", choice,
            ": expected auto, onednn or openblas");
  return f32_gemm_prefers_onednn();
}

std::string gemm_libraries() {
  std::string s = "OpenBLAS kernel " + blas_core();
  if (f32_gemm_on_onednn()) s += ", f32 GEMMs on " + f32_gemm_library();
  return s;
}

}  // namespace ndt::cpu
