// The NCCL backend (see dist/comm/nccl.h): the one file of dist/ with CUDA and NCCL headers.
#include "dist/comm/nccl.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "tensor/cuda/runtime.h"

namespace ndt::dist {
namespace {

#define NDT_NCCL_CHECK(call, comm_name, rank)                                           \
  do {                                                                                  \
    const ncclResult_t r_ = (call);                                                     \
    NDT_CHECK(r_ == ncclSuccess, #call, " failed on ", comm_name, " rank ", rank, ": ", \
              ncclGetErrorString(r_), " (", __FILE__, ":", __LINE__, ")");              \
  } while (0)

#define NDT_CUDART_CHECK(call)                                                                              \
  do {                                                                                                      \
    const cudaError_t e_ = (call);                                                                          \
    NDT_CHECK(e_ == cudaSuccess, #call, " failed: ", cudaGetErrorString(e_), " (", __FILE__, ":", __LINE__, \
              ")");                                                                                         \
  } while (0)

ncclDataType_t nccl_type(DType d) {
  switch (d) {
    case DType::f32:
      return ncclFloat32;
    case DType::f64:
      return ncclFloat64;
    case DType::bf16:
      return ncclBfloat16;
    case DType::i32:
      return ncclInt32;
    case DType::u16:
      break;
  }
  NDT_FAIL("NCCL: dtype ", dtype_name(d), " is not supported");
}

ncclRedOp_t nccl_op(ReduceOp op) {
  return op == ReduceOp::kSum ? ncclSum : op == ReduceOp::kAvg ? ncclAvg : ncclMax;
}

cudaStream_t compute(int device) { return static_cast<cudaStream_t>(cuda::compute_stream(device)); }

// Done when the event recorded after the collective on the NCCL stream has fired. wait()
// makes the compute stream wait for it; the tensors stay alive until then.
class NcclWork : public Work {
 public:
  NcclWork(cudaEvent_t done, int device, std::vector<Tensor> keep)
      : done_(done), device_(device), keep_(std::move(keep)) {}
  ~NcclWork() override {
    try {
      wait();  // the buffers may be freed on the compute stream only after the collective
    } catch (...) {
    }
    cudaEventDestroy(done_);
  }
  void wait() override {
    if (waited_) return;
    NDT_CUDART_CHECK(cudaStreamWaitEvent(compute(device_), done_, 0));
    waited_ = true;
  }
  bool done() override { return cudaEventQuery(done_) == cudaSuccess; }

