#include "support/cluster.h"

#include <unistd.h>

#include "support/launch.h"
#include "tensor/error.h"

namespace ndt::testing {

Cluster::Cluster(int hosts, int tcp_retries2)
    : hosts_(hosts), name_("n" + std::to_string(::getpid() % 100000)) {
  run_shell(std::string(NDT_CLUSTER_SCRIPT) + " sweep");  // clusters of tests that were killed
  run_shell(script("down"));                              // a stale one of this pid's name
  const ShellResult r = run_shell("NDT_CLUSTER_TCP_RETRIES=" + std::to_string(tcp_retries2) + " " +
                                  script("up " + std::to_string(hosts)));
  ok_ = r.rc == 0;
  if (!ok_)
    why_not_ = "cannot make a cluster of network namespaces here (root and ip netns needed): " + r.out;
}

Cluster::~Cluster() { run_shell(script("down")); }

std::string Cluster::script(const std::string& args) const {
  return "NDT_CLUSTER=" + name_ + " NDT_CLUSTER_OWNER=" + std::to_string(::getpid()) + " " +
         NDT_CLUSTER_SCRIPT + " " + args;
}

std::string Cluster::mpirun(int np, int on_hosts) const {
  const int n = on_hosts > 0 ? on_hosts : hosts_;
  NDT_CHECK(n <= hosts_ && np % n == 0, "Cluster::mpirun: ", np, " ranks do not divide among ", n, " of ",
            hosts_, " hosts");
  return script("mpirun -np " + std::to_string(np) + " --map-by ppr:" + std::to_string(np / n) + ":node ");
}

void Cluster::rate(int h, const std::string& r) const {
  const ShellResult s = run_shell(script("rate h" + std::to_string(h) + " " + r));
  NDT_CHECK(s.rc == 0, "cluster.sh rate: ", s.out);
}
void Cluster::cut(int h) const {
  const ShellResult s = run_shell(script("cut h" + std::to_string(h)));
  NDT_CHECK(s.rc == 0, "cluster.sh cut: ", s.out);
}
void Cluster::heal(int h) const {
  const ShellResult s = run_shell(script("heal h" + std::to_string(h)));
  NDT_CHECK(s.rc == 0, "cluster.sh heal: ", s.out);
}

}  // namespace ndt::testing
