// A simulated cluster for one test (scripts/cluster.sh): N hosts as network namespaces on
// this machine, each with its own host name, TCP between them through a bridge, Open MPI
// launching the remote ranks through an rsh agent. Made by the constructor, and removed
// with every process started in it by the destructor (and, should the test be killed
// first, by the next test's sweep).
//
//   ndt::testing::Cluster c(2);
//   if (!c.ok()) GTEST_SKIP() << c.why_not();
//   run_shell(c.mpirun(4) + NDT_TRAIN_GPT_BIN + " --config gpt.ini");  // 2 ranks on each host
//   c.rate(1, "100mbit");  // host 1's link, both directions
#pragma once

#include <string>

namespace ndt::testing {

class Cluster {
 public:
  // tcp_retries2: how many times the hosts' TCP retransmits before it gives up on a peer (3:
  // about 3 s; Linux's default 15: about 15 minutes, as on nodes nobody tuned)
  explicit Cluster(int hosts, int tcp_retries2 = 3);
  ~Cluster();
  Cluster(const Cluster&) = delete;
  Cluster& operator=(const Cluster&) = delete;

  bool ok() const { return ok_; }
  const std::string& why_not() const { return why_not_; }  // why it could not be made here
  int hosts() const { return hosts_; }
  // mpirun inside host 0 for np ranks, np / on_hosts on each of the first on_hosts hosts
  // (ranks 0.. on host 0, ...); on_hosts 0: all of them.
  std::string mpirun(int np, int on_hosts = 0) const;
  // A rate limit on host h's link ("100mbit", "1gbit"; "none" lifts it), and cutting or
  // healing the link; each throws when the script fails.
  void rate(int h, const std::string& r) const;
  void cut(int h) const;
  void heal(int h) const;

 private:
  std::string script(const std::string& args) const;  // "NDT_CLUSTER=... cluster.sh args"
  int hosts_;
  std::string name_;
  bool ok_ = false;
  std::string why_not_;
};

}  // namespace ndt::testing
