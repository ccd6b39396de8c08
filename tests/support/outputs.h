// Reading what a run wrote, for the tests that compare runs: the losses of a metrics file,
// the largest relative difference between two safetensors files, every value of a model's
// flat buffers.
//
//   EXPECT_EQ(metric_losses(dir / "metrics.jsonl").size(), 5u);
//   EXPECT_LT(max_rel_diff(a / "model.safetensors", b / "model.safetensors"), 1e-5);
#pragma once

#include <filesystem>
#include <vector>

#include "nn/flat.h"
#include "tensor/tensor.h"

namespace ndt::testing {

// The "loss" of every line of a log.metrics file that has one, in order.
std::vector<double> metric_losses(const std::filesystem::path& metrics);
// The largest difference between the same tensors of two safetensors files, relative to each
// tensor's largest magnitude in `a` (a tensor missing in `b`, or of another size, fails the test).
double max_rel_diff(const std::filesystem::path& a, const std::filesystem::path& b);
// The largest difference between got and want, relative to want's largest magnitude.
double max_rel(const Tensor& got, const Tensor& want);
// Every value of every unit's buffer, in order (float32 buffers).
std::vector<float> all_values(const nn::FlatParams& p);

}  // namespace ndt::testing
