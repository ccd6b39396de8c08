#include "dist/comm/communicator.h"

#include <cstdlib>
#include <string>

#include "dist/flight.h"
#include "tensor/kernels.h"

namespace ndt::dist {

int64_t CommStats::total_bytes() const {
  int64_t t = 0;
  for (int64_t b : bytes) t += b;
  return t;
}

void Communicator::check_one(const char* call, const Tensor& t) const {
  NDT_CHECK(t.defined() && t.is_contiguous(), name_, ".", call, " on rank ", rank_,
            ": the tensor must be defined and contiguous, got ", t.desc());
}

int64_t Communicator::check_all_to_all_v(const Tensor& out, const std::vector<int64_t>& recv_counts,
                                         const Tensor& in, const std::vector<int64_t>& send_counts) const {
  check_one("all_to_all_v", out);
  check_one("all_to_all_v", in);
  NDT_CHECK(out.dtype() == in.dtype() && out.device() == in.device(), name_, ".all_to_all_v on rank ", rank_,
            ": tensors differ in dtype or device: ", out.desc(), " and ", in.desc());
  const auto sum = [](const std::vector<int64_t>& c) {
    int64_t n = 0;
    for (int64_t v : c) n += v;
    return n;
  };
  NDT_CHECK(static_cast<int>(send_counts.size()) == size_ && static_cast<int>(recv_counts.size()) == size_ &&
                sum(send_counts) == in.numel() && sum(recv_counts) == out.numel(),
            name_, ".all_to_all_v on rank ", rank_, ": ", send_counts.size(), " send and ",
            recv_counts.size(), " receive counts for a group of ", size_, ", summing to ", sum(send_counts),
            " and ", sum(recv_counts), " elements of ", in.numel(), " and ", out.numel());
  const int64_t item = static_cast<int64_t>(dtype_size(in.dtype()));
  return (sum(send_counts) - send_counts[static_cast<size_t>(rank_)]) * item;
}

void Communicator::check_same(const char* call, const Tensor& a, const Tensor& b, int64_t num,
                              int64_t den) const {
  check_one(call, a);
  check_one(call, b);
  NDT_CHECK(a.dtype() == b.dtype() && a.device() == b.device(), name_, ".", call, " on rank ", rank_,
            ": tensors differ in dtype or device: ", a.desc(), " and ", b.desc());
  NDT_CHECK(a.numel() * num == b.numel() * den, name_, ".", call, " on rank ", rank_, ": sizes ", a.numel(),
            " and ", b.numel(), " do not match the group of ", size_, " (pad the buffer to a multiple of ",
            size_, ")");
}

void Communicator::count(CommKind k, int64_t bytes, int to) {
  stats_.bytes[static_cast<size_t>(k)] += bytes;
  stats_.calls[static_cast<size_t>(k)] += 1;
  if (to < 0) to = (rank_ + 1) % size_;
  if (static_cast<size_t>(to) < remote_.size() && remote_[static_cast<size_t>(to)])
    stats_.across_hosts += bytes;
}

bool Communicator::spans_hosts() const {
  for (bool r : remote_)
    if (r) return true;
  return false;
}

void Communicator::note_unit(const std::string& unit) const {
  if (flight_) flight_->set_unit(unit);
}

std::string Communicator::context() const {
  std::string where = flight_ ? flight_->where() : std::string();
  return description() + (where.empty() ? "" : "; " + where);
}

namespace {
// Done when both halves of an exchange are.
class BothWork : public Work {
 public:
  BothWork(WorkPtr a, WorkPtr b) : a_(std::move(a)), b_(std::move(b)) {}
  void wait() override {
    a_->wait();
    b_->wait();
  }
  bool done() override { return a_->done() && b_->done(); }

 private:
  WorkPtr a_, b_;
};
}  // namespace

WorkPtr Communicator::sendrecv(const Tensor& out_t, int to, const Tensor& in_t, int from) {
  WorkPtr r = recv(in_t, from), s = send(out_t, to);
  return std::make_shared<BothWork>(std::move(r), std::move(s));
}

double Communicator::all_reduce_scalar(double v, ReduceOp op) {
  if (size_ == 1) return v;
  Tensor t = Tensor::scalar(v, DType::f64, device());
  all_reduce(t.view({1}), op)->wait();
  return t.item();  // a copy to the host, after the collective
}

namespace {

class DoneWork : public Work {
 public:
  void wait() override {}
  bool done() override { return true; }
};

// A group of one rank: reductions leave the data as it is, gathers and scatters copy.
class LocalCommunicator : public Communicator {
 public:
  explicit LocalCommunicator(std::string name) : Communicator(0, 1, std::move(name)) {}
  std::string backend() const override { return "local"; }
  WorkPtr all_reduce(const Tensor& t, ReduceOp) override {
    check_one("all_reduce", t);
    return done_work();
  }
  WorkPtr all_gather(const Tensor& out, const Tensor& in) override {
    check_same("all_gather", in, out, 1, 1);
    if (!out.same(in) && out.data_ptr() != in.data_ptr()) out.copy_(in);
    return done_work();
  }
  WorkPtr reduce_scatter(const Tensor& out, const Tensor& in, ReduceOp) override {
    check_same("reduce_scatter", out, in, 1, 1);
    if (out.data_ptr() != in.data_ptr()) out.copy_(in);
    return done_work();
  }
  WorkPtr broadcast(const Tensor& t, int root) override {
    NDT_CHECK(root == 0, name_, ".broadcast: root ", root, " is not a rank of a group of 1");
    return done_work();
  }
  WorkPtr all_to_all_v(const Tensor& out, const std::vector<int64_t>& recv_counts, const Tensor& in,
                       const std::vector<int64_t>& send_counts) override {
    check_all_to_all_v(out, recv_counts, in, send_counts);
    if (out.data_ptr() != in.data_ptr()) out.copy_(in);
    return done_work();
  }
  WorkPtr send(const Tensor&, int peer) override {
    NDT_FAIL(name_, ".send to ", peer, ": a group of one rank");
  }
  WorkPtr recv(const Tensor&, int peer) override {
    NDT_FAIL(name_, ".recv from ", peer, ": a group of one rank");
  }
  void barrier() override {}
  std::shared_ptr<Communicator> split(int, int, const std::string& name) override {
    return std::make_shared<LocalCommunicator>(name);
  }
  [[noreturn]] void abort(int code) override { std::_Exit(code); }
};

int env_int(std::initializer_list<const char*> names, int fallback) {
  for (const char* n : names)
    if (const char* v = std::getenv(n)) {
      try {
        return std::stoi(v);
      } catch (...) {
      }
    }
  return fallback;
}

}  // namespace

WorkPtr done_work() {
  static const WorkPtr w = std::make_shared<DoneWork>();  // stateless, shared
  return w;
}

std::shared_ptr<Communicator> local_communicator(const std::string& name) {
  return std::make_shared<LocalCommunicator>(name);
}

bool launched_with_several_ranks() {
  return env_int({"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "SLURM_NTASKS"}, 1) > 1;
}

int launcher_rank() { return env_int({"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"}, 0); }

int local_rank() {
  return env_int({"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID", "LOCAL_RANK"}, 0);
}

int local_size() {
  return env_int(
      {"OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE", "MPI_LOCALNRANKS", "LOCAL_WORLD_SIZE"}, 1);
}

}  // namespace ndt::dist
