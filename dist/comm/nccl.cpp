// The NCCL backend (see dist/comm/nccl.h): the one file of dist/ with CUDA and NCCL headers.
#include "dist/comm/nccl.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <list>
#include <mutex>
#include <thread>
#include <vector>

#include "dist/flight.h"
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

using Clock = std::chrono::steady_clock;

// Waits while a non-blocking communicator finishes its last call (ncclInProgress); throws
// CollectiveTimeout after `timeout_s` (0: no limit) and ndt::Error on an NCCL error.
void settle(ncclComm_t comm, const std::string& what, double timeout_s) {
  const auto t0 = Clock::now();
  for (;;) {
    ncclResult_t st = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(comm, &st);
    NDT_CHECK(r == ncclSuccess, what, ": ncclCommGetAsyncError failed: ", ncclGetErrorString(r));
    if (st == ncclSuccess) return;
    NDT_CHECK(st == ncclInProgress, what, " failed: ", ncclGetErrorString(st), " (", ncclGetLastError(comm),
              ")");
    if (timeout_s > 0 && std::chrono::duration<double>(Clock::now() - t0).count() > timeout_s)
      throw CollectiveTimeout(what + " has not completed after " +
                              std::to_string(static_cast<int>(timeout_s)) +
                              " s (parallel.timeout_s): a rank of the group is dead, stopped or cut off");
    std::this_thread::yield();
  }
}

// The deadlines of one process's NCCL operations (see dist/comm/nccl.h): a thread that polls
// each operation's completion event and each communicator's asynchronous error every 20 ms.
class NcclWatch {
 public:
  using Handler = std::function<void(const std::string&)>;
  explicit NcclWatch(Handler on_failure) : on_failure_(std::move(on_failure)), thread_([this] { run(); }) {}
  ~NcclWatch() {
    {
      std::lock_guard<std::mutex> g(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
    for (Op& op : ops_) cudaEventDestroy(op.done);
  }
  void add(ncclComm_t c) {
    std::lock_guard<std::mutex> g(mu_);
    comms_.push_back(c);
  }
  void remove(ncclComm_t c) {
    std::lock_guard<std::mutex> g(mu_);
    comms_.remove(c);
  }
  // An operation queued now: `done` (owned by the watch from here) fires when it completes;
  // `line` is its timeout message up to " has not completed".
  void track(cudaEvent_t done, double timeout_s, std::string line, FlightRecorder* flight,
             int64_t flight_id) {
    std::lock_guard<std::mutex> g(mu_);
    ops_.push_back({done, Clock::now(), timeout_s, std::move(line), flight, flight_id});
  }

 private:
  struct Op {
    cudaEvent_t done;
    Clock::time_point queued;
    double timeout_s;
    std::string line;
    FlightRecorder* flight;
    int64_t flight_id;
  };
  void run() {
    std::unique_lock<std::mutex> lk(mu_);
    while (!cv_.wait_for(lk, std::chrono::milliseconds(20), [this] { return stop_; })) {
      std::string failure;
      for (auto it = ops_.begin(); it != ops_.end() && failure.empty();) {
        const cudaError_t q = cudaEventQuery(it->done);
        if (q == cudaSuccess) {
          if (it->flight) it->flight->finished(it->flight_id, true);
          cudaEventDestroy(it->done);
          it = ops_.erase(it);
          continue;
        }
        const double waited = std::chrono::duration<double>(Clock::now() - it->queued).count();
        if (it->timeout_s > 0 && waited > it->timeout_s) {
          char secs[32];
          std::snprintf(secs, sizeof(secs), "%g", it->timeout_s);
          failure = it->line + " has not completed after " + secs +
                    " s (parallel.timeout_s): a rank of the group is dead, stopped or cut off";
        }
        ++it;
      }
      for (ncclComm_t c : comms_) {
        ncclResult_t st = ncclSuccess;
        if (failure.empty() && ncclCommGetAsyncError(c, &st) == ncclSuccess && st != ncclSuccess &&
            st != ncclInProgress)
          failure = std::string("NCCL reported an asynchronous error: ") + ncclGetErrorString(st) + " (" +
                    ncclGetLastError(c) + "); a peer failed or the network did";
      }
      if (failure.empty()) continue;
      // the kernels that wait for the missing peer return; nothing of this job's NCCL state
      // can be used afterwards
      for (ncclComm_t c : comms_) ncclCommAbort(c);
      comms_.clear();
      lk.unlock();
      if (on_failure_) on_failure_(failure);
      const std::string out = failure + "\n";
      [[maybe_unused]] ssize_t n = ::write(2, out.data(), out.size());
      std::_Exit(1);
    }
  }

  Handler on_failure_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::list<Op> ops_;
  std::list<ncclComm_t> comms_;
  std::thread thread_;  // last: it starts once the members above exist
};

ncclConfig_t nonblocking_config() {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // calls return at once (ncclInProgress): the host never hangs inside NCCL
  return config;
}

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
                   std::shared_ptr<Communicator> group, std::shared_ptr<NcclWatch> watch, int world_rank)
      : Communicator(rank, size, std::move(name)),
        comm_(comm),
        device_(device),
        mpi_group_(std::move(group)),
        watch_(std::move(watch)),
        world_rank_(world_rank) {
    NDT_CUDART_CHECK(cudaSetDevice(device_));
    NDT_CUDART_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    set_timeout(mpi_group_->timeout());
    set_flight(mpi_group_->flight());
    watch_->add(comm_);
  }
  ~NcclCommunicator() override {
    watch_->remove(comm_);
    cudaStreamSynchronize(stream_);
    try {  // a non-blocking communicator finalizes in the background
      if (ncclCommFinalize(comm_) == ncclInProgress) settle(comm_, name_ + ".finalize", 30);
    } catch (...) {
    }
    ncclCommDestroy(comm_);
    cudaStreamDestroy(stream_);
  }
  std::string backend() const override { return "nccl"; }
  Device device() const override { return Device::cuda(device_); }

