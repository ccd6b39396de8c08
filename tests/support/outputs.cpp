#include "support/outputs.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "train/io/safetensors.h"

namespace ndt::testing {

std::vector<double> metric_losses(const std::filesystem::path& metrics) {
  std::vector<double> l;
  std::ifstream f(metrics);
  std::string line;
  while (std::getline(f, line)) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("loss")) l.push_back(j["loss"].get<double>());
  }
  return l;
}

double max_rel_diff(const std::filesystem::path& a, const std::filesystem::path& b) {
  io::SafeTensorsReader ra(a.string()), rb(b.string());
  EXPECT_EQ(ra.entries().size(), rb.entries().size());
  double worst = 0;
  for (auto& [name, e] : ra.entries()) {
    if (!rb.has(name)) {
      ADD_FAILURE() << name << " missing in " << b;
      continue;
    }
    std::vector<float> x = ra.get(name).to_vector<float>(), y = rb.get(name).to_vector<float>();
    EXPECT_EQ(x.size(), y.size()) << name;
    double scale = 1e-30;
    for (float v : x) scale = std::max(scale, static_cast<double>(std::abs(v)));
    for (size_t i = 0; i < std::min(x.size(), y.size()); ++i)
      worst = std::max(worst, std::abs(static_cast<double>(x[i]) - y[i]) / scale);
  }
  return worst;
}

double max_rel(const Tensor& got, const Tensor& want) {
  const std::vector<double> a = got.to(DType::f64).contiguous().to_vector<double>(),
                            b = want.to(DType::f64).contiguous().to_vector<double>();
  double scale = 0, err = 0;
  for (size_t i = 0; i < b.size(); ++i) scale = std::max(scale, std::abs(b[i]));
  for (size_t i = 0; i < b.size(); ++i) err = std::max(err, std::abs(a[i] - b[i]));
  return err / std::max(scale, 1e-300);
}

std::vector<float> all_values(const nn::FlatParams& p) {
  std::vector<float> out;
  for (const nn::FlatUnit& u : p.units)
    for (float v : u.data.to_vector<float>()) out.push_back(v);
  return out;
}

}  // namespace ndt::testing
