#include "dist/mesh.h"

#include <unistd.h>

#include <cstring>
#include <sstream>

#include "tensor/checked.h"

namespace ndt::dist {

ParallelDims ParallelDims::resolve(int64_t r, int64_t s, int64_t c, int64_t t, int64_t world) {
  auto sizes = [&] {
    return "dp_replicate_size " + std::to_string(r) + ", dp_shard_size " + std::to_string(s) + ", cp_size " +
           std::to_string(c) + ", tp_size " + std::to_string(t);
  };
  NDT_CHECK(r >= 1 && c >= 1 && t >= 1 && (s >= 1 || s == -1),
            "[parallel] sizes must be >= 1 (dp_shard_size may be -1: ", "the rest of the world), got ",
            sizes());
  if (s == -1) {
    const int64_t rest = checked_mul(checked_mul(r, c, "[parallel] sizes"), t, "[parallel] sizes");
    NDT_CHECK(world % rest == 0, "[parallel] dp_shard_size = -1 takes the rest of the world, but ", world,
              " ranks are not divisible by dp_replicate_size x cp_size x tp_size = ", rest, " (", sizes(),
              ")");
    s = world / rest;
  }
  // the product must fit int64 before it is compared (sizes that wrap could match any world)
  const int64_t product = checked_mul(
      checked_mul(checked_mul(r, s, "[parallel] sizes"), c, "[parallel] sizes"), t, "[parallel] sizes");
  ParallelDims d{r, s, c, t};
  NDT_CHECK(product == world, "[parallel] ", sizes(), " multiply to ", d.world(), " ranks but the job has ",
            world, "; make the product equal the number of ranks (mpirun -np ", d.world(),
            ") or set dp_shard_size = -1 to take the rest");
  return d;
}

ParallelDims::Coords ParallelDims::coords(int64_t rank) const {
  Coords c;
  c.tp = rank % tp;
  rank /= tp;
  c.cp = rank % cp;
  rank /= cp;
  c.shard = rank % dp_shard;
  c.replicate = rank / dp_shard;
  return c;
}

int64_t ParallelDims::rank_of(const Coords& c) const {
  return ((c.replicate * dp_shard + c.shard) * cp + c.cp) * tp + c.tp;
}

std::string ParallelDims::str() const {
  std::ostringstream os;
  os << "dp_replicate " << dp_replicate << " x dp_shard " << dp_shard << " x cp " << cp << " x tp " << tp
     << " = " << world() << (world() == 1 ? " rank" : " ranks");
  return os.str();
}

std::string ParallelDims::strategy() const {
  // how gradients are synchronized: FSDP whenever parameters are sharded (over shard x cp),
  // HSDP when there are replicas of the sharded model too, DP with replicas only
  std::vector<std::string> parts;
  if (fsdp() > 1)
    parts.push_back(std::string(dp_replicate > 1 ? "HSDP" : "FSDP") + (dp_shard == 1 ? " over cp" : ""));
  else if (dp_replicate > 1)
    parts.push_back("DP");
  if (cp > 1) parts.push_back("CP");
  if (tp > 1) parts.push_back("TP");
  if (parts.empty()) return "single process";
  std::string s;
  for (size_t i = 0; i < parts.size(); ++i) s += (i ? " + " : "") + parts[i];
  return s;
}

DeviceMesh::DeviceMesh(const ParallelDims& dims, std::shared_ptr<Communicator> world)
    : dims_(dims), world_(std::move(world)) {
  NDT_CHECK(dims_.world() == world_->size(), "DeviceMesh: ", dims_.str(), " but the world has ",
            world_->size(), " ranks");
  coords_ = dims_.coords(world_->rank());
  const auto& [r, s, c, t] = coords_;
  const int64_t S = dims_.dp_shard, C = dims_.cp, T = dims_.tp;
  // color: the coordinates that stay fixed in the group; key: the rank inside it
  auto split = [&](int64_t color, int64_t key, const char* name) {
    return world_->split(static_cast<int>(color), static_cast<int>(key), name);
  };
  replicate_ = split((s * C + c) * T + t, r, "dp_replicate");
  shard_ = split((r * C + c) * T + t, s, "dp_shard");
  cp_ = split((r * S + s) * T + t, c, "cp");
  tp_ = split((r * S + s) * C + c, t, "tp");
  dp_ = split(c * T + t, r * S + s, "dp");
  fsdp_ = split(r * T + t, s * C + c, "fsdp");
}

std::vector<Communicator*> DeviceMesh::all() const {
  return {world_.get(), replicate_.get(), shard_.get(), cp_.get(), tp_.get(), dp_.get(), fsdp_.get()};
}

int64_t DeviceMesh::bytes_sent() const {
  int64_t b = 0;
  for (Communicator* c : all()) b += c->stats().total_bytes();
  return b;
}

void DeviceMesh::reset_stats() const {
  for (Communicator* c : all()) c->reset_stats();
}

std::string DeviceMesh::describe() const {
  // Every rank's host name and node-local rank (the launcher's: it picks cuda:<local rank>),
  // gathered as fixed-size words (CPU tensors: the mesh's world may be MPI or local; this
  // runs once at start).
  constexpr int64_t kWords = 16;  // 64 bytes of host name, then the local rank
  char host[kWords * 4] = {};
  ::gethostname(host, sizeof(host) - 1);
  const int64_t n = dims_.world();
  std::vector<std::string> hosts(static_cast<size_t>(n), host);
  std::vector<int32_t> locals(static_cast<size_t>(n), local_rank());
  if (n > 1) {
    Tensor mine = Tensor::zeros({kWords + 1}, DType::i32),
           all = Tensor::zeros({(kWords + 1) * n}, DType::i32, world_->device());
    std::memcpy(mine.data_ptr(), host, sizeof(host));
    static_cast<int32_t*>(mine.data_ptr())[kWords] = local_rank();
    world_->all_gather(all, mine.to(world_->device()))->wait();
    all = all.to(Device::cpu());
    for (int64_t i = 0; i < n; ++i) {
      const int32_t* w = static_cast<const int32_t*>(all.data_ptr()) + i * (kWords + 1);
      const char* p = reinterpret_cast<const char*>(w);
      hosts[static_cast<size_t>(i)] = std::string(p, strnlen(p, kWords * 4 - 1));
      locals[static_cast<size_t>(i)] = w[kWords];
    }
  }
  std::ostringstream os;
  os << "mesh: " << dims_.str() << " (" << dims_.strategy() << "), rank = ((replicate*" << dims_.dp_shard
     << " + shard)*" << dims_.cp << " + cp)*" << dims_.tp << " + tp\n";
  if (n <= 16) {
    for (int64_t i = 0; i < n; ++i) {
      const ParallelDims::Coords c = dims_.coords(i);
      os << "  rank " << i << ": replicate " << c.replicate << ", shard " << c.shard << ", cp " << c.cp
         << ", tp " << c.tp << " on " << hosts[static_cast<size_t>(i)] << " (local rank "
         << locals[static_cast<size_t>(i)] << ")\n";
    }
  } else {
    for (int64_t i = 0; i < n;) {
      int64_t j = i;
      while (j + 1 < n && hosts[static_cast<size_t>(j + 1)] == hosts[static_cast<size_t>(i)]) ++j;
      os << "  ranks " << i << "-" << j << " on " << hosts[static_cast<size_t>(i)] << "\n";
      i = j + 1;
    }
  }
  return os.str();
}

}  // namespace ndt::dist
