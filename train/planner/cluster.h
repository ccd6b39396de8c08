// ndtrain: the machines a plan runs on: hosts of devices, each device's matrix-product rate
// and memory, and two classes of link (between the devices of a host; between hosts).
//
//   [cluster]
//   preset = h100-sxm-8     # one node of 8 H100 SXM (NVLink, 8 x 400 Gb/s InfiniBand)
//   hosts = 16              # ... sixteen of them
//
//   train_gpt --config gpt.ini --plan --cluster calibrated.ini   # a file with only [cluster]
//
// A preset fills every number the config leaves at 0; docs/planner.md gives each preset
// number's public source. `--plan.calibrate FILE` measures the machine it runs on and
// writes such a file (train/planner/calibrate.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "train/config.h"

namespace ndt::train {

struct Cluster {
  std::string name;  // the preset, "calibrated", or "custom"
  int64_t hosts = 0, devices_per_host = 0;
  std::string dtype;      // the training dtype the rates are for (empty: not said)
  double flops = 0;       // FLOP/s one device's matrix products reach (rate x efficiency)
  double peak_flops = 0;  // the dense peak, for MFU
  double memory_bps = 0;  // bytes/s, the element-wise ops
  // bytes/s of the element-wise ops on bf16 values (2 bytes each): memory_bps where they are
  // bound by memory (GPUs); on a CPU, which computes each value in f32, about half of it
  double bf16_memory_bps = 0;
  double memory_bytes = 0;  // of one device
  double intra_bps = 0, intra_latency_s = 0;
  double inter_bps = 0, inter_latency_s = 0;
  // Of a transfer's time, the share it costs the computation it runs under (CPU ranks,
  // whose cores copy the bytes and poll the transfers on; 0 for devices with copy engines)
  double intra_cpu_share = 0, inter_cpu_share = 0;
  // The CPU's fused attention core (tensor/cpu/self_attention.cpp), whose products are thin
  // (a head's hd columns) and whose softmax takes exponentials of every score: the FLOP/s
  // its products reach (attention_flops; 4 S hd forward, 10 S hd backward for S scores) and
  // the seconds of one pass over one score (score_pass_s; 2 passes forward, 3 backward). 0:
  // the products at `flops` and each pass 4 bytes at memory_bps (GPUs; a cluster not measured)
  double attention_flops = 0, score_pass_s = 0;
  // A mixture of experts' grouped GEMMs (the routed rows' gate, up and down): the FLOP/s they
  // reach in the MoE MLP as it runs them (--plan.calibrate times the MLP whole); 0: at `flops`
  double expert_flops = 0;

  int64_t devices() const { return hosts * devices_per_host; }
  int64_t host_of(int64_t rank) const { return rank / devices_per_host; }  // mpirun --map-by ppr:D:node
};

// The dense peak TFLOP/s of one GPU for the training dtype (bfloat16, or float32 with or
// without TF32 tensor cores), found by the name the CUDA driver gives the device ("NVIDIA
// H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", ...) among the presets' devices; 0 when it is
// none of them. For MFU, when log.peak_tflops is not set.
double device_peak_tflops(const std::string& device_name, const std::string& dtype, bool tf32);
// True when the config names a cluster: a preset, or any [cluster] number.
bool has_cluster(const ClusterSection& k);
// The cluster of the config: the preset's numbers where the section has 0, checked for
// what the time model needs (each missing number named with its key). `dtype` (train.dtype)
// picks the preset's rate: bfloat16's, or float32's, on TF32 tensor cores when tf32 is set
// on a GPU.
Cluster resolve_cluster(const ClusterSection& k, const std::string& device, const std::string& dtype,
                        bool tf32);
// The [cluster] section that describes c, as an INI file (what --plan.calibrate writes).
std::string cluster_ini(const Cluster& c, const std::string& comment);

}  // namespace ndt::train
