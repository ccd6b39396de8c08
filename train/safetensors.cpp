#include "train/safetensors.h"

#include "train/files.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

namespace ndt::io {
namespace {

size_t st_dtype_size(const std::string& d) {
  if (d == "F32" || d == "I32" || d == "U32") return 4;
  if (d == "F16" || d == "BF16" || d == "I16" || d == "U16") return 2;
  if (d == "F64" || d == "I64" || d == "U64") return 8;
  if (d == "U8" || d == "I8" || d == "BOOL") return 1;
  return 0;
}

const char* st_name(DType t) {
  switch (t) {
    case DType::f32:
      return "F32";
    case DType::bf16:
      return "BF16";
    case DType::f64:
      return "F64";
    case DType::i32:
      return "I32";
    case DType::u16:
      return "U16";
  }
  return "?";
}

// IEEE half -> float, exact.
float half_to_float(uint16_t h) {
  const uint32_t sign = (h >> 15) & 1, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  float v;
  if (exp == 0)
    v = std::ldexp(static_cast<float>(mant), -24);
  else if (exp == 31)
    v = mant ? NAN : INFINITY;
  else
    v = std::ldexp(static_cast<float>(mant | 0x400), static_cast<int>(exp) - 25);
  return sign ? -v : v;
}

}  // namespace

SafeTensorsReader::SafeTensorsReader(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);  // a FIFO must not block us
  NDT_CHECK(fd >= 0, "safetensors file ", path, ": cannot open (", std::strerror(errno), ")");
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    NDT_FAIL("safetensors file ", path, ": not a regular file");
  }
  bytes_ = static_cast<size_t>(st.st_size);
  if (bytes_ < 8) {
    ::close(fd);
    NDT_FAIL("safetensors file ", path, ": only ", bytes_, " bytes; not a safetensors file");
  }
  map_ = ::mmap(nullptr, bytes_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  NDT_CHECK(map_ != MAP_FAILED, "safetensors file ", path, ": mmap failed (", std::strerror(errno), ")");
  auto fail = [&](const std::string& why) {
    ::munmap(map_, bytes_);
    map_ = nullptr;
    NDT_FAIL("safetensors file ", path, ": ", why);
  };
  uint64_t n = 0;
  std::memcpy(&n, map_, 8);
  if (n > bytes_ - 8)
    fail("header length " + std::to_string(n) + " exceeds the file size; truncated or not safetensors");
  const char* base = static_cast<const char*>(map_);
  nlohmann::json h;
  std::string duplicate;
  try {
    // A name given twice in the header would silently keep one of them: refuse it.
    std::vector<std::set<std::string>> seen;
    auto cb = [&](int depth, nlohmann::json::parse_event_t ev, nlohmann::json& parsed) {
      using E = nlohmann::json::parse_event_t;
      if (ev == E::object_start) {  // depth: of the new object's parent; its keys come at depth + 1
        seen.resize(static_cast<size_t>(depth));
        seen.emplace_back();
      } else if (ev == E::key && depth >= 1 && static_cast<size_t>(depth) <= seen.size()) {
        if (!seen[depth - 1].insert(parsed.get<std::string>()).second && duplicate.empty())
          duplicate = parsed.get<std::string>();
      } else if (ev == E::object_end) {
        seen.resize(static_cast<size_t>(depth));
      }
      return true;
    };
    h = nlohmann::json::parse(base + 8, base + 8 + n, cb);
  } catch (const std::exception& e) {
    fail(std::string("header is not valid JSON (") + e.what() + ")");
  }
  if (!h.is_object()) fail("header is not a JSON object");
  if (!duplicate.empty()) fail("the header names '" + duplicate + "' twice");
  data_ = base + 8 + n;
  const uint64_t data_bytes = bytes_ - 8 - n;
  try {
    for (auto& [name, v] : h.items()) {
      if (name == "__metadata__") {
        if (v.is_object())
          for (auto& [k, s] : v.items())
            if (s.is_string()) metadata_[k] = s.get<std::string>();
        continue;
      }
      if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets"))
        fail("entry '" + name + "' lacks dtype, shape or data_offsets");
      Entry e;
      e.dtype = v["dtype"].get<std::string>();
      for (auto& d : v["shape"]) e.shape.push_back(d.get<int64_t>());
      e.begin = v["data_offsets"][0].get<uint64_t>();
      e.end = v["data_offsets"][1].get<uint64_t>();
      const size_t es = st_dtype_size(e.dtype);
      if (es == 0) fail("entry '" + name + "' has unknown dtype " + e.dtype);
      int64_t bytes = static_cast<int64_t>(es);
      for (int64_t d : e.shape)
        if (d < 0 || __builtin_mul_overflow(bytes, d, &bytes))
          fail("entry '" + name + "' has a negative or impossibly large shape " + shape_str(e.shape));
      if (e.end < e.begin || e.end > data_bytes || e.end - e.begin != static_cast<uint64_t>(bytes))
        fail("entry '" + name + "' has data_offsets [" + std::to_string(e.begin) + ", " +
             std::to_string(e.end) + ") that do not match its shape " + shape_str(e.shape) + " and dtype " +
             e.dtype + " within the file; truncated or corrupt");
      entries_[name] = e;
    }
  } catch (const nlohmann::json::exception& e) {
    fail(std::string("malformed header (") + e.what() + ")");
  }
  // Tensors must not share bytes (a crafted file could alias two parameters).
  std::vector<std::pair<uint64_t, std::string>> spans;
  for (auto& [name, e] : entries_)
    if (e.end > e.begin) spans.push_back({e.begin, name});
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i)
    if (entries_[spans[i - 1].second].end > spans[i].first)
      fail("tensors '" + spans[i - 1].second + "' and '" + spans[i].second + "' overlap in the file");
}

