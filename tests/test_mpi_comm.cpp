// The communicators under mpirun, each collective against a serial reference computed on
// every rank from the same seeded inputs: sizes that do not divide the group, every dtype,
// sub-communicators, handles waited on out of order, and the byte counters.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "dist/comm/communicator.h"
#include "dist/flight.h"
#include "dist/mesh.h"
#include "dist/trace.h"
#include "dist_testing.h"
#include "tensor/kernels.h"

using namespace ndt;
using dist::ReduceOp;

namespace {

// Rank r's input of n elements: seeded by (tag, r), so every rank can rebuild any rank's.
Tensor input(int r, int64_t n, DType d, uint64_t tag) {
  Tensor t = Tensor::empty({n}, DType::f64);
  kernels::fill_uniform(t, 11, tag * 1000 + static_cast<uint64_t>(r), 0, -4.0f, 4.0f);
  if (d == DType::i32) {
    std::vector<int32_t> v;
    for (double x : t.to_vector<double>()) v.push_back(static_cast<int32_t>(std::lround(x * 100)));
    return Tensor::from_vector(v, {n});
  }
  return t.to(d);
}

std::vector<double> values(const Tensor& t) { return t.to_vector<double>(); }

// The tolerance of a sum of `n` values in dtype d (bf16 is reduced in f32, then rounded).
double tol(DType d) { return d == DType::bf16 ? 2e-2 : d == DType::f32 ? 1e-5 : d == DType::f64 ? 1e-12 : 0; }

const DType kTypes[] = {DType::f32, DType::bf16, DType::f64, DType::i32};

TEST(DistComm, WorldHasEveryRank) {
  auto w = ndt::testing::world();
  EXPECT_GE(w->size(), 2);
  EXPECT_EQ(w->backend(), "mpi");
  EXPECT_EQ(w->all_reduce_scalar(1.0, ReduceOp::kSum), w->size());
  EXPECT_EQ(w->all_reduce_scalar(w->rank(), ReduceOp::kMax), w->size() - 1);
}

TEST(DistComm, AllReduceSumMeanMaxEveryDtype) {
  auto w = ndt::testing::world();
  const int n = w->size();
  for (DType d : kTypes)
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
      if (d == DType::i32 && op == ReduceOp::kAvg) continue;
      const int64_t len = 1000 + 7;  // not a multiple of anything
      Tensor t = input(w->rank(), len, d, 1);
      w->all_reduce(t, op)->wait();
      std::vector<double> want(len, op == ReduceOp::kMax ? -1e300 : 0.0);
      for (int r = 0; r < n; ++r) {
        std::vector<double> x = values(input(r, len, d, 1));
        for (int64_t i = 0; i < len; ++i)
          want[i] = op == ReduceOp::kMax ? std::max(want[i], x[i]) : want[i] + x[i];
      }
      std::vector<double> got = values(t);
      double worst = 0;
      for (int64_t i = 0; i < len; ++i) {
        const double w_i = op == ReduceOp::kAvg ? want[i] / n : want[i];
        worst = std::max(worst, std::abs(got[i] - w_i) / (1 + std::abs(w_i)));
      }
      EXPECT_LE(worst, tol(d)) << dtype_name(d) << " op " << static_cast<int>(op);
    }
}

TEST(DistComm, AllGatherAndReduceScatterWithPaddedSizes) {
  auto w = ndt::testing::world();
  const int n = w->size();
  for (DType d : kTypes) {
    // a buffer of 1001 elements, padded by the caller to a multiple of n
    const int64_t total = 1001, chunk = (total + n - 1) / n;
    Tensor mine = input(w->rank(), chunk, d, 2), all = Tensor::zeros({chunk * n}, d);
    w->all_gather(all, mine)->wait();
    std::vector<double> got = values(all);
    for (int r = 0; r < n; ++r) {
      std::vector<double> x = values(input(r, chunk, d, 2));
      for (int64_t i = 0; i < chunk; ++i)
        ASSERT_EQ(got[r * chunk + i], x[i]) << dtype_name(d) << " rank " << r;
    }
    if (d == DType::i32) continue;  // reduce-scatter with mean: float types
    Tensor in = input(w->rank(), chunk * n, d, 3), out = Tensor::zeros({chunk}, d);
    w->reduce_scatter(out, in, ReduceOp::kAvg)->wait();
    std::vector<double> want(chunk, 0.0);
    for (int r = 0; r < n; ++r) {
      std::vector<double> x = values(input(r, chunk * n, d, 3));
      for (int64_t i = 0; i < chunk; ++i) want[i] += x[w->rank() * chunk + i] / n;
    }
    std::vector<double> o = values(out);
    for (int64_t i = 0; i < chunk; ++i)
      EXPECT_NEAR(o[i], want[i], tol(d) * (1 + std::abs(want[i]))) << dtype_name(d);
  }
}

