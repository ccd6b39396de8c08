#include "train/planner/plan_main.h"

#include <nlohmann/json.hpp>
#include <string>

#include "train/planner/calibrate.h"
#include "train/planner/cluster.h"
#include "train/planner/plan.h"
#include "train/planner/search.h"
#include "train/planner/time.h"

namespace ndt::train {
namespace {

// --plan.search: every layout of the world on the cluster, ranked by predicted step time
void print_search_of(const Config& c, std::ostream& out) {
  if (!has_cluster(c.cluster))
    throw ConfigError(
        "--plan.search needs a cluster: --cluster FILE (one --plan.calibrate wrote, or your own), or "
        "--cluster.preset h100-sxm-8 (and --cluster.hosts N); train_gpt --help lists the [cluster] keys");
  const Cluster k = resolve_cluster(c.cluster, c.train.device, c.train.dtype, c.train.tf32);
  const SearchResult s = search(c, k);
  c.plan_json ? print_search_json(s, k, c.plan_top, out) : print_search(s, k, c.plan_top, out);
}

// --plan with a cluster: the config's own layout, its memory, bytes and step time
void print_plan_on_cluster(const Config& c, std::ostream& out) {
  const Cluster k = resolve_cluster(c.cluster, c.train.device, c.train.dtype, c.train.tf32);
  if (c.plan_world > 0 && c.plan_world != k.devices())
    throw ConfigError("--plan.world " + std::to_string(c.plan_world) + " but the cluster has " +
                      std::to_string(k.devices()) + " devices (cluster.hosts x devices_per_host); drop one");
  const Plan p = plan(c, k.devices());
  const StepTime t = predict_time(c, p, k);
  if (c.plan_json) {
    nlohmann::json j = plan_to_json(p);
    j["cluster"] = cluster_to_json(k);
    j["time"] = time_to_json(t);
    out << j.dump(2) << "\n";
  } else {
    print_plan(p, out);
    print_time(p, t, k, out);
  }
}

}  // namespace

int plan_main(const Config& c, bool quiet, std::ostream& out, std::ostream& err) {
  if (!c.plan_calibrate.empty()) return calibrate_main(c, out, err);  // under mpirun, every rank
  if (quiet) return 0;  // before MPI: the launcher's rank 0 answers for all
  try {
    if (!c.cluster_path.empty() && !has_cluster(c.cluster))
      throw ConfigError("--cluster " + c.cluster_path +
                        " sets no [cluster] key: give cluster.preset or the cluster's numbers there "
                        "(train_gpt --help lists them), or write one with --plan.calibrate");
    if (c.plan_search) {
      print_search_of(c, out);
    } else if (has_cluster(c.cluster)) {
      print_plan_on_cluster(c, out);
    } else {
      const Plan p = plan(c, plan_world(c));
      c.plan_json ? print_plan_json(p, out) : print_plan(p, out);
    }
    return 0;
  } catch (const ConfigError& e) {
    err << "train_gpt: config error: " << e.what() << "\n";
    return 2;
  }
}

}  // namespace ndt::train
