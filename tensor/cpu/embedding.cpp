// CPU embedding lookup and its deterministic scatter-add backward.
// Legend: N tokens, V vocab, C channels.
#include <algorithm>
#include <cstring>

#include "tensor/cpu/dispatch.h"
#include "tensor/cpu/kernels.h"

namespace ndt::cpu {

// ids (N), table (V,C) rows [v_start, v_start + V) of v_total -> out (N,C):
// out[n] = table[ids[n] - v_start], a zero row for the ids of other shards
void embedding_forward(const Tensor& ids, const Tensor& table, const Tensor& out, int64_t v_start,
                       int64_t v_total) {
  const int64_t N = ids.numel(), V = table.size(0), C = table.size(1);
  const int32_t* pid = ids.data<int32_t>();
  for (int64_t n = 0; n < N; ++n)
    NDT_CHECK(pid[n] >= 0 && pid[n] < v_total, "embedding: id ", pid[n], " at position ", n,
              " is outside the table's ", v_total, " rows");  // the whole table's, when sharded
  const size_t row_bytes = C * dtype_size(table.dtype());
  const char* src = static_cast<const char*>(table.data_ptr());
  char* dst = static_cast<char*>(out.data_ptr());
#pragma omp parallel for schedule(static) if (N * C > 65536)
  for (int64_t n = 0; n < N; ++n) {
    const int64_t j = pid[n] - v_start;
    if (j >= 0 && j < V)
      std::memcpy(dst + n * row_bytes, src + j * row_bytes, row_bytes);
    else
      std::memset(dst + n * row_bytes, 0, row_bytes);  // another shard's id
  }
}

// In the forward out[n] = table[ids[n] - v_start]; so dtable[v] = sum_{n: ids[n]==v_start+v}
// dout[n]. Columns are split across threads and every thread walks n in order: deterministic.
void embedding_backward(const Tensor& ids, const Tensor& dout, const Tensor& dtable, int64_t v_start) {
  dispatch_float(dtable.dtype(), "embedding_backward", [&](auto tag) {
    using T = decltype(tag);
    const int64_t N = ids.numel(), V = dtable.size(0), C = dtable.size(1);
    const int32_t* pid = ids.data<int32_t>();
    const T* pd = static_cast<const T*>(dout.data_ptr());
    // accumulate in the accumulator type: in place for f32/f64, in an f32 buffer for bf16
    // (rounded once at the end)
    using A = acc_t<T>;
    Tensor buf;
    A* pa;
    if constexpr (std::is_same_v<T, A>) {
      pa = static_cast<A*>(dtable.data_ptr());
      std::memset(static_cast<void*>(pa), 0, V * C * sizeof(A));
    } else {
      buf = Tensor::zeros({V, C}, DType::f32);
      pa = buf.data<float>();
    }
#pragma omp parallel for schedule(static) if (N * C > 65536)
    for (int64_t c0 = 0; c0 < C; c0 += 64)
      for (int64_t n = 0; n < N; ++n)
        if (const int64_t j = pid[n] - v_start; j >= 0 && j < V)
          for (int64_t c = c0; c < std::min(C, c0 + 64); ++c) pa[j * C + c] += load(pd[n * C + c]);
    if constexpr (!std::is_same_v<T, A>) copy(dtable, buf);
  });
}

}  // namespace ndt::cpu