 private:
  cudaEvent_t done_;
  int device_;
  std::vector<Tensor> keep_;
  bool waited_ = false;
};

class NcclCommunicator : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, int rank, int size, std::string name, int device,
                   std::shared_ptr<Communicator> group)
      : Communicator(rank, size, std::move(name)), comm_(comm), device_(device), group_(std::move(group)) {
    NDT_CUDART_CHECK(cudaSetDevice(device_));
    NDT_CUDART_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  ~NcclCommunicator() override {
    cudaStreamSynchronize(stream_);
    ncclCommDestroy(comm_);
    cudaStreamDestroy(stream_);
  }
  std::string backend() const override { return "nccl"; }
  Device device() const override { return Device::cuda(device_); }

  WorkPtr all_reduce(const Tensor& t, ReduceOp op) override {
    check_one("all_reduce", t);
    count(CommKind::kAllReduce, size_ == 1 ? 0 : 2 * (size_ - 1) * static_cast<int64_t>(t.nbytes()) / size_);
    return launch({t}, [&](cudaStream_t s) {
      return ncclAllReduce(t.data_ptr(), t.data_ptr(), static_cast<size_t>(t.numel()), nccl_type(t.dtype()),
                           nccl_op(op), comm_, s);
    });
  }
  WorkPtr all_gather(const Tensor& out, const Tensor& in) override {
    check_same("all_gather", in, out, size_, 1);
    count(CommKind::kAllGather, static_cast<int64_t>(size_ - 1) * static_cast<int64_t>(in.nbytes()));
    return launch({out, in}, [&](cudaStream_t s) {
      return ncclAllGather(in.data_ptr(), out.data_ptr(), static_cast<size_t>(in.numel()),
                           nccl_type(in.dtype()), comm_, s);
    });
  }
  WorkPtr reduce_scatter(const Tensor& out, const Tensor& in, ReduceOp op) override {
    check_same("reduce_scatter", out, in, size_, 1);
    NDT_CHECK(op != ReduceOp::kMax, name_, ".reduce_scatter: max is not supported (sum or mean)");
    count(CommKind::kReduceScatter, static_cast<int64_t>(size_ - 1) * static_cast<int64_t>(out.nbytes()));
    return launch({out, in}, [&](cudaStream_t s) {
      return ncclReduceScatter(in.data_ptr(), out.data_ptr(), static_cast<size_t>(out.numel()),
                               nccl_type(in.dtype()), nccl_op(op), comm_, s);
    });
  }
  WorkPtr broadcast(const Tensor& t, int root) override {
    check_one("broadcast", t);
    count(CommKind::kBroadcast, rank_ == root && size_ > 1 ? static_cast<int64_t>(t.nbytes()) : 0);
    return launch({t}, [&](cudaStream_t s) {
      return ncclBroadcast(t.data_ptr(), t.data_ptr(), static_cast<size_t>(t.numel()), nccl_type(t.dtype()),
                           root, comm_, s);
    });
  }
  WorkPtr send(const Tensor& t, int peer) override {
    check_one("send", t);
    check_peer("send", peer);
    count(CommKind::kSend, static_cast<int64_t>(t.nbytes()), peer);
    return launch({t}, [&](cudaStream_t s) {
      return ncclSend(t.data_ptr(), static_cast<size_t>(t.numel()), nccl_type(t.dtype()), peer, comm_, s);
    });
  }
  WorkPtr recv(const Tensor& t, int peer) override {
    check_one("recv", t);
    check_peer("recv", peer);
    count(CommKind::kRecv, 0);
    return launch({t}, [&](cudaStream_t s) {
      return ncclRecv(t.data_ptr(), static_cast<size_t>(t.numel()), nccl_type(t.dtype()), peer, comm_, s);
    });
  }
  WorkPtr sendrecv(const Tensor& out_t, int to, const Tensor& in_t, int from) override {
    check_one("sendrecv", out_t);
    check_one("sendrecv", in_t);
    check_peer("sendrecv", to);
    check_peer("sendrecv", from);
    count(CommKind::kSend, static_cast<int64_t>(out_t.nbytes()), to);
    count(CommKind::kRecv, 0);
    return launch({out_t, in_t}, [&](cudaStream_t s) {
      // one group: NCCL runs the send and the receive together (each alone would wait for its peer)
      ncclResult_t r = ncclGroupStart();
      if (r != ncclSuccess) return r;
      const ncclResult_t a = ncclSend(out_t.data_ptr(), static_cast<size_t>(out_t.numel()),
                                      nccl_type(out_t.dtype()), to, comm_, s);
      const ncclResult_t b = ncclRecv(in_t.data_ptr(), static_cast<size_t>(in_t.numel()),
                                      nccl_type(in_t.dtype()), from, comm_, s);
      r = ncclGroupEnd();  // always closed, even after an error inside
      return a != ncclSuccess ? a : b != ncclSuccess ? b : r;
    });
  }
  void barrier() override {
    Tensor one = Tensor::zeros({1}, DType::f32, Device::cuda(device_));
    all_reduce(one, ReduceOp::kSum)->wait();
    cuda::synchronize(device_);
  }
  std::shared_ptr<Communicator> split(int color, int key, const std::string& name) override {
    auto group = group_->split(color, key, name + ".mpi");
    ncclComm_t sub = nullptr;
    NDT_NCCL_CHECK(ncclCommSplit(comm_, color, key, &sub, nullptr), name_, rank_);
    int r = 0, s = 0;
    NDT_NCCL_CHECK(ncclCommUserRank(sub, &r), name, rank_);
    NDT_NCCL_CHECK(ncclCommCount(sub, &s), name, rank_);
    return std::make_shared<NcclCommunicator>(sub, r, s, name, device_, group);
  }
  [[noreturn]] void abort(int code) override {
    ncclCommAbort(comm_);
    group_->abort(code);
    std::_Exit(code);  // not reached
  }

 private:
  void check_peer(const char* call, int peer) const {
    NDT_CHECK(peer >= 0 && peer < size_, name_, ".", call, ": peer ", peer, " outside the group of ", size_);
  }
  template <typename F>
  WorkPtr launch(std::vector<Tensor> keep, F&& call) {
    for (const Tensor& t : keep)
      NDT_CHECK(t.device() == Device::cuda(device_), name_, ": the NCCL backend of cuda:", device_,
                " got a tensor on ", t.device().str());
    NDT_CUDART_CHECK(cudaSetDevice(device_));
    cudaEvent_t ready, done;
    NDT_CUDART_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
    NDT_CUDART_CHECK(cudaEventRecord(ready, compute(device_)));
    NDT_CUDART_CHECK(cudaStreamWaitEvent(stream_, ready, 0));
    NDT_CUDART_CHECK(cudaEventDestroy(ready));
    NDT_NCCL_CHECK(call(stream_), name_, rank_);
    NDT_CUDART_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    NDT_CUDART_CHECK(cudaEventRecord(done, stream_));
    return std::make_shared<NcclWork>(done, device_, std::move(keep));
  }

  ncclComm_t comm_;
  int device_;
  std::shared_ptr<Communicator> group_;  // the MPI group of the same ranks (ids, abort)
  cudaStream_t stream_ = nullptr;
};

}  // namespace

bool nccl_compiled() { return true; }

std::shared_ptr<Communicator> nccl_communicator(const std::shared_ptr<Communicator>& group, int device) {
  static_assert(NCCL_UNIQUE_ID_BYTES % 4 == 0, "the id travels as int32 words");
  ncclUniqueId id;
  Tensor words = Tensor::zeros({NCCL_UNIQUE_ID_BYTES / 4}, DType::i32);
  if (group->rank() == 0) {
    NDT_NCCL_CHECK(ncclGetUniqueId(&id), group->name(), 0);
    std::memcpy(words.data_ptr(), &id, sizeof(id));
  }
  group->broadcast(words, 0)->wait();
  std::memcpy(&id, words.data_ptr(), sizeof(id));
  NDT_CUDART_CHECK(cudaSetDevice(device));
  ncclComm_t comm = nullptr;
  NDT_NCCL_CHECK(ncclCommInitRank(&comm, group->size(), id, group->rank()), group->name(), group->rank());
  return std::make_shared<NcclCommunicator>(comm, group->rank(), group->size(), group->name(), device, group);
}

}  // namespace ndt::dist