  WorkPtr all_reduce(const Tensor& t, ReduceOp op) override {
    check_one("all_reduce", t);
    count(CommKind::kAllReduce, size_ == 1 ? 0 : 2 * (size_ - 1) * static_cast<int64_t>(t.nbytes()) / size_);
    return launch("all_reduce", t.nbytes(), {t}, [&](cudaStream_t s) {
      return ncclAllReduce(t.data_ptr(), t.data_ptr(), static_cast<size_t>(t.numel()), nccl_type(t.dtype()),
                           nccl_op(op), comm_, s);
    });
  }
  WorkPtr all_gather(const Tensor& out, const Tensor& in) override {
    check_same("all_gather", in, out, size_, 1);
    count(CommKind::kAllGather, static_cast<int64_t>(size_ - 1) * static_cast<int64_t>(in.nbytes()));
    return launch("all_gather", in.nbytes(), {out, in}, [&](cudaStream_t s) {
      return ncclAllGather(in.data_ptr(), out.data_ptr(), static_cast<size_t>(in.numel()),
                           nccl_type(in.dtype()), comm_, s);
    });
  }
  WorkPtr reduce_scatter(const Tensor& out, const Tensor& in, ReduceOp op) override {
    check_same("reduce_scatter", out, in, size_, 1);
    NDT_CHECK(op != ReduceOp::kMax, name_, ".reduce_scatter: max is not supported (sum or mean)");
    count(CommKind::kReduceScatter, static_cast<int64_t>(size_ - 1) * static_cast<int64_t>(out.nbytes()));
    return launch("reduce_scatter", in.nbytes(), {out, in}, [&](cudaStream_t s) {
      return ncclReduceScatter(in.data_ptr(), out.data_ptr(), static_cast<size_t>(out.numel()),
                               nccl_type(in.dtype()), nccl_op(op), comm_, s);
    });
  }
  WorkPtr broadcast(const Tensor& t, int root) override {
    check_one("broadcast", t);
    count(CommKind::kBroadcast, rank_ == root && size_ > 1 ? static_cast<int64_t>(t.nbytes()) : 0);
    return launch("broadcast", t.nbytes(), {t}, [&](cudaStream_t s) {
      return ncclBroadcast(t.data_ptr(), t.data_ptr(), static_cast<size_t>(t.numel()), nccl_type(t.dtype()),
                           root, comm_, s);
    });
  }
  WorkPtr send(const Tensor& t, int peer) override {
    check_one("send", t);
    check_peer("send", peer);
    count(CommKind::kSend, static_cast<int64_t>(t.nbytes()), peer);
    return launch("send", t.nbytes(), {t}, [&](cudaStream_t s) {
      return ncclSend(t.data_ptr(), static_cast<size_t>(t.numel()), nccl_type(t.dtype()), peer, comm_, s);
    });
  }
  WorkPtr recv(const Tensor& t, int peer) override {
    check_one("recv", t);
    check_peer("recv", peer);
    count(CommKind::kRecv, 0);
    return launch("recv", t.nbytes(), {t}, [&](cudaStream_t s) {
      return ncclRecv(t.data_ptr(), static_cast<size_t>(t.numel()), nccl_type(t.dtype()), peer, comm_, s);
    });
  }
  WorkPtr all_to_all_v(const Tensor& out, const std::vector<int64_t>& recv_counts, const Tensor& in,
                       const std::vector<int64_t>& send_counts) override {
    const int64_t wire = check_all_to_all_v(out, recv_counts, in, send_counts);
    count(CommKind::kAllToAll, wire);
    return launch("all_to_all_v", static_cast<size_t>(wire), {out, in}, [&](cudaStream_t s) {
      // one group of a send and a receive per member (NCCL has no all-to-all-v of its own)
      const size_t item = dtype_size(in.dtype());
      const ncclDataType_t dt = nccl_type(in.dtype());
      ncclResult_t r = ncclGroupStart();
      if (r != ncclSuccess) return r;
      ncclResult_t first = ncclSuccess;
      int64_t sent = 0, got = 0;
      for (int j = 0; j < size_; ++j) {
        const int64_t ns = send_counts[static_cast<size_t>(j)], nr = recv_counts[static_cast<size_t>(j)];
        const ncclResult_t a = ncclSend(static_cast<const char*>(in.data_ptr()) + sent * item,
                                        static_cast<size_t>(ns), dt, j, comm_, s);
        const ncclResult_t b = ncclRecv(static_cast<char*>(out.data_ptr()) + got * item,
                                        static_cast<size_t>(nr), dt, j, comm_, s);
        if (first == ncclSuccess) first = a != ncclSuccess ? a : b;
        sent += ns, got += nr;
      }
      r = ncclGroupEnd();  // always closed, even after an error inside
      return first != ncclSuccess ? first : r;
    });
  }
  WorkPtr sendrecv(const Tensor& out_t, int to, const Tensor& in_t, int from) override {
    check_one("sendrecv", out_t);
    check_one("sendrecv", in_t);
    check_peer("sendrecv", to);
    check_peer("sendrecv", from);
    count(CommKind::kSend, static_cast<int64_t>(out_t.nbytes()), to);
    count(CommKind::kRecv, 0);
    return launch("sendrecv", out_t.nbytes(), {out_t, in_t}, [&](cudaStream_t s) {
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
    auto group = mpi_group_->split(color, key, name + ".mpi");
    ncclComm_t sub = nullptr;
    ncclConfig_t config = nonblocking_config();
    const ncclResult_t rc = ncclCommSplit(comm_, color, key, &sub, &config);
    NDT_CHECK(rc == ncclSuccess || rc == ncclInProgress, "ncclCommSplit failed on ", name_, " rank ", rank_,
              ": ", ncclGetErrorString(rc));
    settle(sub, name + ".split", timeout_s_);
    int r = 0, s = 0;
    NDT_NCCL_CHECK(ncclCommUserRank(sub, &r), name, rank_);
    NDT_NCCL_CHECK(ncclCommCount(sub, &s), name, rank_);
    auto child = std::make_shared<NcclCommunicator>(sub, r, s, name, device_, group, watch_, world_rank_);
    child->group_ = name + "@" + std::to_string(color);
    return child;
  }
  [[noreturn]] void abort(int code) override {
    watch_->remove(comm_);
    ncclCommAbort(comm_);
    mpi_group_->abort(code);
    std::_Exit(code);  // not reached
  }

 private:
  void check_peer(const char* call, int peer) const {
    NDT_CHECK(peer >= 0 && peer < size_, name_, ".", call, ": peer ", peer, " outside the group of ", size_);
  }
  // Queues `call` on this communicator's stream after the compute stream's work; the watch
  // follows it to its completion (or its deadline).
  template <typename F>
  WorkPtr launch(const char* op, size_t bytes, std::vector<Tensor> keep, F&& call) {
    for (const Tensor& t : keep)
      NDT_CHECK(t.device() == Device::cuda(device_), name_, ": the NCCL backend of cuda:", device_,
                " got a tensor on ", t.device().str());
    NDT_CUDART_CHECK(cudaSetDevice(device_));
    cudaEvent_t ready, done;
    NDT_CUDART_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
    NDT_CUDART_CHECK(cudaEventRecord(ready, compute(device_)));
    NDT_CUDART_CHECK(cudaStreamWaitEvent(stream_, ready, 0));
    NDT_CUDART_CHECK(cudaEventDestroy(ready));
    const std::string what = name_ + "." + op;
    const int64_t flight_id =
        flight_ ? flight_->queued(group_, ++seq_, what, static_cast<int64_t>(bytes)) : 0;
    const ncclResult_t r = call(stream_);
    NDT_CHECK(r == ncclSuccess || r == ncclInProgress, what, " failed on ", name_, " rank ", rank_, ": ",
              ncclGetErrorString(r));
    if (r == ncclInProgress) settle(comm_, what, timeout_s_);  // the launch itself, not the transfer
    if (flight_) flight_->started(flight_id);
    NDT_CUDART_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    NDT_CUDART_CHECK(cudaEventRecord(done, stream_));
    cudaEvent_t watched;  // the watch's own: the Work's may be destroyed first
    NDT_CUDART_CHECK(cudaEventCreateWithFlags(&watched, cudaEventDisableTiming));
    NDT_CUDART_CHECK(cudaEventRecord(watched, stream_));
    watch_->track(watched, timeout_s_,
                  what + " (" + std::to_string(bytes) + " bytes; " + context() + ") on world rank " +
                      std::to_string(world_rank_),
                  flight_, flight_id);
    return std::make_shared<NcclWork>(done, device_, std::move(keep));
  }

  ncclComm_t comm_;
  int device_;
  std::shared_ptr<Communicator> mpi_group_;  // the MPI group of the same ranks (ids, abort)
  std::shared_ptr<NcclWatch> watch_;         // shared with the communicators split from this one
  int world_rank_;
  cudaStream_t stream_ = nullptr;
};

}  // namespace

bool nccl_compiled() { return true; }

std::shared_ptr<Communicator> nccl_communicator(const std::shared_ptr<Communicator>& group, int device,
                                                std::function<void(const std::string&)> on_failure) {
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
  ncclConfig_t config = nonblocking_config();
  const ncclResult_t rc = ncclCommInitRankConfig(&comm, group->size(), id, group->rank(), &config);
  NDT_CHECK(rc == ncclSuccess || rc == ncclInProgress, "ncclCommInitRankConfig failed on ", group->name(),
            " rank ", group->rank(), ": ", ncclGetErrorString(rc));
  settle(comm, group->name() + ": creating the NCCL communicator", group->timeout());
  auto watch = std::make_shared<NcclWatch>(std::move(on_failure));
  return std::make_shared<NcclCommunicator>(comm, group->rank(), group->size(), group->name(), device, group,
                                            std::move(watch), group->rank());
}

}  // namespace ndt::dist