SafeTensorsReader::~SafeTensorsReader() {
  if (map_) ::munmap(map_, bytes_);
}

Tensor SafeTensorsReader::get(const std::string& name, DType dtype) const {
  auto it = entries_.find(name);
  NDT_CHECK(it != entries_.end(), "safetensors file ", path_, ": no tensor '", name, "'");
  const Entry& e = it->second;
  const char* src = data_ + e.begin;
  const int64_t n = numel_of(e.shape);
  Tensor raw;
  if (e.dtype == "F32")
    raw = Tensor::empty(e.shape, DType::f32);
  else if (e.dtype == "BF16")
    raw = Tensor::empty(e.shape, DType::bf16);
  else if (e.dtype == "F64")
    raw = Tensor::empty(e.shape, DType::f64);
  else if (e.dtype == "I32")
    raw = Tensor::empty(e.shape, DType::i32);
  else if (e.dtype == "U16")
    raw = Tensor::empty(e.shape, DType::u16);
  else if (e.dtype == "F16") {
    Tensor t = Tensor::empty(e.shape, DType::f32);
    float* p = t.data<float>();
    for (int64_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, src + 2 * i, 2);
      p[i] = half_to_float(h);
    }
    return t.to(dtype);
  } else {
    NDT_FAIL("safetensors file ", path_, ": tensor '", name, "' has dtype ", e.dtype,
             ", which ndtrain cannot read (F32, BF16, F16, F64, I32, U16)");
  }
  if (n) std::memcpy(raw.data_ptr(), src, raw.nbytes());
  return raw.to(dtype);
}

void SafeTensorsWriter::add(const std::string& name, const Tensor& t) {
  NDT_CHECK(name != "__metadata__", "safetensors: reserved name");
  for (auto& [n, _] : tensors_) NDT_CHECK(n != name, "safetensors: tensor '", name, "' added twice");
  tensors_.emplace_back(name, t.to(Device::cpu()).contiguous());
}

void SafeTensorsWriter::write(const std::string& path) const {
  nlohmann::json h = nlohmann::json::object();
  uint64_t off = 0;
  for (auto& [name, t] : tensors_) {
    h[name] = {
        {"dtype", st_name(t.dtype())}, {"shape", t.shape()}, {"data_offsets", {off, off + t.nbytes()}}};
    off += t.nbytes();
  }
  if (!metadata.empty()) h["__metadata__"] = metadata;
  std::string header = h.dump();
  while ((8 + header.size()) % 8) header += ' ';  // data section 8-byte aligned
  const uint64_t n = header.size();
  // the tensors are written from their own memory, never copied into one big buffer
  std::vector<std::string_view> pieces = {{reinterpret_cast<const char*>(&n), 8}, header};
  for (auto& [name, t] : tensors_) pieces.emplace_back(static_cast<const char*>(t.data_ptr()), t.nbytes());
  write_file_atomic(path, pieces);
}

}  // namespace ndt::io
