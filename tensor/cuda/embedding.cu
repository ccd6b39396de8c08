// CUDA embedding lookup and its deterministic backward, the twins of
// tensor/cpu/embedding.cpp. Legend: N tokens, V vocab, C channels.
#include <algorithm>
#include <climits>
#include <cstdint>
#include <cub/device/device_radix_sort.cuh>

#include "tensor/cuda/common.cuh"
#include "tensor/cuda/kernels.h"

namespace ndt::cuda {
namespace {

// ---- kernels ------------------------------------------------------------------------

// ids (N), table (V,C) rows [v_start, v_start + V) of v_total -> out (N,C):
// out[n] = table[ids[n] - v_start], a zero row for another shard's id. E is a same-size raw
// type, so the rows are copied bit for bit. An id outside [0, v_total) is recorded
// (common.cuh) and gives a zero row.
template <typename E>
__global__ void embedding_forward_kernel(const int32_t* ids, const E* table, E* out, int64_t N, int64_t V,
                                         int64_t C, int64_t v_start, int64_t v_total, ErrorRecord* err) {
  NDT_GRID_STRIDE(i, N * C) {
    const int64_t n = i / C, c = i % C, id = ids[n], j = id - v_start;
    if (id < 0 || id >= v_total) {
      if (c == 0) record_error(err, KernelError::kEmbeddingId, n, id, v_total);
      out[i] = E{};
      continue;
    }
    out[i] = j >= 0 && j < V ? table[j * C + c] : E{};
  }
}

// positions (n) = 0, 1, ..., n-1
__global__ void iota_kernel(int32_t* positions, int64_t n) {
  NDT_GRID_STRIDE(i, n) positions[i] = static_cast<int32_t>(i);
}

// In the forward out[n] = table[ids[n]]; so dtable[v] = sum_{n: ids[n]==v} dout[n].
// Bucketed: the ids sorted stably with their positions, (sorted_ids, order) (N), group the
// uses of each id, in ascending position. Blocks (i, tile) own sorted entry i; if it starts
// a run of equal ids, their threads (one per column of the tile) sum the run's dout rows in
// that order and write the row of the table once. No atomics, the CPU's order: deterministic, and bit-equal
// to the CPU in f32. Rows no id uses were zeroed before. Ids outside the shard's rows [v_start, v_start + V)
// are skipped (another shard's, or bad ones the forward reported).
template <typename T>
__global__ void embedding_backward_kernel(const int32_t* sorted_ids, const int32_t* order, const T* dout,
                                          T* dtable, int64_t N, int64_t V, int64_t C, int64_t v_start) {
  const int64_t i = blockIdx.x;
  const int32_t id = sorted_ids[i];
  const int64_t row = static_cast<int64_t>(id) - v_start;
  if ((i > 0 && sorted_ids[i - 1] == id) || row < 0 || row >= V) return;  // not the start of a run
  int64_t end = i + 1;
  while (end < N && sorted_ids[end] == id) ++end;
  // blockIdx.y picks a tile of columns: a frequent id's long run is summed by C / blockDim.x
  // blocks side by side, each thread one column
  const int64_t c = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float acc = 0.0f;
  for (int64_t j = i; j < end; ++j) acc += load(dout[static_cast<int64_t>(order[j]) * C + c]);
  dtable[row * C + c] = store<T>(acc);
}

}  // namespace

// ---- launchers ----------------------------------------------------------------------

void embedding_forward(const Tensor& ids, const Tensor& table, const Tensor& out, int64_t v_start,
                       int64_t v_total) {
  const int64_t N = ids.numel(), V = table.size(0), C = table.size(1);
  if (N == 0 || C == 0) return;
  NDT_CHECK(ids.dtype() == DType::i32, "embedding: ids must be int32, got ", ids.desc());
  NDT_CHECK(N < INT_MAX, "embedding: too many ids (", N, ")");
  Launch L(ids);
  ErrorRecord* err = error_record(L.device);  // read at the next synchronization
  auto launch = [&](auto tag) {
    using E = decltype(tag);
    embedding_forward_kernel<E><<<grid_for(N * C), kThreads, 0, L.stream>>>(
        ids.data<int32_t>(), static_cast<const E*>(table.data_ptr()), static_cast<E*>(out.data_ptr()), N, V,
        C, v_start, v_total, err);
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
}

void embedding_backward(const Tensor& ids, const Tensor& dout, const Tensor& dtable, int64_t v_start) {
  const int64_t N = ids.numel(), V = dtable.size(0), C = dtable.size(1);
  if (V * C == 0) return;
  NDT_CHECK(ids.dtype() == DType::i32, "embedding_backward: ids must be int32, got ", ids.desc());
  NDT_CHECK(N < INT_MAX && N <= UINT_MAX && C / 32 < 65535, "embedding_backward: too many ids (", N,
            ") or columns (", C, ")");
  Launch L(ids);
  fill(dtable, 0.0);  // rows no id uses
  if (N == 0) return;
  // sort (id, position) pairs by id, stably: CUB's radix sort, its scratch from our pool
  Tensor positions = Tensor::empty({N}, DType::i32, ids.device());
  Tensor sorted_ids = Tensor::empty({N}, DType::i32, ids.device()),
         order = Tensor::empty({N}, DType::i32, ids.device());
  iota_kernel<<<grid_for(N), kThreads, 0, L.stream>>>(positions.data<int32_t>(), N);
  NDT_CUDA_CHECK_LAUNCH();
  size_t scratch_bytes = 0;
  NDT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
      nullptr, scratch_bytes, ids.data<int32_t>(), sorted_ids.data<int32_t>(), positions.data<int32_t>(),
      order.data<int32_t>(), static_cast<int>(N), 0, 32, L.stream));
  Tensor scratch = Tensor::empty({static_cast<int64_t>(scratch_bytes / 2 + 1)}, DType::u16, ids.device());
  NDT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
      scratch.data_ptr(), scratch_bytes, ids.data<int32_t>(), sorted_ids.data<int32_t>(),
      positions.data<int32_t>(), order.data<int32_t>(), static_cast<int>(N), 0, 32, L.stream));
  dispatch_float(dtable.dtype(), "embedding_backward", [&](auto tag) {
    using T = decltype(tag);
    const int threads = static_cast<int>(std::clamp<int64_t>((C + 31) / 32 * 32, 32, 128));
    const dim3 grid(static_cast<unsigned>(N), static_cast<unsigned>((C + threads - 1) / threads));
    embedding_backward_kernel<T><<<grid, threads, 0, L.stream>>>(
        sorted_ids.data<int32_t>(), order.data<int32_t>(), static_cast<const T*>(dout.data_ptr()),
        static_cast<T*>(dtable.data_ptr()), N, V, C, v_start);
    NDT_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace ndt::cuda
