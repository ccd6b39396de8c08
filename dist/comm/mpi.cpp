// The MPI backend: a queue of operations, one thread that starts them (MPI_I*) and polls
// them to completion. See dist/comm/mpi.h.
#include "dist/comm/mpi.h"

#include "dist/flight.h"

#include <mpi.h>

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <functional>
#include <limits>
#include <list>
#include <mutex>
#include <thread>
#include <vector>

#include "dist/trace.h"

namespace ndt::dist {
namespace {

std::string mpi_error_string(int rc) {
  char s[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, s, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(rc);
  return std::string(s, static_cast<size_t>(len));
}

// How many threads are blocked in MpiWork::wait(). While one is, its rank has nothing to
// compute until a collective ends, and the communication thread polls MPI without pausing
// for up to kSpin (Open MPI moves a non-blocking collective on only inside MPI calls, so
// each pause of the poll is time the waiter loses), then with pauses of kWaitPause: a long
// wait (a slow link, a late peer) does not keep a core busy that another rank or program
// on the machine could use. With no waiter it pauses longer between polls, to leave the
// cores to the compute threads while collectives run behind them. One count for the
// process, as there is one communication thread (Engine below).
constexpr auto kSpin = std::chrono::milliseconds(2);
// The longest deadline a wait takes as one (100 years); longer ones wait without a limit.
constexpr double kLongestDeadlineS = 100 * 365.25 * 24 * 3600;
constexpr auto kWaitPause = std::chrono::microseconds(20);
std::atomic<int>& waiting_threads() {
  static std::atomic<int> n{0};
  return n;
}

// One handle; completed by the communication thread.
class MpiWork : public Work {
 public:
  // context: the group in words and where the job was when it was queued (for the message)
  MpiWork(std::string what, Trace* trace, double timeout_s = 0, int64_t bytes = 0, std::string context = "")
      : what_(std::move(what)),
        context_(std::move(context)),
        trace_(trace),
        timeout_s_(timeout_s),
        bytes_(bytes) {}
  void wait() override {
    std::unique_lock<std::mutex> lk(mu_);
    if (!done_) {
      const int64_t t0 = trace_ ? trace_->now_us() : 0;
      waiting_threads().fetch_add(1);
      struct Done {
        ~Done() { waiting_threads().fetch_sub(1); }
      } done_waiting;
      // a deadline past what the clock counts (int64 nanoseconds: 292 years) would overflow
      // into the past; such a value means no limit, as it says
      if (timeout_s_ > 0 && timeout_s_ < kLongestDeadlineS) {
        const auto limit = std::chrono::duration<double>(timeout_s_);
        if (!cv_.wait_for(lk, limit, [&] { return done_; })) {
          int rank = -1;
          MPI_Comm_rank(MPI_COMM_WORLD, &rank);
          char secs[32];
          std::snprintf(secs, sizeof(secs), "%g", timeout_s_);
          // "fsdp.all_gather (38112 bytes; the shard group of replica 1; step 37, micro-step 2 of 2,
          // unit h.0) on world rank 0 has not completed after 3 s (parallel.timeout_s): ..."
          std::string about = bytes_ >= 0 ? std::to_string(bytes_) + " bytes" : "";
          if (!context_.empty()) about += (about.empty() ? "" : "; ") + context_;
          throw CollectiveTimeout(what_ + (about.empty() ? "" : " (" + about + ")") + " on world rank " +
                                  std::to_string(rank) + " has not completed after " + secs +
                                  " s (parallel.timeout_s): a rank of the group is dead, stopped or cut off");
        }
      } else {
        cv_.wait(lk, [&] { return done_; });
      }
      if (trace_) trace_->add("wait " + what_, Trace::kWait, t0, trace_->now_us());
    }
    if (!error_.empty()) throw Error(error_);
  }
  bool done() override {
    std::lock_guard<std::mutex> g(mu_);
    return done_;
  }
  void complete(std::string error) {
    {
      std::lock_guard<std::mutex> g(mu_);
      done_ = true;
      error_ = std::move(error);
    }
    cv_.notify_all();
  }

 private:
  std::string what_, context_;
  Trace* trace_;
  double timeout_s_;
  int64_t bytes_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::string error_;
};

struct Op {
  std::string what;                        // "dp_shard.all_gather", for errors and the trace
  std::function<int(MPI_Request*)> start;  // returns an MPI error code
  std::function<void()> finish;            // after completion (convert, scale)
  std::shared_ptr<MpiWork> work;
  Trace* trace = nullptr;
  int64_t bytes = -1;
  MPI_Request req = MPI_REQUEST_NULL;
  int64_t t0 = 0;
  FlightRecorder* flight = nullptr;  // and this op's id in it
  int64_t flight_id = 0;
};

// The process's MPI: initialized once, finalized at exit, with its communication thread.
class Engine {
 public:
  static Engine& get() {
    static Engine* e = new Engine();  // lives until exit (see shutdown)
    return *e;
  }

  void submit(Op op) {
    {
      std::lock_guard<std::mutex> g(mu_);
      NDT_CHECK(!stop_, "MPI is shut down; cannot start ", op.what);
      queue_.push_back(std::move(op));
    }
    cv_.notify_one();
  }

  // Runs fn on the communication thread and waits for it (setup calls: split, free).
  void run_sync(const std::string& what, std::function<int()> fn) {
    auto work = std::make_shared<MpiWork>(what, nullptr);
    Op op;
    op.what = what;
    op.start = [fn](MPI_Request* r) {
      *r = MPI_REQUEST_NULL;
      return fn();
    };
    op.work = work;
    submit(std::move(op));
    work->wait();
  }

  bool running() {
    std::lock_guard<std::mutex> g(mu_);
    return !stop_;
  }

 private:
  Engine() {
    int inited = 0;
    MPI_Initialized(&inited);
    int provided = 0;
    if (!inited) {
      const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
      NDT_CHECK(rc == MPI_SUCCESS, "MPI_Init_thread failed: ", mpi_error_string(rc));
    } else {
      MPI_Query_thread(&provided);
    }
    NDT_CHECK(provided >= MPI_THREAD_SERIALIZED, "this MPI library offers thread level ", provided,
              " but ndtrain's communication thread needs MPI_THREAD_SERIALIZED or better");
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    thread_ = std::thread([this] { loop(); });
    std::atexit([] { Engine::get().shutdown(); });
  }

  void shutdown() {
    {
      std::lock_guard<std::mutex> g(mu_);
      if (stop_) return;
      stop_ = true;
    }
    cv_.notify_one();
    if (thread_.joinable()) thread_.join();
    int finalized = 0;
    MPI_Finalized(&finalized);
    // Requests still in flight (a peer failed) would make MPI_Finalize wait forever.
    if (!finalized && inflight_.empty()) MPI_Finalize();
  }

  // The op's closures hold its tensors: they are dropped before the Work completes, so that
  // a waiter that frees its own references frees the memory then, on its own thread (the
  // memory counters of a rank are exact at any point after a wait()).
  static void release(Op& op) {
    op.start = nullptr;
    op.finish = nullptr;
  }

  void fail(Op& op, const std::string& why) {
    release(op);
    if (op.flight) op.flight->finished(op.flight_id, false);
    int rank = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    op.work->complete(op.what + " failed on world rank " + std::to_string(rank) + ": " + why);
  }

  void finish(Op& op) {
    try {
      if (op.finish) op.finish();
      release(op);
      if (op.trace) op.trace->add(op.what, Trace::kComm, op.t0, op.trace->now_us(), op.bytes);
      if (op.flight) op.flight->finished(op.flight_id, true);
      op.work->complete("");
    } catch (const std::exception& e) {
      fail(op, e.what());
    }
  }

  void loop() {
    auto idle = std::chrono::microseconds(10);
    auto quiet_since = std::chrono::steady_clock::now();  // the last progress
    for (;;) {
      std::deque<Op> fresh;
      {
        std::unique_lock<std::mutex> lk(mu_);
        if (inflight_.empty()) cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
        if (stop_) return;
        fresh.swap(queue_);
      }
      bool progressed = !fresh.empty();
      for (Op& op : fresh) {
        op.t0 = op.trace ? op.trace->now_us() : 0;
        int rc = MPI_SUCCESS;
        try {
          rc = op.start(&op.req);
        } catch (const std::exception& e) {
          fail(op, e.what());
          continue;
        }
        if (rc != MPI_SUCCESS) {
          fail(op, mpi_error_string(rc));
          continue;
        }
        if (op.flight) op.flight->started(op.flight_id);
        inflight_.push_back(std::move(op));
      }
      for (auto it = inflight_.begin(); it != inflight_.end();) {
        int flag = 0;
        const int rc = MPI_Test(&it->req, &flag, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) {
          fail(*it, mpi_error_string(rc));
        } else if (flag) {
          finish(*it);
        } else {
          ++it;
          continue;
        }
        it = inflight_.erase(it);
        progressed = true;
      }
      if (progressed) {
        idle = std::chrono::microseconds(10);
        quiet_since = std::chrono::steady_clock::now();
      } else if (!inflight_.empty() && waiting_threads().load() > 0) {
        // a thread waits for a collective: poll at once (yielding, should another thread
        // want the core), and after kSpin without progress, every kWaitPause
        if (std::chrono::steady_clock::now() - quiet_since < kSpin)
          std::this_thread::yield();
        else
          std::this_thread::sleep_for(kWaitPause);
      } else if (!inflight_.empty()) {
        // Nothing finished: poll again soon, without taking a core from the compute threads.
        std::this_thread::sleep_for(idle);
        idle = std::min(idle * 2, std::chrono::microseconds(200));
      }
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Op> queue_;
  std::list<Op> inflight_;  // touched by the communication thread only
  bool stop_ = false;
  std::thread thread_;
};

MPI_Datatype mpi_type(DType d) {
  switch (d) {
    case DType::f32:
      return MPI_FLOAT;
    case DType::f64:
      return MPI_DOUBLE;
    case DType::i32:
      return MPI_INT32_T;
    case DType::u16:
    case DType::bf16:  // moved as raw 16-bit words; reduced through f32 (below)
      return MPI_UINT16_T;
  }
  return MPI_BYTE;
}

MPI_Op mpi_op(ReduceOp op) { return op == ReduceOp::kMax ? MPI_MAX : MPI_SUM; }

int count_of(const std::string& what, const Tensor& t) {
  NDT_CHECK(t.numel() <= std::numeric_limits<int>::max(), what, ": ", t.numel(),
            " elements exceed MPI's int count; split the buffer");
  return static_cast<int>(t.numel());
}

// Scales a CPU f32/f64 buffer in place (the mean of a sum).
void scale_inplace(const Tensor& t, double s) {
  if (t.dtype() == DType::f32) {
    float* p = t.data<float>();
    const float f = static_cast<float>(s);
    for (int64_t i = 0; i < t.numel(); ++i) p[i] *= f;
  } else if (t.dtype() == DType::f64) {
    double* p = t.data<double>();
    for (int64_t i = 0; i < t.numel(); ++i) p[i] *= s;
  } else {
    NDT_FAIL("mean reduction of ", dtype_name(t.dtype()), " is not supported (use sum)");
  }
}

class MpiCommunicator : public Communicator {
 public:
  MpiCommunicator(MPI_Comm comm, int rank, int size, std::string name, bool owned)
      : Communicator(rank, size, std::move(name)), comm_(comm), owned_(owned) {}
  ~MpiCommunicator() override {
    if (!owned_) return;
    Engine& e = Engine::get();
    if (!e.running()) return;
    MPI_Comm c = comm_;
    try {
      e.run_sync(name_ + ".free", [c]() mutable { return MPI_Comm_free(&c); });
    } catch (...) {
    }
  }
  std::string backend() const override { return "mpi"; }

  WorkPtr all_reduce(const Tensor& t, ReduceOp op) override {
    check_one("all_reduce", t);
    check_cpu("all_reduce", t);
    // bf16 travels as its f32 copy (below)
    const int64_t wire = static_cast<int64_t>(t.nbytes()) * (t.dtype() == DType::bf16 ? 2 : 1);
    count(CommKind::kAllReduce, size_ == 1 ? 0 : 2 * (size_ - 1) * wire / size_);
    if (size_ == 1) return done_work();
    const std::string what = name_ + ".all_reduce";
    NDT_CHECK(!(op == ReduceOp::kAvg && t.dtype() == DType::i32), what, ": mean of int32 is not supported");
    Tensor buf = t.dtype() == DType::bf16 ? Tensor() : t;  // bf16: reduced in an f32 copy
    auto staging = std::make_shared<Tensor>(buf);
    const int n = count_of(what, t);
    const int size = size_;
    return submit(
        what, 2 * (size_ - 1) * wire / size_,
        [=, comm = comm_](MPI_Request* r) {
          if (!staging->defined()) *staging = t.to(DType::f32);
          return MPI_Iallreduce(MPI_IN_PLACE, staging->data_ptr(), n, mpi_type(staging->dtype()), mpi_op(op),
                                comm, r);
        },
        [=] {
          if (op == ReduceOp::kAvg) scale_inplace(*staging, 1.0 / size);
          if (!staging->same(t)) t.copy_(*staging);
        });
  }

  WorkPtr all_gather(const Tensor& out, const Tensor& in) override {
    check_same("all_gather", in, out, size_, 1);
    check_cpu("all_gather", in);
    count(CommKind::kAllGather, static_cast<int64_t>(size_ - 1) * static_cast<int64_t>(in.nbytes()));
    if (size_ == 1) {
      if (out.data_ptr() != in.data_ptr()) out.copy_(in);
      return done_work();
    }
    const std::string what = name_ + ".all_gather";
    const int n = count_of(what, in);
    return submit(
        what, static_cast<int64_t>(size_ - 1) * static_cast<int64_t>(in.nbytes()),
        [=, comm = comm_](MPI_Request* r) {
          const MPI_Datatype dt = mpi_type(in.dtype());
          return MPI_Iallgather(in.data_ptr(), n, dt, out.data_ptr(), n, dt, comm, r);
        },
        nullptr);
  }

  WorkPtr reduce_scatter(const Tensor& out, const Tensor& in, ReduceOp op) override {
    check_same("reduce_scatter", out, in, size_, 1);
    check_cpu("reduce_scatter", in);
    NDT_CHECK(op != ReduceOp::kMax, name_, ".reduce_scatter: max is not supported (sum or mean)");
    const int64_t wire =
        static_cast<int64_t>(out.nbytes()) * (in.dtype() == DType::bf16 ? 2 : 1);  // bf16 in f32
    count(CommKind::kReduceScatter, static_cast<int64_t>(size_ - 1) * wire);
    if (size_ == 1) {
      if (out.data_ptr() != in.data_ptr()) out.copy_(in);
      return done_work();
    }
    const std::string what = name_ + ".reduce_scatter";
    NDT_CHECK(!(op == ReduceOp::kAvg && in.dtype() == DType::i32), what, ": mean of int32 is not supported");
    const int n = count_of(what, out);
    const bool via_f32 = in.dtype() == DType::bf16;
    auto src = std::make_shared<Tensor>(), dst = std::make_shared<Tensor>();
    const int size = size_;
    return submit(
        what, static_cast<int64_t>(size_ - 1) * wire,
        [=, comm = comm_](MPI_Request* r) {
          *src = via_f32 ? in.to(DType::f32) : in;
          *dst = via_f32 ? Tensor::empty(out.shape(), DType::f32) : out;
          return MPI_Ireduce_scatter_block(src->data_ptr(), dst->data_ptr(), n, mpi_type(src->dtype()),
                                           mpi_op(op), comm, r);
        },
        [=] {
          if (op == ReduceOp::kAvg) scale_inplace(*dst, 1.0 / size);
          if (!dst->same(out)) out.copy_(*dst);
          *src = Tensor();  // the f32 copy of the input is no longer needed
        });
  }

  WorkPtr broadcast(const Tensor& t, int root) override {
    check_one("broadcast", t);
    check_cpu("broadcast", t);
    NDT_CHECK(root >= 0 && root < size_, name_, ".broadcast: root ", root, " is not in a group of ", size_);
    count(CommKind::kBroadcast, rank_ == root && size_ > 1 ? static_cast<int64_t>(t.nbytes()) : 0);
    if (size_ == 1) return done_work();
    const std::string what = name_ + ".broadcast";
    const int n = count_of(what, t);
    return submit(
        what, static_cast<int64_t>(t.nbytes()),
        [=, comm = comm_](MPI_Request* r) {
          return MPI_Ibcast(t.data_ptr(), n, mpi_type(t.dtype()), root, comm, r);
        },
        nullptr);
  }

  WorkPtr all_to_all_v(const Tensor& out, const std::vector<int64_t>& recv_counts, const Tensor& in,
                       const std::vector<int64_t>& send_counts) override {
    const int64_t wire = check_all_to_all_v(out, recv_counts, in, send_counts);
    check_cpu("all_to_all_v", in);
    count(CommKind::kAllToAll, wire);
    if (size_ == 1) {
      if (out.data_ptr() != in.data_ptr()) out.copy_(in);
      return done_work();
    }
    const std::string what = name_ + ".all_to_all_v";
    count_of(what, in);
    count_of(what, out);
    // counts and displacements in elements, alive until the request completes
    auto v = std::make_shared<std::array<std::vector<int>, 4>>();  // send counts, displs, recv counts, displs
    for (int j = 0, s = 0, r = 0; j < size_; ++j) {
      (*v)[0].push_back(static_cast<int>(send_counts[static_cast<size_t>(j)]));
      (*v)[1].push_back(s);
      (*v)[2].push_back(static_cast<int>(recv_counts[static_cast<size_t>(j)]));
      (*v)[3].push_back(r);
      s += (*v)[0].back(), r += (*v)[2].back();
    }
    return submit(
        what, wire,
        [=, comm = comm_](MPI_Request* r) {
          const MPI_Datatype dt = mpi_type(in.dtype());
          return MPI_Ialltoallv(in.data_ptr(), (*v)[0].data(), (*v)[1].data(), dt, out.data_ptr(),
                                (*v)[2].data(), (*v)[3].data(), dt, comm, r);
        },
        nullptr);
  }

  WorkPtr send(const Tensor& t, int peer) override {
    check_one("send", t);
    check_cpu("send", t);
    check_peer("send", peer);
    count(CommKind::kSend, static_cast<int64_t>(t.nbytes()), peer);
    const std::string what = name_ + ".send";
    const int n = count_of(what, t);
    return submit(
        what, static_cast<int64_t>(t.nbytes()),
        [=, comm = comm_](MPI_Request* r) {
          return MPI_Isend(t.data_ptr(), n, mpi_type(t.dtype()), peer, 0, comm, r);
        },
        nullptr, peer);
  }

  WorkPtr recv(const Tensor& t, int peer) override {
    check_one("recv", t);
    check_cpu("recv", t);
    check_peer("recv", peer);
    count(CommKind::kRecv, 0);
    const std::string what = name_ + ".recv";
    const int n = count_of(what, t);
    return submit(
        what, static_cast<int64_t>(t.nbytes()),
        [=, comm = comm_](MPI_Request* r) {
          return MPI_Irecv(t.data_ptr(), n, mpi_type(t.dtype()), peer, 0, comm, r);
        },
        nullptr, peer);
  }

  void barrier() override {
    if (size_ == 1) return;
    submit(
        name_ + ".barrier", -1, [comm = comm_](MPI_Request* r) { return MPI_Ibarrier(comm, r); }, nullptr)
        ->wait();
  }

  std::shared_ptr<Communicator> split(int color, int key, const std::string& name) override {
    MPI_Comm parent = comm_, sub = MPI_COMM_NULL;
    Engine::get().run_sync(name_ + ".split", [&] {
      int rc = MPI_Comm_split(parent, color, key, &sub);
      if (rc == MPI_SUCCESS) rc = MPI_Comm_set_errhandler(sub, MPI_ERRORS_RETURN);
      return rc;
    });
    int r = 0, s = 0;
    std::vector<int> in_world;  // the world rank of each of the group's ranks
    Engine::get().run_sync(name + ".size", [&] {
      int rc = MPI_Comm_rank(sub, &r);
      if (rc == MPI_SUCCESS) rc = MPI_Comm_size(sub, &s);
      return rc == MPI_SUCCESS ? world_ranks_of(sub, s, in_world) : rc;
    });
    auto child = std::make_shared<MpiCommunicator>(sub, r, s, name, true);
    child->in_world_ = std::move(in_world);
    child->set_timeout(timeout_s_);
    child->set_flight(flight_);
    child->group_ = name + "@" + std::to_string(color);
    return child;
  }

  [[noreturn]] void abort(int code) override {
    // MPI_Abort asks the launcher to end every rank; when the launcher cannot be reached (a
    // host cut off) it may never return, so this process ends itself a few seconds later
    std::thread([code] {
      std::this_thread::sleep_for(std::chrono::seconds(5));
      std::_Exit(code);
    }).detach();
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);
  }

 private:
  void check_cpu(const char* call, const Tensor& t) const {
    NDT_CHECK(t.device().is_cpu(), name_, ".", call, ": the MPI backend moves CPU tensors, got ", t.desc(),
              "; CUDA tensors go through the NCCL backend");
  }
  void check_peer(const char* call, int peer) const {
    NDT_CHECK(peer >= 0 && peer < size_ && peer != rank_, name_, ".", call, " on rank ", rank_, ": bad peer ",
              peer, " in a group of ", size_);
  }
  // The world ranks of `comm`'s `size` ranks, in `out`.
  static int world_ranks_of(MPI_Comm comm, int size, std::vector<int>& out) {
    MPI_Group g = MPI_GROUP_NULL, w = MPI_GROUP_NULL;
    std::vector<int> ranks(static_cast<size_t>(size));
    for (int i = 0; i < size; ++i) ranks[static_cast<size_t>(i)] = i;
    out.assign(static_cast<size_t>(size), -1);
    int rc = MPI_Comm_group(comm, &g);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_group(MPI_COMM_WORLD, &w);
    if (rc == MPI_SUCCESS) rc = MPI_Group_translate_ranks(g, size, ranks.data(), w, out.data());
    if (g != MPI_GROUP_NULL) MPI_Group_free(&g);
    if (w != MPI_GROUP_NULL) MPI_Group_free(&w);
    return rc;
  }
  // `peer` of this group as a world rank, for the flight record
  int world_rank(int peer) const { return in_world_.empty() ? peer : in_world_[static_cast<size_t>(peer)]; }
  WorkPtr submit(const std::string& what, int64_t bytes, std::function<int(MPI_Request*)> start,
                 std::function<void()> finish, int peer = -1) {
    auto work = std::make_shared<MpiWork>(what, trace_, timeout_s_, bytes, timeout_s_ > 0 ? context() : "");
    Op op;
    op.what = what;
    op.start = std::move(start);
    op.finish = std::move(finish);
    op.work = work;
    op.trace = trace_;
    op.bytes = bytes;
    if (flight_) {
      op.flight = flight_;
      op.flight_id = flight_->queued(group_, ++seq_, what, bytes, peer < 0 ? -1 : world_rank(peer));
    }
    Engine::get().submit(std::move(op));
    return work;
  }

  MPI_Comm comm_;
  bool owned_;
  std::vector<int> in_world_;  // world rank of each rank of the group (empty: the world itself)
};

}  // namespace

std::shared_ptr<Communicator> mpi_world() {
  Engine& e = Engine::get();
  int r = 0, s = 0;
  e.run_sync("world.size", [&] {
    int rc = MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return rc == MPI_SUCCESS ? MPI_Comm_size(MPI_COMM_WORLD, &s) : rc;
  });
  return std::make_shared<MpiCommunicator>(MPI_COMM_WORLD, r, s, "world", false);
}

std::shared_ptr<Communicator> init_world(bool force_mpi) {
  if (force_mpi || launched_with_several_ranks()) return mpi_world();
  return local_communicator("world");
}

}  // namespace ndt::dist
