#include "train/step_log.h"

#include <cstdio>
#include <fstream>

#include "train/io/format.h"

namespace ndt::train {

std::string step_line(const StepLog& s) {
  const double gflops = s.flops / s.sec / 1e9 / static_cast<double>(s.world_size);  // per rank
  char aux[48] = "", z[32] = "";
  if (s.aux_loss >= 0) std::snprintf(aux, sizeof(aux), " (load-balancing %.4f)", s.aux_loss);
  if (s.z_loss >= 0) std::snprintf(z, sizeof(z), " (router z %.4f)", s.z_loss);
  std::string comm = s.world_size > 1 ? " | comm " + io::format_bytes(static_cast<double>(s.comm_bytes)) : "";
  if (s.spans_hosts) comm += " (" + io::format_bytes(static_cast<double>(s.across_hosts)) + " across hosts)";
  char line[600];
  std::snprintf(
      line, sizeof(line),
      "step %5lld/%lld | loss %.4f%s%s | lr %.2e | norm %.3f | %.1f ms | %.0f tok/s | %s%s | mem %s "
      "(peak %s) | eta %s",
      (long long)s.step + 1, (long long)s.steps, s.loss, aux, z, s.lr, s.norm, s.sec * 1e3, s.tokens / s.sec,
      speed_text(gflops, s.peak_flops).c_str(), comm.c_str(),
      io::format_bytes(static_cast<double>(s.mem.in_use)).c_str(),
      io::format_bytes(static_cast<double>(s.mem.peak)).c_str(), io::format_duration(s.eta_sec).c_str());
  return line;
}

nlohmann::json step_json(const StepLog& s) {
  nlohmann::json j = {{"step", s.step + 1},
                      {"loss", s.loss},
                      {"lr", s.lr},
                      {"grad_norm", s.norm},
                      {"ms", s.sec * 1e3},
                      {"tokens_per_sec", s.tokens / s.sec},
                      {"gflops_per_sec", s.flops / s.sec / 1e9},
                      {"comm_bytes", s.comm_bytes},
                      {"comm_bytes_across_hosts", s.across_hosts},
                      {"mem_in_use", s.mem.in_use},
                      {"mem_peak", s.mem.peak}};
  if (s.aux_loss >= 0) j["aux_loss"] = s.aux_loss;
  if (s.z_loss >= 0) j["z_loss"] = s.z_loss;
  if (s.peak_flops > 0) j["mfu"] = s.flops / s.sec / static_cast<double>(s.world_size) / s.peak_flops;
  return j;
}

StepLog step_from_json(const nlohmann::json& j, int world_size, int64_t steps, bool spans_hosts) {
  StepLog s;
  s.step = j.at("step").get<int64_t>() - 1;
  s.steps = steps;
  s.loss = j.at("loss").get<double>();
  s.lr = j.at("lr").get<double>();
  s.norm = j.at("grad_norm").get<double>();
  if (j.contains("aux_loss")) s.aux_loss = j.at("aux_loss").get<double>();
  if (j.contains("z_loss")) s.z_loss = j.at("z_loss").get<double>();
  s.sec = j.at("ms").get<double>() / 1e3;
  s.tokens = j.at("tokens_per_sec").get<double>() * s.sec;
  s.flops = j.at("gflops_per_sec").get<double>() * 1e9 * s.sec;
  s.world_size = world_size;
  if (j.contains("mfu") && j.at("mfu").get<double>() > 0)
    s.peak_flops = s.flops / s.sec / static_cast<double>(world_size) / j.at("mfu").get<double>();
  s.comm_bytes = j.at("comm_bytes").get<int64_t>();
  s.across_hosts = j.at("comm_bytes_across_hosts").get<int64_t>();
  s.spans_hosts = spans_hosts;
  s.mem.in_use = j.at("mem_in_use").get<int64_t>();
  s.mem.peak = j.at("mem_peak").get<int64_t>();
  return s;
}

io::Scalars step_scalars(const StepLog& s) {
  io::Scalars v = {
      {"loss/train", s.loss},
      {"lr", s.lr},
      {"grad_norm", s.norm},
      {"throughput/tokens_per_sec", s.tokens / s.sec},
      {"throughput/gflops_per_sec_per_rank", s.flops / s.sec / 1e9 / static_cast<double>(s.world_size)},
      {"memory/in_use_bytes", static_cast<double>(s.mem.in_use)},
      {"memory/peak_bytes", static_cast<double>(s.mem.peak)},
      {"time/step_ms", s.sec * 1e3}};
  if (s.peak_flops > 0)
    v.push_back({"throughput/mfu", s.flops / s.sec / static_cast<double>(s.world_size) / s.peak_flops});
  if (s.aux_loss >= 0) v.push_back({"loss/load_balancing", s.aux_loss});
  if (s.z_loss >= 0) v.push_back({"loss/router_z", s.z_loss});
  if (s.world_size > 1) v.push_back({"comm/bytes_sent", static_cast<double>(s.comm_bytes)});
  if (s.spans_hosts) v.push_back({"comm/bytes_across_hosts", static_cast<double>(s.across_hosts)});
  return v;
}

std::string speed_text(double gflops_per_rank, double peak_flops) {
  if (peak_flops > 0)
    return "MFU " + std::to_string(static_cast<int>(100 * gflops_per_rank * 1e9 / peak_flops)) + "%";
  return std::to_string(static_cast<int>(gflops_per_rank)) + " GFLOP/s";
}

std::string mfu_peak_line(const std::string& gpu_name, double peak_flops, const std::string& dtype) {
  char peak[32];
  std::snprintf(peak, sizeof(peak), "%.1f", peak_flops / 1e12);
  if (peak_flops > 0)
    return "MFU against " + std::string(peak) + " TFLOP/s per " + gpu_name + " (" + dtype + ")";
  return "MFU: the peak TFLOP/s of a " + gpu_name +
         " is not known here; step lines show GFLOP/s per rank. Set " + "log.peak_tflops to its dense " +
         dtype + " TFLOP/s for MFU";
}

int64_t peak_resident_bytes() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;  // "VmHWM:  1234 kB"
  return 0;
}

}  // namespace ndt::train
