#include "train/agree.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "train/data/data.h"
#include "train/guard.h"
#include "train/io/files.h"

namespace fs = std::filesystem;

namespace ndt::train {
namespace {

// Rank `root`'s `text` on every rank (collective).
std::string broadcast_text(const std::string& text, dist::Communicator& world, int root = 0) {
  const int64_t n = static_cast<int64_t>(world.all_reduce_scalar(
      world.rank() == root ? static_cast<double>(text.size()) : 0.0, dist::ReduceOp::kMax));
  Tensor buf = Tensor::zeros({std::max<int64_t>(n, 1)}, DType::i32);
  if (world.rank() == root)
    for (int64_t i = 0; i < n; ++i)
      static_cast<int32_t*>(buf.data_ptr())[i] = static_cast<unsigned char>(text[i]);
  Tensor dev = buf.to(world.device());
  world.broadcast(dev, root)->wait();
  buf = dev.to(Device::cpu());
  std::string out(static_cast<size_t>(n), '\0');
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<char>(static_cast<const int32_t*>(buf.data_ptr())[i]);
  return out;
}

// Every rank's `flags` (k values each): rank r's at [r * k, (r + 1) * k) (collective).
std::vector<double> gather_flags(const std::vector<double>& flags, dist::Communicator& world) {
  const int64_t k = static_cast<int64_t>(flags.size());
  Tensor mine = Tensor::from_vector(flags, {k}).to(world.device());
  Tensor all = Tensor::zeros({k * world.size()}, DType::f64, world.device());
  world.all_gather(all, mine)->wait();
  return all.to(Device::cpu()).to_vector<double>();
}

std::string host_name() {
  char h[256] = {};
  ::gethostname(h, sizeof(h) - 1);
  return h;
}

// "rank 3" or "ranks 1, 2, 5" (at most 8 named, then a count).
std::string ranks_text(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size() && i < 8; ++i) {
    if (i) s += ", ";
    s += std::to_string(ranks[i]);
  }
  if (ranks.size() > 8) s += " and " + std::to_string(ranks.size() - 8) + " more";
  return s;
}

std::string shortened(const std::string& v) { return v.size() <= 80 ? v : v.substr(0, 77) + "..."; }

// "name:bytes name:bytes ..." of the files a data pattern matches here.
std::string data_files(const std::string& pattern) {
  if (pattern.empty()) return "";
  try {
    std::string s;
    for (const std::string& p : data::glob_paths(pattern)) {
      std::error_code ec;
      const auto bytes = fs::file_size(p, ec);
      if (!s.empty()) s += ' ';
      s += fs::path(p).filename().string() + ":" + (ec ? std::string("?") : std::to_string(bytes));
    }
    return s;
  } catch (const std::exception&) {
    return "(no file matches here)";
  }
}

}  // namespace

void agree_on_start(const std::string& error, dist::Communicator& world) {
  if (world.size() == 1) {
    if (!error.empty()) throw AgreedConfigError(error);
    return;
  }
  const std::vector<double> failed = gather_flags({error.empty() ? 0.0 : 1.0}, world);
  // each failing rank's error and host, in turn, on every rank; equal errors said once
  std::vector<std::pair<std::string, std::vector<int>>> errors;
  std::map<int, std::string> hosts;
  for (int r = 0; r < world.size(); ++r) {
    if (failed[static_cast<size_t>(r)] == 0) continue;
    const std::string text = broadcast_text(world.rank() == r ? error : "", world, r);
    hosts[r] = broadcast_text(world.rank() == r ? host_name() : "", world, r);
    auto it = std::find_if(errors.begin(), errors.end(), [&](const auto& e) { return e.first == text; });
    if (it == errors.end()) it = errors.insert(errors.end(), {text, {}});
    it->second.push_back(r);
  }
  if (errors.empty()) return;
  if (errors.size() == 1 && errors[0].second.size() == static_cast<size_t>(world.size()))
    throw AgreedConfigError(errors[0].first);  // every rank's, the same: as one process says it
  std::string msg;
  for (const auto& [text, ranks] : errors) {
    std::string where;
    for (int r : ranks)
      if (where.find(hosts[r]) == std::string::npos) where += (where.empty() ? "" : ", ") + hosts[r];
    msg += (msg.empty() ? "" : "; ") + ranks_text(ranks) + " (on " + where + "): " + text;
  }
  throw AgreedConfigError(msg);
}

LocalWork agree_on_local_work(const std::function<void()>& local_fn, dist::Communicator& world) {
  LocalWork w;
  try {
    local_fn();
  } catch (const std::exception& e) {
    w.error = e.what();
    w.failed_here = true;
  }
  w.failed_anywhere = world.all_reduce_scalar(w.failed_here ? 1.0 : 0.0, dist::ReduceOp::kMax) > 0;
  return w;
}

std::string agree_on_job_id(dist::Communicator& world) {
  std::string id;
  if (world.rank() == 0) {
    const std::time_t now = std::time(nullptr);
    std::tm utc{};
    gmtime_r(&now, &utc);
    char stamp[32];
    std::strftime(stamp, sizeof(stamp), "%Y%m%dT%H%M%SZ", &utc);
    id = std::string(stamp) + "-" + host_name() + "-" + std::to_string(::getpid());
  }
  return world.size() == 1 ? id : broadcast_text(id, world);
}

std::vector<std::pair<std::string, std::string>> rank_identity(const Config& cfg) {
  std::vector<std::pair<std::string, std::string>> v = cfg.values;
  v.emplace_back("data.train files", data_files(cfg.data.train));
  v.emplace_back("data.val files", data_files(cfg.data.val));
  std::sort(v.begin(), v.end());
  return v;
}