TEST(DistComm, BroadcastSendRecvRing) {
  auto w = ndt::testing::world();
  const int n = w->size(), r = w->rank();
  Tensor b = r == n - 1 ? input(n - 1, 33, DType::f32, 4) : Tensor::zeros({33});
  w->broadcast(b, n - 1)->wait();
  EXPECT_EQ(values(b), values(input(n - 1, 33, DType::f32, 4)));
  // a ring: send to the right, receive from the left, both in flight at once
  Tensor out = input(r, 50, DType::bf16, 5), in = Tensor::zeros({50}, DType::bf16);
  dist::WorkPtr s = w->send(out, (r + 1) % n), rv = w->recv(in, (r + n - 1) % n);
  rv->wait();
  s->wait();
  EXPECT_EQ(values(in), values(input((r + n - 1) % n, 50, DType::bf16, 5)));
}

TEST(DistComm, HandlesWaitedOutOfOrder) {
  auto w = ndt::testing::world();
  const int n = w->size();
  std::vector<Tensor> ts;
  std::vector<dist::WorkPtr> ws;
  for (int k = 0; k < 6; ++k) {
    ts.push_back(input(w->rank(), 100 + k, DType::f32, 10 + k));
    ws.push_back(w->all_reduce(ts.back(), ReduceOp::kSum));
  }
  for (int k = 5; k >= 0; --k) ws[k]->wait();  // last first
  for (int k = 0; k < 6; ++k) {
    std::vector<double> want(100 + k, 0.0);
    for (int r = 0; r < n; ++r) {
      std::vector<double> x = values(input(r, 100 + k, DType::f32, 10 + k));
      for (size_t i = 0; i < want.size(); ++i) want[i] += x[i];
    }
    std::vector<double> got = values(ts[k]);
    for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-4);
    ws[k]->wait();  // again: fine
  }
}

TEST(DistComm, SubCommunicatorsBySplit) {
  auto w = ndt::testing::world();
  const int n = w->size(), r = w->rank();
  // even and odd ranks, ordered backwards
  auto sub = w->split(r % 2, -r, "parity");
  const int members = (n + 1 - r % 2) / 2;
  EXPECT_EQ(sub->size(), members);
  EXPECT_EQ(sub->name(), "parity");
  // ranks of the same parity with larger world rank come first (key -r)
  int before = 0;
  for (int q = r % 2; q < n; q += 2)
    if (q > r) ++before;
  EXPECT_EQ(sub->rank(), before);
  double s = sub->all_reduce_scalar(r, ReduceOp::kSum), want = 0;
  for (int q = r % 2; q < n; q += 2) want += q;
  EXPECT_EQ(s, want);
}

TEST(DistComm, ByteCountersFollowTheRingFormulas) {
  auto w = ndt::testing::world();
  const int64_t n = w->size();
  auto c = w->split(0, w->rank(), "counted");
  Tensor t = Tensor::zeros({n * 64}), part = Tensor::zeros({64});
  c->all_reduce(t, ReduceOp::kSum)->wait();
  c->all_gather(t, part)->wait();
  c->reduce_scatter(part, t, ReduceOp::kSum)->wait();
  const int64_t B = n * 64 * 4;  // bytes of t
  EXPECT_EQ(c->stats()[dist::CommKind::kAllReduce], 2 * (n - 1) * B / n);
  EXPECT_EQ(c->stats()[dist::CommKind::kAllGather], (n - 1) * B / n);
  EXPECT_EQ(c->stats()[dist::CommKind::kReduceScatter], (n - 1) * B / n);
  EXPECT_EQ(c->stats().calls[static_cast<size_t>(dist::CommKind::kAllGather)], 1);
  EXPECT_EQ(c->stats().across_hosts, 0) << "without hosts every member is local";
  c->reset_stats();
  EXPECT_EQ(c->stats().total_bytes(), 0);
}

