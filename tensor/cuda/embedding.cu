// CUDA embedding lookup and its deterministic backward, the twins of
// tensor/cpu/embedding.cpp. Legend: N tokens, V vocab, C channels.
#include <climits>
#include <cstdint>
#include <type_traits>

#include "tensor/cuda/common.cuh"
#include "tensor/cuda/kernels.h"

namespace ndt::cuda {
namespace {

// ---- kernels ------------------------------------------------------------------------

// ids (N), table (V,C) -> out (N,C): out[n] = table[ids[n]]. E is a same-size raw type, so
// the rows are copied bit for bit. A bad id records its position in *bad (first wins).
template <typename E>
__global__ void embedding_forward_kernel(const int32_t* ids, const E* table, E* out, int64_t N, int64_t V,
                                         int64_t C, int* bad) {
  NDT_GRID_STRIDE(i, N * C) {
    const int64_t n = i / C, c = i % C, id = ids[n];
    if (id < 0 || id >= V) {
      if (c == 0) atomicMin(bad, static_cast<int>(n));
      out[i] = E{};
      continue;
    }
    out[i] = table[id * C + c];
  }
}

// In the forward out[n] = table[ids[n]]; so dtable[v] = sum_{n: ids[n]==v} dout[n].
// Thread c owns column c of acc (V,C) (zeroed) and walks n = 0..N-1 in order: no two
// threads touch one element, and the order is fixed, so the result is deterministic.
template <typename T>
__global__ void embedding_backward_kernel(const int32_t* ids, const T* dout, float* acc, int64_t N, int64_t V,
                                          int64_t C) {
  NDT_GRID_STRIDE(c, C) {
    for (int64_t n = 0; n < N; ++n) {
      const int64_t id = ids[n];
      if (id >= 0 && id < V) acc[id * C + c] += load(dout[n * C + c]);
    }
  }
}

}  // namespace

// ---- launchers ----------------------------------------------------------------------

void embedding_forward(const Tensor& ids, const Tensor& table, const Tensor& out) {
  const int64_t N = ids.numel(), V = table.size(0), C = table.size(1);
  if (N == 0 || C == 0) return;
  NDT_CHECK(ids.dtype() == DType::i32, "embedding: ids must be int32, got ", ids.desc());
  NDT_CHECK(N < INT_MAX, "embedding: too many ids (", N, ")");
  Launch L(ids);
  Tensor bad = Tensor::full({1}, INT_MAX, DType::i32, ids.device());
  auto launch = [&](auto tag) {
    using E = decltype(tag);
    embedding_forward_kernel<E><<<grid_for(N * C), kThreads, 0, L.stream>>>(
        ids.data<int32_t>(), static_cast<const E*>(table.data_ptr()), static_cast<E*>(out.data_ptr()), N, V,
        C, bad.data<int32_t>());
    NDT_CUDA_CHECK_LAUNCH();
  };
  switch (dtype_size(table.dtype())) {
    case 2:
      launch(uint16_t{});
      break;
    case 4:
      launch(uint32_t{});
      break;
    default:
      launch(uint64_t{});
      break;
  }
  const int64_t n = bad.to_vector<int32_t>()[0];  // read as an integer; synchronizes
  if (n != INT_MAX) {
    const int64_t id = static_cast<int64_t>(ids.view({-1}).narrow(0, n, 1).item());
    NDT_FAIL("embedding: id ", id, " at position ", n, " is outside the table's ", V, " rows");
  }
}

void embedding_backward(const Tensor& ids, const Tensor& dout, const Tensor& dtable) {
  const int64_t N = ids.numel(), V = dtable.size(0), C = dtable.size(1);
  if (V * C == 0) return;
  Launch L(ids);
  dispatch_float(dtable.dtype(), "embedding_backward", [&](auto tag) {
    using T = decltype(tag);
    // f32 accumulates in place; bf16 in an f32 table, rounded once at the end
    constexpr bool kF32 = std::is_same_v<T, float>;
    Tensor acc = kF32 ? dtable : Tensor::empty({V, C}, DType::f32, dtable.device());
    fill(acc, 0.0);
    if (N > 0) {
      embedding_backward_kernel<T><<<grid_for(C), kThreads, 0, L.stream>>>(
          ids.data<int32_t>(), static_cast<const T*>(dout.data_ptr()), acc.data<float>(), N, V, C);
      NDT_CUDA_CHECK_LAUNCH();
    }
    if (!kF32) copy(dtable, acc);
  });
}

}  // namespace ndt::cuda
