// Embedding lookup. Legend: V vocab, C channels.
#include "autograd/ops/common.h"

namespace ndt {
using namespace ops_detail;

// ids (...) i32, table (V, C) rows [v_start, v_start + V) -> (..., C)
Tensor embedding(const Tensor& ids_in, const Tensor& table_in, int64_t v_start, int64_t v_total) {
  check_same("embedding", {&table_in});
  NDT_CHECK(ids_in.dtype() == DType::i32, "embedding: ids must be int32, got ", ids_in.desc());
  NDT_CHECK(table_in.dim() == 2, "embedding: table must be (V, C), got ", table_in.shape_str());
  NDT_CHECK(ids_in.device() == table_in.device(), "embedding: ids on ", ids_in.device().str(),
            " but table on ", table_in.device().str());
  Tensor ids = ids_in.contiguous(), table = table_in.contiguous();
  Shape shape = ids.shape();
  shape.push_back(table.size(1));
  Tensor out = Tensor::empty(shape, table.dtype(), table.device());
  kernels::embedding_forward(ids, table, out, v_start, v_total);
  autograd::record("embedding", {out}, {table_in},
                   [ids, v_start, tshape = table.shape(), dt = table.dtype(),
                    dev = table.device()](const Grads& g) -> Grads {
                     // forward: out[n] = table[ids[n] - v_start] (or 0); so dtable[v] = sum of dout[n]
                     // over n with ids[n] == v_start + v
                     Tensor dtable = Tensor::empty(tshape, dt, dev);
                     kernels::embedding_backward(ids, g[0].contiguous(), dtable, v_start);
                     return {dtable};
                   });
  return out;
}

}  // namespace ndt