TEST(DistComm, BytesToAnotherHostAreCountedByTheRingsNextMember) {
  // pretend ranks 0..n/2-1 are on one host and the rest on another: in a ring each rank
  // sends to the next member, so the bytes cross hosts on the last rank of each host
  auto w = ndt::testing::world();
  const int n = w->size(), r = w->rank();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks";
  auto c = w->split(0, r, "hosts");
  auto host = [&](int q) { return q < (n + 1) / 2 ? 0 : 1; };
  std::vector<bool> remote;
  for (int q = 0; q < n; ++q) remote.push_back(host(q) != host(r));
  c->set_remote_members(remote);
  EXPECT_TRUE(c->spans_hosts());
  Tensor t = Tensor::zeros({n * 64}), part = Tensor::zeros({64});
  c->all_reduce(t, ReduceOp::kSum)->wait();
  c->all_gather(t, part)->wait();
  const int64_t sent = c->stats().total_bytes();
  EXPECT_GT(sent, 0);
  EXPECT_EQ(c->stats().across_hosts, host((r + 1) % n) != host(r) ? sent : 0) << "rank " << r;
  // a send counts by its destination
  c->reset_stats();
  if (r == 0) c->send(part, n - 1)->wait();
  if (r == n - 1) c->recv(part, 0)->wait();
  if (r == 0) EXPECT_EQ(c->stats().across_hosts, host(n - 1) != host(0) ? 256 : 0);
}