void check_same_config(const Config& cfg, dist::Communicator& world) {
  if (world.size() == 1) return;
  const std::vector<std::pair<std::string, std::string>> mine = rank_identity(cfg);
  // rank 0's keys and values, as "key\x1fvalue\x1e" records, on every rank
  std::string text;
  for (const auto& [k, v] : mine) text += k + '\x1f' + v + '\x1e';
  const std::string theirs = broadcast_text(text, world);
  std::vector<std::pair<std::string, std::string>> zero;
  for (size_t at = 0; at < theirs.size();) {
    const size_t sep = theirs.find('\x1f', at), end = theirs.find('\x1e', at);
    zero.emplace_back(theirs.substr(at, sep - at), theirs.substr(sep + 1, end - sep - 1));
    at = end + 1;
  }
  // which of rank 0's keys differ here (the last flag: keys rank 0 does not have)
  std::map<std::string, std::string> here(mine.begin(), mine.end());
  std::vector<double> differs(zero.size() + 1, 0.0);
  for (size_t i = 0; i < zero.size(); ++i) {
    auto it = here.find(zero[i].first);
    differs[i] = it == here.end() || it->second != zero[i].second ? 1.0 : 0.0;
    if (it != here.end()) here.erase(it);
  }
  differs.back() = here.empty() ? 0.0 : 1.0;
  const std::vector<double> all = gather_flags(differs, world);
  const size_t k = differs.size();
  std::string msg;
  for (size_t i = 0; i < k; ++i) {
    std::vector<int> ranks;
    for (int r = 0; r < world.size(); ++r)
      if (all[static_cast<size_t>(r) * k + i] > 0) ranks.push_back(r);
    if (ranks.empty()) continue;
    if (!msg.empty()) msg += "; ";
    msg += i + 1 < k
               ? zero[i].first + " on " + ranks_text(ranks) + " (rank 0: '" + shortened(zero[i].second) + "')"
               : "keys rank 0 does not have on " + ranks_text(ranks) + " (another train_gpt build?)";
  }
  if (!msg.empty())
    throw AgreedConfigError(
        "the ranks were not started with the same config (a stale config file or other data "
        "on some node?): " +
        msg + "; every rank must read the same config file and data");
}

void check_checkpoint_dir_shared(const Config& cfg, bool writer, dist::Communicator& world) {
  const std::string& dir = cfg.checkpoint.dir;
  if (world.size() == 1 || dir.empty()) return;
  // rank 0 leaves a file only this run can have written; the others look for it
  const std::string token = std::to_string(::getpid()) + "-" +
                            std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()) +
                            "-" + host_name();
  const std::string marker_name = ".shared_probe";
  const fs::path marker = fs::path(dir) / marker_name;
  std::string error;
  if (world.rank() == 0) {
    try {
      io::write_file_atomic(marker.string(), token);  // checkpoint.dir exists: check_output_paths made it
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  const std::string expected = broadcast_text(token, world);
  const bool reader = cfg.checkpoint.format == "sharded" || cfg.checkpoint.resume || world.rank() == 0;
  bool sees = true, can_write = true;
  if (reader) {
    std::ifstream f(marker);
    std::stringstream got;
    got << f.rdbuf();
    sees = f.good() && got.str() == expected;
  }
  if (writer && sees && world.rank() != 0) {
    const fs::path probe =
        fs::path(dir) / (".write_probe_" + std::to_string(::getpid()) + "_" + std::to_string(world.rank()));
    try {
      io::write_file_atomic(probe.string(), "");
      fs::remove(probe);
    } catch (const std::exception&) {
      can_write = false;
    }
  }
  const std::vector<double> all = gather_flags({sees ? 1.0 : 0.0, can_write ? 1.0 : 0.0}, world);
  // every rank has read it (or failed to) once the gather is done
  if (world.rank() == 0) {
    std::error_code ec;
    fs::remove(marker, ec);
  }
  std::vector<int> blind, readonly;
  for (int r = 0; r < world.size(); ++r) {
    if (all[2 * static_cast<size_t>(r)] == 0)
      blind.push_back(r);
    else if (all[2 * static_cast<size_t>(r) + 1] == 0)
      readonly.push_back(r);
  }
  if (!error.empty())
    throw AgreedConfigError("checkpoint.dir " + dir + ": rank 0 cannot write there (" + error + ")");
  if (!blind.empty())
    throw AgreedConfigError(
        "checkpoint.dir " + dir + " is not the same directory on every rank: " + ranks_text(blind) +
        " do not see the file rank 0 wrote there (" +
        (cfg.checkpoint.format == "sharded" ? "every rank writes its own shards into it"
                                            : "every rank reads its part of a resumed checkpoint") +
        "); put it on a filesystem every node mounts at the same path (NFS, Lustre, ...)" +
        (cfg.checkpoint.format == "sharded" && !cfg.checkpoint.resume
             ? ", or use checkpoint.format = full (rank 0 writes alone)"
             : ""));
  if (!readonly.empty())
    throw AgreedConfigError("checkpoint.dir " + dir + ": " + ranks_text(readonly) +
                            " see it but cannot write there (permissions, or a read-only mount?)");
}

StepAgreement agree_at_step_end(bool data_failed, dist::Communicator& world) {
  std::vector<double> v = {static_cast<double>(stop_signal()), data_failed ? 1.0 : 0.0};
  if (world.size() > 1) {
    Tensor t = Tensor::from_vector(v, {2}).to(world.device());
    world.all_reduce(t, dist::ReduceOp::kMax)->wait();
    v = t.to(Device::cpu()).to_vector<double>();
  }
  return {static_cast<int>(v[0]), v[1] > 0};
}

}  // namespace ndt::train
