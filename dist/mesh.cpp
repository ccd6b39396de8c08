#include "dist/mesh.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <sstream>

#include "tensor/checked.h"

namespace ndt::dist {

ParallelDims ParallelDims::resolve(int64_t p, int64_t r, int64_t s, int64_t c, int64_t t, int64_t world) {
  return resolve_sp(p, r, s, c, 1, t, world);
}

ParallelDims ParallelDims::resolve_sp(int64_t p, int64_t r, int64_t s, int64_t c, int64_t u, int64_t t,
                                      int64_t world) {
  auto sizes = [&] {
    return std::string(p > 1 ? "pp_size " + std::to_string(p) + ", " : "") + "dp_replicate_size " +
           std::to_string(r) + ", dp_shard_size " + std::to_string(s) + ", cp_size " + std::to_string(c) +
           (u != 1 ? ", sp_size " + std::to_string(u) : "") + ", tp_size " + std::to_string(t);
  };
  NDT_CHECK(p >= 1 && r >= 1 && c >= 1 && u >= 1 && t >= 1 && (s >= 1 || s == -1),
            "[parallel] sizes must be >= 1 (dp_shard_size may be -1: ", "the rest of the world), got ",
            sizes());
  const char* what = "[parallel] sizes";
  if (s == -1) {
    const int64_t rest =
        checked_mul(checked_mul(checked_mul(checked_mul(p, r, what), c, what), u, what), t, what);
    NDT_CHECK(world % rest == 0, "[parallel] dp_shard_size = -1 takes the rest of the world, but ", world,
              " ranks are not divisible by ", p > 1 ? "pp_size x " : "", "dp_replicate_size x cp_size x ",
              u != 1 ? "sp_size x " : "", "tp_size = ", rest, " (", sizes(), ")");
    s = world / rest;
  }
  // the product must fit int64 before it is compared (sizes that wrap could match any world)
  const int64_t product = checked_mul(
      checked_mul(checked_mul(checked_mul(checked_mul(p, r, what), s, what), c, what), u, what), t, what);
  ParallelDims d{p, r, s, c, t, u};
  NDT_CHECK(product == world, "[parallel] ", sizes(), " multiply to ", d.world(), " ranks but the job has ",
            world, "; make the product equal the number of ranks (mpirun -np ", d.world(),
            ") or set dp_shard_size = -1 to take the rest");
  return d;
}

ParallelDims ParallelDims::resolve(const ParallelConfig& c, int64_t world) {
  ParallelDims d =
      resolve_sp(c.pp_size, c.dp_replicate_size, c.dp_shard_size, c.cp_size, c.sp_size, c.tp_size, world);
  d.set_expert_parallel(c.ep_size);
  return d;
}

void ParallelDims::set_expert_parallel(int64_t e) {
  NDT_CHECK(e >= 1, "[parallel] ep_size must be >= 1, got ", e);
  const bool in_shard = dp_shard > 1;
  NDT_CHECK(e == 1 || (in_shard ? dp_shard : dp_replicate) % e == 0, "[parallel] ep_size = ", e,
            " must divide ",
            in_shard ? "dp_shard_size = " : "dp_replicate_size = ", in_shard ? dp_shard : dp_replicate,
            " (the expert-parallel ranks are consecutive data ranks of one ",
            in_shard ? "shard group" : "replicate group, dp_shard_size being 1", ")");
  ep = e;
}

ParallelDims::Coords ParallelDims::coords(int64_t rank) const {
  Coords c;
  c.tp = rank % tp;
  rank /= tp;
  c.sp = rank % sp;
  rank /= sp;
  c.cp = rank % cp;
  rank /= cp;
  c.shard = rank % dp_shard;
  rank /= dp_shard;
  c.replicate = rank % dp_replicate;
  c.pp = rank / dp_replicate;
  return c;
}

int64_t ParallelDims::rank_of(const Coords& c) const {
  return ((((c.pp * dp_replicate + c.replicate) * dp_shard + c.shard) * cp + c.cp) * sp + c.sp) * tp + c.tp;
}

std::string ParallelDims::str() const {
  std::ostringstream os;
  if (pp > 1) os << "pp " << pp << " x ";
  os << "dp_replicate " << dp_replicate << " x dp_shard " << dp_shard << " x cp " << cp;
  if (sp > 1) os << " x sp " << sp;
  os << " x tp " << tp << " = " << world() << (world() == 1 ? " rank" : " ranks");
  if (ep > 1) os << ", ep " << ep;
  return os.str();
}

std::string ParallelDims::strategy() const {
  // how gradients are synchronized: FSDP whenever parameters are sharded (over shard x cp),
  // HSDP when there are replicas of the sharded model too, DP with replicas only
  std::vector<std::string> parts;
  if (fsdp() > 1)
    parts.push_back(std::string(dp_replicate > 1 ? "HSDP" : "FSDP") +
                    (dp_shard == 1 ? (sp > 1 ? (cp > 1 ? " over cp x sp" : " over sp") : " over cp") : ""));
  else if (dp_replicate > 1)
    parts.push_back("DP");
  if (cp > 1) parts.push_back("CP");
  if (sp > 1) parts.push_back("SP");
  if (tp > 1) parts.push_back("TP");
  if (pp > 1) parts.push_back("PP");
  if (ep > 1) parts.push_back("EP");
  if (parts.empty()) return "single process";
  std::string s;
  for (size_t i = 0; i < parts.size(); ++i) s += (i ? " + " : "") + parts[i];
  return s;
}

// Each group of the mesh: the coordinates that stay fixed pick it (its color), the others
// order its members (its key). Every group but the pipeline's lies inside one stage: the
// stage is part of its color (in_stage).
namespace {
using Coords = ParallelDims::Coords;
struct GroupRule {
  int64_t color, key;
};
GroupRule in_stage(const ParallelDims& d, const Coords& x, GroupRule g) {
  return {x.pp * d.stage_size() + g.color, g.key};
}
// cp x sp, the two dimensions that split the sequence, as one index (sp = 1: the cp rank)
int64_t cs(const ParallelDims& d, const Coords& x) { return x.cp * d.sp + x.sp; }
int64_t CS(const ParallelDims& d) { return d.cp * d.sp; }
GroupRule pp_rule(const ParallelDims& d, const Coords& x) {
  return {((x.replicate * d.dp_shard + x.shard) * CS(d) + cs(d, x)) * d.tp + x.tp, x.pp};
}
GroupRule replicate_rule(const ParallelDims& d, const Coords& x) {
  return in_stage(d, x, {(x.shard * CS(d) + cs(d, x)) * d.tp + x.tp, x.replicate});
}
GroupRule shard_rule(const ParallelDims& d, const Coords& x) {
  return in_stage(d, x, {(x.replicate * CS(d) + cs(d, x)) * d.tp + x.tp, x.shard});
}
GroupRule cp_rule(const ParallelDims& d, const Coords& x) {
  return in_stage(d, x, {((x.replicate * d.dp_shard + x.shard) * d.sp + x.sp) * d.tp + x.tp, x.cp});
}
GroupRule sp_rule(const ParallelDims& d, const Coords& x) {
  return in_stage(d, x, {((x.replicate * d.dp_shard + x.shard) * d.cp + x.cp) * d.tp + x.tp, x.sp});
}
GroupRule tp_rule(const ParallelDims& d, const Coords& x) {
  return in_stage(d, x, {(x.replicate * d.dp_shard + x.shard) * CS(d) + cs(d, x), x.tp});
}
GroupRule dp_rule(const ParallelDims& d, const Coords& x) {
  return in_stage(d, x, {cs(d, x) * d.tp + x.tp, x.replicate * d.dp_shard + x.shard});
}
GroupRule fsdp_rule(const ParallelDims& d, const Coords& x) {
  return in_stage(d, x, {x.replicate * d.tp + x.tp, x.shard * CS(d) + cs(d, x)});
}
// expert parallelism: ep consecutive data ranks (ep); those of one ep rank across the groups (ep_data)
int64_t dp_of(const ParallelDims& d, const Coords& x) { return x.replicate * d.dp_shard + x.shard; }
GroupRule ep_rule(const ParallelDims& d, const Coords& x) {
  return in_stage(d, x, {(dp_of(d, x) / d.ep * CS(d) + cs(d, x)) * d.tp + x.tp, dp_of(d, x) % d.ep});
}
GroupRule ep_data_rule(const ParallelDims& d, const Coords& x) {
  return in_stage(d, x, {(dp_of(d, x) % d.ep * CS(d) + cs(d, x)) * d.tp + x.tp, dp_of(d, x) / d.ep});
}
// expert parallelism inside FSDP: the FSDP ranks of this rank's replica that hold its experts
// (dp_rank % ep alike: shard % ep, or with dp_shard = 1 the replica's own), and the replicas of
// this rank's FSDP position that hold them (all of them when ep lies in the shard group)
GroupRule ep_shard_rule(const ParallelDims& d, const Coords& x) {
  return in_stage(d, x,
                  {(x.replicate * d.dp_shard + x.shard % d.ep) * d.tp + x.tp, x.shard * CS(d) + cs(d, x)});
}
GroupRule ep_replicate_rule(const ParallelDims& d, const Coords& x) {
  const int64_t slice = d.dp_shard == 1 ? x.replicate % d.ep : 0;  // ep over the replicas
  return in_stage(d, x, {((x.shard + slice) * CS(d) + cs(d, x)) * d.tp + x.tp, x.replicate});
}
using Rule = GroupRule (*)(const ParallelDims&, const Coords&);

// The world ranks of the group `rule` gives `rank`, in the group's order.
std::vector<int64_t> members(const ParallelDims& d, Rule rule, int64_t rank) {
  const int64_t color = rule(d, d.coords(rank)).color;
  std::vector<std::pair<int64_t, int64_t>> by_key;
  for (int64_t w = 0; w < d.world(); ++w) {
    const GroupRule g = rule(d, d.coords(w));
    if (g.color == color) by_key.push_back({g.key, w});
  }
  std::sort(by_key.begin(), by_key.end());
  std::vector<int64_t> m;
  for (const auto& [key, w] : by_key) m.push_back(w);
  return m;
}
}  // namespace

DeviceMesh::DeviceMesh(const ParallelDims& dims, std::shared_ptr<Communicator> world)
    : dims_(dims), world_(std::move(world)) {
  NDT_CHECK(dims_.world() == world_->size(), "DeviceMesh: ", dims_.str(), " but the world has ",
            world_->size(), " ranks");
  coords_ = dims_.coords(world_->rank());
  auto split = [&](Rule rule, const char* name) {
    const GroupRule g = rule(dims_, coords_);
    return world_->split(static_cast<int>(g.color), static_cast<int>(g.key), name);
  };
  pp_ = split(pp_rule, "pp");
  replicate_ = split(replicate_rule, "dp_replicate");
  shard_ = split(shard_rule, "dp_shard");
  cp_ = split(cp_rule, "cp");
  sp_ = split(sp_rule, "sp");
  tp_ = split(tp_rule, "tp");
  dp_ = split(dp_rule, "dp");
  fsdp_ = split(fsdp_rule, "fsdp");
  ep_ = split(ep_rule, "ep");
  ep_data_ = split(ep_data_rule, "ep_data");
  ep_shard_ = split(ep_shard_rule, "ep_shard");
  ep_replicate_ = split(ep_replicate_rule, "ep_replicate");
  gather_hosts();
  describe_groups();
}

void DeviceMesh::gather_hosts() {
  // fixed-size words in CPU tensors (the world may be MPI, NCCL or local; this runs once)
  constexpr int64_t kWords = 16;  // 64 bytes of host name, then the local rank
  char host[kWords * 4] = {};
  ::gethostname(host, sizeof(host) - 1);
  const int64_t n = dims_.world();
  hosts_.assign(static_cast<size_t>(n), host);
  local_ranks_.assign(static_cast<size_t>(n), local_rank());
  if (n == 1) return;
  Tensor mine = Tensor::zeros({kWords + 1}, DType::i32),
         all = Tensor::zeros({(kWords + 1) * n}, DType::i32, world_->device());
  std::memcpy(mine.data_ptr(), host, sizeof(host));
  static_cast<int32_t*>(mine.data_ptr())[kWords] = local_rank();
  world_->all_gather(all, mine.to(world_->device()))->wait();
  world_->reset_stats();  // the layout's own bytes are not the training's
  all = all.to(Device::cpu());
  for (int64_t i = 0; i < n; ++i) {
    const int32_t* w = static_cast<const int32_t*>(all.data_ptr()) + i * (kWords + 1);
    const char* p = reinterpret_cast<const char*>(w);
    hosts_[static_cast<size_t>(i)] = std::string(p, strnlen(p, kWords * 4 - 1));
    local_ranks_[static_cast<size_t>(i)] = w[kWords];
  }
}

void DeviceMesh::describe_groups() {
  const int64_t me = world_->rank();
  // "of replica 1, cp rank 0": the coordinates that pick the group, of sizes above 1
  auto of = [&](bool r, bool s, bool c, bool t, bool stage = true, bool u = true) {
    std::vector<std::string> parts;
    if (stage && dims_.pp > 1) parts.push_back("stage " + std::to_string(coords_.pp));
    if (r && dims_.dp_replicate > 1) parts.push_back("replica " + std::to_string(coords_.replicate));
    if (s && dims_.dp_shard > 1) parts.push_back("shard " + std::to_string(coords_.shard));
    if (c && dims_.cp > 1) parts.push_back("cp rank " + std::to_string(coords_.cp));
    if (u && dims_.sp > 1) parts.push_back("sp rank " + std::to_string(coords_.sp));
    if (t && dims_.tp > 1) parts.push_back("tp rank " + std::to_string(coords_.tp));
    std::string o;
    for (size_t i = 0; i < parts.size(); ++i) o += (i ? ", " : " of ") + parts[i];
    return o;
  };
  struct Group {
    Communicator* comm;
    Rule rule;
    std::string words;
  };
  const Group groups[] = {
      {pp_.get(), pp_rule, "the pipeline" + of(true, true, true, true, false)},
      {replicate_.get(), replicate_rule, "the replicate group" + of(false, true, true, true)},
      {shard_.get(), shard_rule, "the shard group" + of(true, false, true, true)},
      {cp_.get(), cp_rule, "the context-parallel ring" + of(true, true, false, true)},
      {sp_.get(), sp_rule, "the Ulysses sequence-parallel group" + of(true, true, true, true, true, false)},
      {tp_.get(), tp_rule, "the tensor-parallel group" + of(true, true, true, false)},
      {dp_.get(), dp_rule, "the data-parallel group" + of(false, false, true, true)},
      {fsdp_.get(), fsdp_rule,
       std::string(dims_.sp > 1 ? "the FSDP group (shard x cp x sp)" : "the FSDP group (shard x cp)") +
           of(true, false, false, true, true, false)},
      {ep_.get(), ep_rule,
       "the expert-parallel group (data ranks " + std::to_string(dp_rank() / dims_.ep * dims_.ep) + "-" +
           std::to_string(dp_rank() / dims_.ep * dims_.ep + dims_.ep - 1) + ")" +
           of(false, false, true, true)},
      {ep_data_.get(), ep_data_rule,
       "the ranks holding expert slice " + std::to_string(ep_rank()) + of(false, false, true, true)},
      {ep_shard_.get(), ep_shard_rule,
       "the FSDP ranks holding expert slice " + std::to_string(ep_rank()) + of(true, false, false, true)},
      {ep_replicate_.get(), ep_replicate_rule,
       "the replicas holding expert slice " + std::to_string(ep_rank()) + of(false, true, true, true)},
  };
  for (const Group& g : groups) {
    std::vector<bool> remote;
    for (int64_t w : members(dims_, g.rule, me))
      remote.push_back(hosts_[static_cast<size_t>(w)] != hosts_[static_cast<size_t>(me)]);
    g.comm->set_remote_members(std::move(remote));
    g.comm->set_description(g.words);
  }
  std::vector<bool> remote;
  for (const std::string& h : hosts_) remote.push_back(h != hosts_[static_cast<size_t>(me)]);
  world_->set_remote_members(std::move(remote));
  world_->set_description("the world");
}

std::vector<Communicator*> DeviceMesh::all() const {
  return {world_.get(),   pp_.get(),       replicate_.get(),   shard_.get(), cp_.get(),
          sp_.get(),      tp_.get(),       dp_.get(),          fsdp_.get(),  ep_.get(),
          ep_data_.get(), ep_shard_.get(), ep_replicate_.get()};
}

int64_t DeviceMesh::bytes_sent() const {
  int64_t b = 0;
  for (Communicator* c : all()) b += c->stats().total_bytes();
  return b;
}

int64_t DeviceMesh::bytes_across_hosts() const {
  int64_t b = 0;
  for (Communicator* c : all()) b += c->stats().across_hosts;
  return b;
}

bool DeviceMesh::spans_hosts() const {
  for (const std::string& h : hosts_)
    if (h != hosts_.front()) return true;
  return false;
}

void DeviceMesh::reset_stats() const {
  for (Communicator* c : all()) c->reset_stats();
}

std::string DeviceMesh::describe() const {
  const int64_t n = dims_.world();
  const auto& hosts = hosts_;
  std::ostringstream os;
  os << "mesh: " << dims_.str() << " (" << dims_.strategy() << "), rank = " << (dims_.sp > 1 ? "(" : "")
     << (dims_.pp > 1 ? "(((stage*" + std::to_string(dims_.dp_replicate) + " + replicate)*" : "((replicate*")
     << dims_.dp_shard << " + shard)*" << dims_.cp << " + cp)*"
     << (dims_.sp > 1 ? std::to_string(dims_.sp) + " + sp)*" : "") << dims_.tp << " + tp\n";
  if (dims_.ep > 1)
    os << "  expert parallel: groups of " << dims_.ep << " consecutive data ranks, ep rank = data rank % "
       << dims_.ep << ", each holding n_experts / " << dims_.ep << " experts of every MoE layer\n";
  if (n <= 16) {
    for (int64_t i = 0; i < n; ++i) {
      const ParallelDims::Coords c = dims_.coords(i);
      os << "  rank " << i << ": " << (dims_.pp > 1 ? "stage " + std::to_string(c.pp) + ", " : "")
         << "replicate " << c.replicate << ", shard " << c.shard << ", cp " << c.cp
         << (dims_.sp > 1 ? ", sp " + std::to_string(c.sp) : "") << ", tp " << c.tp << " on "
         << hosts[static_cast<size_t>(i)] << " (local rank " << local_ranks_[static_cast<size_t>(i)] << ")\n";
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