TEST(DistComm, ACollectiveAPeerNeverJoinsTimesOutNamingIt) {
  // on a group of its own with a deadline: rank 0 all-reduces, the others do not (yet)
  auto w = ndt::testing::world();
  auto g = w->split(0, w->rank(), "late");
  g->set_timeout(0.3);
  auto child = g->split(0, g->rank(), "late_child");
  EXPECT_EQ(child->timeout(), 0.3) << "groups split later inherit the deadline";
  Tensor x = Tensor::from_vector(std::vector<float>{1.0f, 2.0f}, {2});
  dist::WorkPtr pending;
  if (w->rank() == 0) {
    pending = g->all_reduce(x, ReduceOp::kSum);
    try {
      pending->wait();
      ADD_FAILURE() << "no timeout";
    } catch (const dist::CollectiveTimeout& e) {
      const std::string m = e.what();
      EXPECT_EQ(m.rfind("late.all_reduce (", 0), 0u) << m;  // the bytes: the ring formula's
      // then the group in words (its name, without a mesh): "(8 bytes; late)"
      EXPECT_NE(m.find(" bytes; late) on world rank 0 has not completed after 0.3 s (parallel.timeout_s)"),
                std::string::npos)
          << m;
    }
  }
  w->barrier();  // then the others join: the late collective completes everywhere
  if (w->rank() != 0) g->all_reduce(x, ReduceOp::kSum)->wait();
  if (w->rank() == 0)
    for (int i = 0; i < 1000 && !pending->done(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  if (w->rank() == 0) {
    ASSERT_TRUE(pending->done());
  }
  EXPECT_EQ(values(x)[0], 1.0 * w->size());  // every rank added its 1
}

// parallel.timeout_s of 1e10 (a natural "forever") or the largest double must mean that:
// the collective waits for a late peer instead of timing out at once (the deadline once
// overflowed when converted to int64 nanoseconds).
TEST(DistComm, AFarDeadlineWaitsForALatePeer) {
  auto w = ndt::testing::world();
  for (const double forever : {1e10, 1e300}) {
    auto g = w->split(0, w->rank(), "patient");
    g->set_timeout(forever);
    Tensor x = Tensor::from_vector(std::vector<float>{1.0f}, {1});
    if (w->rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));  // late
    EXPECT_NO_THROW(g->all_reduce(x, ReduceOp::kSum)->wait()) << forever;
    EXPECT_EQ(values(x)[0], 1.0 * w->size());
  }
}

TEST(DistComm, TheFlightRecorderKeepsEveryOperationOfItsGroups) {
  auto w = ndt::testing::world();
  dist::FlightRecorder flight;
  flight.set_job("a test job");            // a recorder without a job writes no record
  auto g = w->split(0, w->rank(), "rec");  // a group of its own: sequence numbers from 1
  g->set_flight(&flight);
  auto h = g->split(5, w->rank(), "half");  // inherits the recorder; its group names the color
  EXPECT_EQ(g->group(), "rec@0");
  EXPECT_EQ(h->group(), "half@5");
  Tensor x = Tensor::from_vector(std::vector<float>{1.0f, 2.0f}, {2});
  flight.set_step(7);
  g->all_reduce(x, ReduceOp::kSum)->wait();
  g->barrier();
  h->all_reduce(x, ReduceOp::kMax)->wait();
  const std::string path = "/tmp/ndt_flight_" + std::to_string(::getpid()) + ".json";
  flight.dump(path, w->rank(), w->size(), "a test");
  std::stringstream text;
  text << std::ifstream(path).rdbuf();
  std::remove(path.c_str());  // before anything can fail
  const nlohmann::json r = nlohmann::json::parse(text.str());
  EXPECT_EQ(r["rank"], w->rank());
  EXPECT_EQ(r["world"], w->size());
  EXPECT_EQ(r["reason"], "a test");
  ASSERT_EQ(r["entries"].size(), 3u) << r.dump(1);
  const char* what[] = {"rec.all_reduce", "rec.barrier", "half.all_reduce"};
  for (size_t i = 0; i < 3; ++i) {
    const nlohmann::json& e = r["entries"][i];
    EXPECT_EQ(e["what"], what[i]);
    EXPECT_EQ(e["seq"], i < 2 ? static_cast<int64_t>(i + 1) : 1);  // per group
    EXPECT_EQ(e["step"], 7);
    EXPECT_EQ(e["state"], "done");
    EXPECT_LE(e["queued_us"].get<int64_t>(), e["started_us"].get<int64_t>());
    EXPECT_LE(e["started_us"].get<int64_t>(), e["finished_us"].get<int64_t>());
  }
}

// A send or receive in a group records its peer as a world rank: in a group whose order is
// the world's reversed, group rank p is world rank n - 1 - p.
TEST(DistComm, TheFlightRecordNamesThePeerOfASendOrReceiveByItsWorldRank) {
  auto w = ndt::testing::world();
  const int n = w->size(), r = w->rank();
  if (n < 2) GTEST_SKIP() << "needs 2 ranks";
  dist::FlightRecorder flight;
  flight.set_job("a test job");
  auto g = w->split(0, n - 1 - r, "rev");
  g->set_flight(&flight);
  const int gr = g->rank();  // n - 1 - r
  Tensor out = Tensor::from_vector(std::vector<float>{1.0f}, {1}), in = Tensor::zeros({1});
  dist::WorkPtr s = g->send(out, (gr + 1) % n), rv = g->recv(in, (gr + n - 1) % n);
  s->wait();
  rv->wait();
  const std::string path = "/tmp/ndt_flight_peer_" + std::to_string(::getpid()) + ".json";
  flight.dump(path, r, n, "a test");
  std::stringstream text;
  text << std::ifstream(path).rdbuf();
  std::remove(path.c_str());
  const nlohmann::json rec = nlohmann::json::parse(text.str());
  ASSERT_EQ(rec["entries"].size(), 2u) << rec.dump(1);
  EXPECT_EQ(rec["entries"][0]["what"], "rev.send");
  EXPECT_EQ(rec["entries"][0]["peer"], n - 1 - (gr + 1) % n);
  EXPECT_EQ(rec["entries"][1]["peer"], n - 1 - (gr + n - 1) % n);
}

TEST(DistComm, BadArgumentsNameTheCall) {
  auto w = ndt::testing::world();
  Tensor a = Tensor::zeros({10}), b = Tensor::zeros({10 * w->size() + 1});
  try {
    w->all_gather(b, a);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("world.all_gather"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("pad"), std::string::npos) << e.what();
  }
  Tensor strided = Tensor::zeros({4, 4}).transpose(0, 1);
  EXPECT_THROW(w->all_reduce(strided, ReduceOp::kSum), Error);
}

TEST(DistComm, CollectivesProgressWhileTheRankComputes) {
  // The communication thread drives MPI: a collective started before a long computation
  // is finished by the time the computation ends, without any call from this thread.
  auto w = ndt::testing::world();
  Tensor t = Tensor::zeros({1 << 16});
  dist::Trace trace(w->rank());
  w->set_trace(&trace);
  dist::WorkPtr h = w->all_reduce(t, ReduceOp::kSum);
  bool finished = false;
  for (int i = 0; i < 2000 && !finished; ++i) {  // up to ~2 s of "compute", no MPI calls
    volatile double x = 0;
    for (int k = 0; k < 200000; ++k) x = x + std::sqrt(static_cast<double>(k));
    finished = h->done();
  }
  EXPECT_TRUE(finished);
  h->wait();
  w->set_trace(nullptr);
  EXPECT_GE(trace.size(), 1u);  // the collective is on the comm track
}

TEST(DistMesh, ResolveAndCoordinates) {
  dist::ParallelDims d = dist::ParallelDims::resolve(1, 2, -1, 1, 1, 8);
  EXPECT_EQ(d.dp_shard, 4);
  EXPECT_EQ(d.strategy(), "HSDP");
  dist::ParallelDims e = dist::ParallelDims::resolve(1, 2, 2, 2, 2, 16);
  for (int64_t r = 0; r < 16; ++r) EXPECT_EQ(e.rank_of(e.coords(r)), r);
  EXPECT_EQ(e.coords(5).tp, 1);
  EXPECT_EQ(e.coords(5).cp, 0);
  EXPECT_EQ(e.coords(5).shard, 1);
  try {
    dist::ParallelDims::resolve(1, 2, 2, 1, 1, 6);
    ADD_FAILURE();
  } catch (const Error& err) {
    const std::string m = err.what();
    EXPECT_NE(m.find("multiply to 4"), std::string::npos) << m;
    EXPECT_NE(m.find("has 6"), std::string::npos) << m;
  }
  EXPECT_THROW(dist::ParallelDims::resolve(1, 3, -1, 1, 1, 8), Error);
  EXPECT_THROW(dist::ParallelDims::resolve(1, 0, 1, 1, 1, 1), Error);
}

TEST(DistMesh, EveryDimensionGroupsTheRightRanks) {
  auto w = ndt::testing::world();
  const int64_t n = w->size();
  // replicate x shard = 2 x (n/2) when n is even, else 1 x n
  const int64_t R = n % 2 == 0 ? 2 : 1;
  dist::DeviceMesh mesh(dist::ParallelDims::resolve(1, R, -1, 1, 1, n), w);
  EXPECT_EQ(mesh.replicate().size(), R);
  EXPECT_EQ(mesh.shard().size(), n / R);
  EXPECT_EQ(mesh.dp().size(), n);
  EXPECT_EQ(mesh.fsdp().size(), n / R);
  EXPECT_EQ(mesh.tp().size(), 1);
  EXPECT_EQ(mesh.dp_rank(), w->rank());
  // the sum of world ranks over my shard group is the sum of its members
  const double s = mesh.shard().all_reduce_scalar(w->rank(), ReduceOp::kSum);
  const int64_t r0 = mesh.coords().replicate * (n / R);
  double want = 0;
  for (int64_t q = r0; q < r0 + n / R; ++q) want += q;
  EXPECT_EQ(s, want);
  const std::string layout = mesh.describe();
  EXPECT_NE(layout.find("rank " + std::to_string(n - 1)), std::string::npos) << layout;
}

}  // namespace

