// The links and the clock of the planner's replay (train/planner/timeline.h).
#include "train/planner/timeline.h"

#include <algorithm>

namespace ndt::train {

// ---- SharedLink ---------------------------------------------------------------------------

int SharedLink::add(double t, double alone) {
  advance_to(t);
  ends_.push_back(-1);
  active_.push_back({static_cast<int>(ends_.size()) - 1, alone});
  return active_.back().id;
}

double SharedLink::end(int id) {
  while (ends_[static_cast<size_t>(id)] < 0) step(std::numeric_limits<double>::infinity());
  return ends_[static_cast<size_t>(id)];
}

void SharedLink::advance_to(double t) {
  while (!active_.empty() && clock_ < t) step(t);
  clock_ = std::max(clock_, t);
}

void SharedLink::step(double until) {
  const double k = double(active_.size());
  double first = std::numeric_limits<double>::infinity();
  for (const Flow& f : active_) first = std::min(first, f.left);
  const double dt = std::min(first * k, until - clock_);
  clock_ += dt;
  for (Flow& f : active_) f.left -= dt / k;
  const double eps = 1e-12 * std::max(1.0, clock_);
  for (const Flow& f : active_)
    if (f.left <= eps) ends_[static_cast<size_t>(f.id)] = clock_;
  std::erase_if(active_, [&](const Flow& f) { return f.left <= eps; });
}

namespace {

enum class Dim { replicate, fsdp, cp, sp, tp, dp, pp, ep };

// The next member of `rank`'s ring in dimension `dim` (the communicator's order).
int64_t successor(const dist::ParallelDims& dims, int64_t rank, Dim dim) {
  dist::ParallelDims::Coords c = dims.coords(rank);
  switch (dim) {
    case Dim::replicate:
      c.replicate = (c.replicate + 1) % dims.dp_replicate;
      break;
    case Dim::tp:
      c.tp = (c.tp + 1) % dims.tp;
      break;
    case Dim::cp:
      c.cp = (c.cp + 1) % dims.cp;
      break;
    case Dim::sp:
      c.sp = (c.sp + 1) % dims.sp;
      break;
    case Dim::fsdp: {  // shard x cp x sp, sp innermost
      const int64_t next = ((c.shard * dims.cp + c.cp) * dims.sp + c.sp + 1) % dims.fsdp();
      c.shard = next / (dims.cp * dims.sp);
      c.cp = next / dims.sp % dims.cp;
      c.sp = next % dims.sp;
      break;
    }
    case Dim::pp:
      c.pp = (c.pp + 1) % dims.pp;
      break;
    case Dim::dp: {  // replicate x shard, shard inner
      const int64_t next = (c.replicate * dims.dp_shard + c.shard + 1) % dims.dp();
      c.replicate = next / dims.dp_shard;
      c.shard = next % dims.dp_shard;
      break;
    }
    case Dim::ep: {  // ep consecutive data ranks (DeviceMesh::ep)
      const int64_t d = c.replicate * dims.dp_shard + c.shard;
      const int64_t next = d / dims.ep * dims.ep + (d % dims.ep + 1) % dims.ep;
      c.replicate = next / dims.dp_shard;
      c.shard = next % dims.dp_shard;
      break;
    }
  }
  return dims.rank_of(c);
}

// The link a dimension's rings run on. Host 0 stands for every host: the layouts are
// regular, so each host has as many ring edges leaving it.
Link link_of(const dist::ParallelDims& dims, const Cluster& cluster, Dim dim) {
  Link link;
  int64_t leaving = 0, members = 0;
  bool intra_edge = false;
  const int64_t first_host = std::min(cluster.devices_per_host, dims.world());
  for (int64_t rank = 0; rank < first_host; ++rank) {
    const int64_t next = successor(dims, rank, dim);
    if (next == rank) continue;
    ++members;
    if (cluster.host_of(next) != cluster.host_of(rank)) {
      ++leaving;
    } else {
      intra_edge = true;
    }
  }
  if (leaving == 0 && !intra_edge) return link;  // a group of one
  if (leaving == 0) {
    link.bps = cluster.intra_bps;
    link.latency = cluster.intra_latency_s;
    link.cpu_share = cluster.intra_cpu_share;
    return link;
  }
  link.crosses = true;
  link.cross_share = double(leaving) / double(members);
  link.cpu_share =
      link.cross_share * cluster.inter_cpu_share + (1 - link.cross_share) * cluster.intra_cpu_share;
  const double host_share = cluster.inter_bps * double(cluster.devices_per_host) / double(leaving);
  link.bps = intra_edge ? std::min(cluster.intra_bps, host_share) : host_share;
  link.latency = cluster.inter_latency_s;
  return link;
}

// Ulysses' all-to-all: n - 1 steps, in step k every rank sends its piece to the rank k
// further in its sp group (dist/ulysses: one sendrecv after the other). A step's pieces that
// leave a host share its links (devices_per_host x inter_gbps) among the host's ranks that
// send across in that step; the others go at intra_gbps; the step lasts as long as its
// slowest piece. The link is the one whose bandwidth gives the steps' time over n - 1 pieces
// (Link::cpu_share and cross_share: by the steps' pieces that cross).
Link all_to_all_link(const dist::ParallelDims& dims, const Cluster& cluster) {
  const Link ring = link_of(dims, cluster, Dim::sp);
  if (!ring.crosses) return ring;
  const int64_t n = dims.sp, first_host = std::min(cluster.devices_per_host, dims.world());
  double seconds_per_byte = 0, crossing = 0;
  for (int64_t k = 1; k < n; ++k) {
    int64_t leaving = 0, staying = 0;
    for (int64_t rank = 0; rank < first_host; ++rank) {
      dist::ParallelDims::Coords c = dims.coords(rank);
      c.sp = (c.sp + k) % n;
      (cluster.host_of(dims.rank_of(c)) != cluster.host_of(rank) ? leaving : staying) += 1;
    }
    const double across =
        leaving ? double(leaving) / (cluster.inter_bps * double(cluster.devices_per_host)) : 0;
    seconds_per_byte += std::max(staying ? 1 / cluster.intra_bps : 0.0, across);
    crossing += double(leaving) / double(leaving + staying);
  }
  Link link = ring;
  link.bps = double(n - 1) / seconds_per_byte;
  link.cross_share = crossing / double(n - 1);
  link.cpu_share =
      link.cross_share * cluster.inter_cpu_share + (1 - link.cross_share) * cluster.intra_cpu_share;
  return link;
}

}  // namespace

const Link& Links::of(const std::string& dim) const {
  return dim == "tp"        ? tp
         : dim == "cp"      ? cp
         : dim == "sp"      ? sp
         : dim == "fsdp"    ? fsdp
         : dim == "pp"      ? pp
         : dim == "ep"      ? ep
         : dim == "scalars" ? dp
                            : replicate;
}

Links links_of(const dist::ParallelDims& dims, const Cluster& cluster) {
  Links links;
  links.tp = link_of(dims, cluster, Dim::tp);
  links.cp = link_of(dims, cluster, Dim::cp);
  links.sp = all_to_all_link(dims, cluster);
  links.fsdp = link_of(dims, cluster, Dim::fsdp);
  links.replicate = link_of(dims, cluster, Dim::replicate);
  links.dp = link_of(dims, cluster, Dim::dp);
  links.pp = link_of(dims, cluster, Dim::pp);
  links.ep = link_of(dims, cluster, Dim::ep);
  return links;
}

Link link_between(int64_t a, int64_t b, const Cluster& cluster, int64_t leaving) {
  Link link;
  if (a == b) return link;
  link.crosses = cluster.host_of(a) != cluster.host_of(b);
  link.cross_share = link.crosses ? 1 : 0;
  link.bps = link.crosses ? cluster.inter_bps * double(cluster.devices_per_host) /
                                double(std::max<int64_t>(1, leaving))
                          : cluster.intra_bps;
  link.latency = link.crosses ? cluster.inter_latency_s : cluster.intra_latency_s;
  link.cpu_share = link.crosses ? cluster.inter_cpu_share : cluster.intra_cpu_share;
  return link;
}

double all_reduce_s(double bytes, int64_t ranks, const Link& link) {
  return ranks > 1 ? 2.0 * double(ranks - 1) * (link.latency + bytes / double(ranks) / link.bps) : 0.0;
}
double gather_s(double whole_bytes, int64_t ranks, const Link& link) {
  return ranks > 1 ? double(ranks - 1) * (link.latency + whole_bytes / double(ranks) / link.bps) : 0.0;
}
double exchange_s(double bytes, const Link& link) { return link.latency + bytes / link.bps; }
double all_to_all_s(double bytes, int64_t ranks, const Link& link) {
  return ranks > 1 ? double(ranks - 1) * (link.latency + bytes / double(ranks) / link.bps) : 0.0;
}

// ---- Timeline ------------------------------------------------------------------------------

Timeline::Timeline(const Links& links)
    : crosses_{{"tp", links.tp.crosses},
               {"cp", links.cp.crosses},
               {"sp", links.sp.crosses},
               {"fsdp", links.fsdp.crosses},
               {"replicate", links.replicate.crosses},
               {"ep", links.ep.crosses},
               {"scalars", false}},
      cpu_share_{{"tp", links.tp.cpu_share},
                 {"cp", links.cp.cpu_share},
                 {"sp", links.sp.cpu_share},
                 {"fsdp", links.fsdp.cpu_share},
                 {"replicate", links.replicate.cpu_share},
                 {"ep", links.ep.cpu_share},
                 {"scalars", 0.0}} {}

Ticket Timeline::start(const std::string& dim, double seconds) {
  Ticket ticket{0, -1, seconds, busy_};
  if (crosses_.at(dim)) {
    ticket.flow = between_hosts_.add(now_, seconds);
    return ticket;
  }
  double& free = queue_free_[dim];
  free = std::max(free, now_) + seconds;
  ticket.done = free;
  return ticket;
}

void Timeline::wait(const std::string& dim, const Ticket& ticket) {
  const double taken = cpu_share_.at(dim) * std::min(ticket.alone, busy_ - ticket.busy_at_start);
  if (taken > 0) {
    now_ += taken;
    busy_ += taken;
    exposed_[dim] += taken;
  }
  const double done = ticket.flow >= 0 ? between_hosts_.end(ticket.flow) : ticket.done;
  if (done > now_) {
    exposed_[dim] += done - now_;
    now_ = done;
  }
}

void Timeline::sync(const std::string& dim, double seconds) {
  if (seconds > 0) wait(dim, start(dim, seconds));
}

void Timeline::run(const Piece& piece, bool again) {
  now_ += piece.s;
  busy_ += piece.s;
  (again ? recompute_ : compute_) += piece.s;
  gemm_ += piece.gemm_s;
}

}  // namespace ndt::train
