// ndtrain: reading and writing safetensors files (the Hugging Face format).
//
//   [u64 little-endian N][N bytes of JSON header][data]
//   header: {"name": {"dtype": "F32", "shape": [768, 2304], "data_offsets": [b, e]}, ...,
//            "__metadata__": {"key": "value", ...}}
//
//   SafeTensorsReader r("model.safetensors");          // memory-mapped, header validated
//   Tensor w = r.get("h.0.attn.c_attn.weight");         // F32, BF16 or F16 -> f32 on CPU
//   SafeTensorsWriter out;  out.add("w", w);  out.metadata["step"] = "10";
//   out.write("model.safetensors");                     // temporary file, then rename
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace ndt::io {

class SafeTensorsReader {
 public:
  explicit SafeTensorsReader(const std::string& path);  // throws ndt::Error naming the file
  ~SafeTensorsReader();
  SafeTensorsReader(const SafeTensorsReader&) = delete;
  SafeTensorsReader& operator=(const SafeTensorsReader&) = delete;

  struct Entry {
    std::string dtype;  // "F32", "BF16", "F16", "F64", "I32", ...
    Shape shape;
    uint64_t begin = 0, end = 0;  // byte range in the data section
  };
  const std::string& path() const { return path_; }
  const std::map<std::string, Entry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool has(const std::string& name) const { return entries_.count(name) > 0; }
  // A CPU copy converted to `dtype` (f32 by default; F16 and BF16 widen exactly).
  Tensor get(const std::string& name, DType dtype = DType::f32) const;
  // Elements [begin, begin + n) of the flattened tensor, as a 1-D CPU tensor of `dtype`:
  // only those bytes of the memory-mapped file are read (RAM-efficient loading).
  Tensor get_range(const std::string& name, int64_t begin, int64_t n, DType dtype = DType::f32) const;
  // The same into dst (a contiguous CPU tensor of n elements), without allocating when the
  // file stores dst's dtype.
  void read_range(const std::string& name, int64_t begin, const Tensor& dst) const;

 private:
  void release(const char* p, size_t n) const;  // drop the mapped pages around [p, p + n)
  std::string path_;
  void* map_ = nullptr;
  size_t bytes_ = 0;
  const char* data_ = nullptr;
  std::map<std::string, Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

class SafeTensorsWriter {
 public:
  // Tensors keep their dtype (f32 -> F32, bf16 -> BF16, f64 -> F64, i32 -> I32, u16 -> U16).
  void add(const std::string& name, const Tensor& t);
  void write(const std::string& path) const;  // atomic: path.tmp, fsync, rename
  std::map<std::string, std::string> metadata;

 private:
  std::vector<std::pair<std::string, Tensor>> tensors_;
};

}  // namespace ndt::io