#include "dist/comm/nccl.h"
#include "tensor/cuda/runtime.h"

namespace {

TEST(DistNccl, CollectivesOnTheGpuMatchTheCpu) {
  // One GPU may be shared by every rank here, and NCCL refuses two ranks on one device: each
  // rank builds a NCCL communicator over a group of its own, on its local GPU, and checks
  // that the collectives run on the device and leave the right values. (With one rank per
  // GPU, train_gpt's NCCL world is the same code over more ranks.)
  if (!cuda::available() || !dist::nccl_compiled()) GTEST_SKIP() << "no GPU or no NCCL in this build";
  auto w = ndt::testing::world();
  auto mine = w->split(w->rank(), 0, "self");
  auto nccl = dist::nccl_communicator(mine, dist::local_rank() % cuda::device_count());
  const Device gpu = Device::cuda(dist::local_rank() % cuda::device_count());
  EXPECT_EQ(nccl->backend(), "nccl");
  for (DType d : {DType::f32, DType::bf16}) {
    Tensor host = input(w->rank(), 1000, d, 21);
    Tensor t = host.to(gpu), out = Tensor::zeros({1000}, d, gpu);
    nccl->all_reduce(t, ReduceOp::kAvg)->wait();
    nccl->all_gather(out, t)->wait();
    nccl->reduce_scatter(t, out, ReduceOp::kSum)->wait();
    cuda::synchronize(gpu.index);
    EXPECT_EQ(values(t.to(Device::cpu())), values(host)) << dtype_name(d);
  }
}

}  // namespace
