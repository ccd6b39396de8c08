// ndtrain: Module, a tree of named parameters that are described before they exist.
//
// Building a model only records each parameter's name, global shape, init rule and
// whether weight decay applies (a ParamSpec). Memory comes later, when nn/flat.h
// materializes the specs into flat buffers and points each module's Tensor at its view.
// This is docs/design.md decision 2: describe -> parallelize -> materialize.
//
//   struct Affine : nn::Module {
//     Tensor w, b;
//     Affine(int64_t c) {
//       param("weight", &w, {c}, nn::Init::ones(), /*decay=*/false);
//       param("bias", &b, {c}, nn::Init::zeros(), false);
//     }
//   };
//   Affine m(8);
//   auto specs = m.parameters();   // "weight", "bias"; m.w is still undefined
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "nn/tp_slice.h"
#include "tensor/tensor.h"

namespace ndt::nn {

struct Init {
  enum Kind { kNormal, kZeros, kOnes, kUniform } kind = kZeros;
  float std = 0.0f;   // kNormal: the standard deviation; kUniform: the bound b of U(-b, b)
  int64_t rows = -1;  // kNormal: only the first `rows` rows are drawn, the rest stay zero
                      // (vocab padding); -1: all
  static Init normal(float std, int64_t rows = -1) { return {kNormal, std, rows}; }
  static Init zeros() { return {kZeros, 0.0f, -1}; }
  static Init ones() { return {kOnes, 0.0f, -1}; }
  static Init uniform(float bound) { return {kUniform, bound, -1}; }
};

struct ParamSpec {
  std::string name;  // full dotted name, e.g. "h.0.attn.c_attn.weight"
  Shape shape;       // this rank's shape (the global shape unless tensor-parallel split)
  Init init;
  bool weight_decay = false;  // AdamW decays 2-D weights (matmuls, embeddings) only
  Tensor* slot = nullptr;     // the module field that receives the materialized view
  TpSlice tp;                 // set by tensor parallelism (dist/tensor_parallel)
  const Shape& global_shape() const { return tp.dim >= 0 ? tp.global : shape; }
};

class Module {
 public:
  Module() = default;
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // Every parameter below this module, in registration order, with full names.
  std::vector<ParamSpec> parameters(const std::string& prefix = "") const;

  // Tensor parallelism (before materialize): this rank keeps part `rank` of `parts` of
  // parameter `name` (of this module) along `dim`, in `groups` blocks (see TpSlice).
  void split_param(const std::string& name, int dim, int64_t parts, int64_t rank, int64_t groups = 1);
  // Expert parallelism: the same along dim 0, over the ep group (TpSlice::experts)
  void split_experts(const std::string& name, int64_t parts, int64_t rank);
  // Tensor parallelism: this module's own parameters stay whole on every rank, but each
  // rank's gradient of them is partial (TpSlice::partial_grad); name: that one only.
  void mark_partial_grads(const std::string& name = "");

 protected:
  void param(const std::string& name, Tensor* slot, Shape shape, Init init, bool weight_decay);
  void child(const std::string& name, Module* m);

 private:
  struct Entry {
    std::string name;
    Module* child = nullptr;  // either a child module ...
    ParamSpec spec;           // ... or a parameter
  };
  std::vector<Entry> entries_;
};

}  // namespace ndt::nn
