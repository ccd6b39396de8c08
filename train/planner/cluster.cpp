// The presets and the resolution of a [cluster] section. Each preset number is a vendor
// figure (docs/planner.md lists the sources); what a run reaches of it is `efficiency` for
// the matrix products and 80% of the memory bandwidth for the element-wise ops, typical
// figures, not measurements: a calibrated cluster file replaces both with what was measured.
#include "train/planner/cluster.h"

#include <cstdio>
#include <sstream>

namespace ndt::train {
namespace {

struct Preset {
  const char* name;
  int64_t devices_per_host;
  double bf16_tflops, tf32_tflops, fp32_tflops;  // dense: without sparsity
  double memory_gbps, memory_gb;
  double intra_gbps, intra_latency_us, inter_gbps, inter_latency_us;  // per device, per direction
  double efficiency;
  double intra_cpu_share = 0, inter_cpu_share = 0;  // GPUs: 0, their copy engines move the bytes
  double bf16_memory_gbps = 0;  // element-wise on bf16 values; 0: memory_gbps (bound by memory)
  double attention_tflops = 0, score_pass_ns = 0;  // the CPU's fused attention core; 0: none
};

// cpu-sim: the simulated CPU cluster (scripts/cluster.sh: 2 hosts x 2 ranks of 1 thread on
// one 2-core machine, links between the hosts not limited) as --plan.calibrate measured it
// for config S in float32 and in bfloat16 (a Zen 5 with AVX512-BF16); its rates include the
// four ranks sharing two cores. With a rate limit on the links, set cluster.inter_gbps
// (100 Mbit/s: about 0.0029 per rank, measured).
constexpr Preset kPresets[] = {
    // name          D  BF16   TF32   FP32  HBM GB/s  GB   intra GB/s us  inter GB/s us  eff
    {"h100-sxm-8", 8, 989.4, 494.7, 66.9, 3350, 80, 450, 3, 50, 8,
     0.6},                                                             // NVLink 4, ConnectX-7 400 Gb/s each
    {"h200-8", 8, 989.4, 494.7, 66.9, 4800, 141, 450, 3, 50, 8, 0.6},  // H100's compute, HBM3e
    {"a100-sxm-8", 8, 312, 156, 19.5, 2039, 80, 300, 3, 25, 8, 0.6},   // NVLink 3, HDR 200 Gb/s each
    {"h100-pcie-8", 8, 756, 378, 51.2, 2000, 80, 32, 5, 25, 8, 0.6},   // no NVLink: PCIe 5 through the host
    // measured 2026-12-02 (bench/bench_planner.py --dtype float32 / bfloat16, config S);
    // memory_gbps already reached. The CPU shares: 2026-12-02 and -03, both dtypes, four
    // calibrations each day, ranged 0.19-0.66 inside a host and 0.06-1.0 between: the middle.
    // bf16's element-wise rate: 0.57 of f32's (a + b in bf16 against f32, 2026-12-03). The
    // fused attention core: 2026-12-06, --plan.calibrate on 2 ranks at once (one a core, as
    // sp2 and cp2 run; the rates before are 4 ranks' on the 2 cores), bench_sp_cp.sh's llama
    // (head size 16, and 64) at 2048 tokens: eight calibrations over half an hour gave
    // 0.027-0.098 TFLOP/s and 0.5-1.8 ns a pass (5-17 ns a score forward and backward, as
    // the machine's other load went), the median of each
    {"cpu-sim", 2, 0.171474, 0.1058, 0.1058, 12.307 / 0.8, 12.638, 2.67713, 21.0, 0.60063, 19.3, 1.0, 0.45,
     0.5, 0.57 * 12.307 / 0.8, 0.040, 1.5},
};

const Preset* find_preset(const std::string& name) {
  for (const Preset& p : kPresets)
    if (name == p.name) return &p;
  return nullptr;
}

std::string preset_list() {
  std::string s;
  for (const Preset& p : kPresets) s += std::string(s.empty() ? "" : ", ") + p.name;
  return s;
}

}  // namespace

double device_peak_tflops(const std::string& device_name, const std::string& dtype, bool tf32) {
  auto has = [&](const char* s) { return device_name.find(s) != std::string::npos; };
  const char* preset = has("H200")                                   ? "h200-8"  // GH200 too: H100's compute
                       : has("H100") && (has("PCIe") || has("PCIE")) ? "h100-pcie-8"
                       : has("H100")                                 ? "h100-sxm-8"
                       : has("A100")                                 ? "a100-sxm-8"
                                                                     : nullptr;
  const Preset* p = preset ? find_preset(preset) : nullptr;
  if (!p) return 0;
  return dtype == "bfloat16" ? p->bf16_tflops : tf32 ? p->tf32_tflops : p->fp32_tflops;
}

bool has_cluster(const ClusterSection& k) {
  // any number of the section given (a hand-written --cluster file need not have hosts)
  for (const double v : {double(k.hosts), double(k.devices_per_host), k.device_tflops, k.memory_gbps,
                         k.bf16_memory_gbps, k.device_memory_gb, k.intra_gbps, k.intra_latency_us,
                         k.inter_gbps, k.inter_latency_us, k.intra_cpu_share, k.inter_cpu_share, k.efficiency,
                         k.attention_tflops, k.score_pass_ns, k.expert_tflops})
    if (v > 0) return true;
  return !k.preset.empty();
}

Cluster resolve_cluster(const ClusterSection& k, const std::string& device, const std::string& dtype,
                        bool tf32) {
  Cluster c;
  const Preset* p = nullptr;
  if (!k.preset.empty()) {
    p = find_preset(k.preset);
    if (!p)
      throw ConfigError("cluster.preset = '" + k.preset + "' is not a preset; the presets are " +
                        preset_list() +
                        " (or leave it empty and give every [cluster] number, or --cluster FILE)");
  }
  c.name = p ? p->name : "custom";
  c.dtype = dtype;
  auto pick = [&](double given, double preset_value) { return given > 0 ? given : p ? preset_value : 0.0; };
  c.hosts = k.hosts > 0 ? k.hosts : 1;
  c.devices_per_host = k.devices_per_host > 0 ? k.devices_per_host : p ? p->devices_per_host : 0;
  const bool gpu = device.rfind("cuda", 0) == 0;
  // a GPU preset's rate for a CPU run, or the other way round, is a config mistake
  if (p && (std::string(p->name) == "cpu-sim") == gpu)
    throw ConfigError("cluster.preset = " + k.preset + " describes " + (gpu ? "CPU ranks" : "GPUs") +
                      " but train.device = " + device + "; pick a preset of that kind of device");
  const double preset_rate = !p                    ? 0
                             : dtype == "bfloat16" ? p->bf16_tflops
                             : gpu && tf32         ? p->tf32_tflops
                                                   : p->fp32_tflops;
  const double rate = pick(k.device_tflops, preset_rate);
  const double eff = pick(k.efficiency, p ? p->efficiency : 0);
  c.peak_flops = rate * 1e12;
  c.flops = rate * eff * 1e12;
  c.memory_bps = pick(k.memory_gbps, p ? 0.8 * p->memory_gbps : 0) * 1e9;
  c.bf16_memory_bps = pick(k.bf16_memory_gbps, p ? 0.8 * p->bf16_memory_gbps : 0) * 1e9;
  if (c.bf16_memory_bps <= 0) c.bf16_memory_bps = c.memory_bps;
  c.memory_bytes = pick(k.device_memory_gb, p ? p->memory_gb : 0) * 1e9;
  c.intra_bps = pick(k.intra_gbps, p ? p->intra_gbps : 0) * 1e9;
  c.intra_latency_s = pick(k.intra_latency_us, p ? p->intra_latency_us : 0) * 1e-6;
  c.inter_bps = pick(k.inter_gbps, p ? p->inter_gbps : 0) * 1e9;
  c.inter_latency_s = pick(k.inter_latency_us, p ? p->inter_latency_us : 0) * 1e-6;
  c.intra_cpu_share = pick(k.intra_cpu_share, p ? p->intra_cpu_share : 0);
  c.inter_cpu_share = pick(k.inter_cpu_share, p ? p->inter_cpu_share : 0);
  c.attention_flops = pick(k.attention_tflops, p ? p->attention_tflops : 0) * 1e12;
  c.score_pass_s = pick(k.score_pass_ns, p ? p->score_pass_ns : 0) * 1e-9;
  c.expert_flops = k.expert_tflops * 1e12;  // no preset has one
  std::string missing;
  auto need = [&](bool ok, const char* key) {
    if (!ok) missing += std::string(missing.empty() ? "" : ", ") + key;
  };
  need(c.devices_per_host > 0, "cluster.devices_per_host");
  need(rate > 0, "cluster.device_tflops");
  need(eff > 0, "cluster.efficiency");
  need(c.memory_bps > 0, "cluster.memory_gbps");
  need(c.memory_bytes > 0, "cluster.device_memory_gb");
  need(c.devices_per_host == 1 || c.intra_bps > 0, "cluster.intra_gbps");
  need(c.hosts == 1 || c.inter_bps > 0, "cluster.inter_gbps");
  if (!missing.empty())
    throw ConfigError("the [cluster] section lacks " + missing +
                      ": give them, or start from a preset (cluster.preset = " + preset_list() +
                      "), or measure this machine with --plan.calibrate FILE");
  return c;
}

std::string cluster_ini(const Cluster& c, const std::string& comment) {
  std::ostringstream o;
  char line[160];
  std::istringstream lines(comment);
  for (std::string l; std::getline(lines, l);) o << "# " << l << "\n";
  o << "[cluster]\n";
  auto num = [&](const char* key, double v, const char* unit) {
    std::snprintf(line, sizeof(line), "%-17s = %.6g   # %s\n", key, v, unit);
    o << line;
  };
  o << "hosts             = " << c.hosts << "\n";
  o << "devices_per_host  = " << c.devices_per_host << "\n";
  if (!c.dtype.empty()) o << "dtype             = " << c.dtype << "   # train.dtype of the measurement\n";
  num("device_tflops", c.flops / 1e12, "TFLOP/s the matrix products reached (measured)");
  num("efficiency", 1, "the rate above is what was reached");
  num("memory_gbps", c.memory_bps / 1e9, "GB/s the element-wise ops reached");
  if (c.dtype == "bfloat16")
    num("bf16_memory_gbps", c.bf16_memory_bps / 1e9, "the same on bfloat16 values (their 2 bytes each)");
  num("device_memory_gb", c.memory_bytes / 1e9, "GB per rank (the host's memory / its ranks)");
  if (c.devices_per_host > 1) {
    num("intra_gbps", c.intra_bps / 1e9, "GB/s per rank and direction inside a host");
    num("intra_latency_us", c.intra_latency_s * 1e6, "us");
    num("intra_cpu_share", c.intra_cpu_share,
        "of a transfer's time, what it takes from the computation under it");
  }
  if (c.hosts > 1) {
    num("inter_gbps", c.inter_bps / 1e9,
        "GB/s per rank and direction between hosts (a host's links / its ranks)");
    num("inter_latency_us", c.inter_latency_s * 1e6, "us");
    num("inter_cpu_share", c.inter_cpu_share, "the same between hosts");
  }
  if (c.attention_flops > 0) {
    num("attention_tflops", c.attention_flops / 1e12, "TFLOP/s the fused attention core's products reached");
    num("score_pass_ns", c.score_pass_s * 1e9, "ns of one pass of its softmax over one score");
  }
  if (c.expert_flops > 0)
    num("expert_tflops", c.expert_flops / 1e12, "TFLOP/s the MoE MLP's grouped GEMMs reached in it");
  return o.str();
}

}  // namespace ndt::train
