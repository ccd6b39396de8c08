#include "train/io/safetensors.h"

#include "tokenizer/json_checked.h"
#include "train/io/files.h"

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

// What is wrong with an entry (its dtype, its shape, its bytes within a data section of
// data_bytes), or "".
std::string entry_error(const SafeTensorsReader::Entry& e, uint64_t data_bytes) {
  const size_t es = st_dtype_size(e.dtype);
  if (es == 0) return "has unknown dtype " + e.dtype;
  int64_t bytes = static_cast<int64_t>(es);
  for (int64_t d : e.shape)
    if (d < 0 || __builtin_mul_overflow(bytes, d, &bytes))
      return "has a negative or impossibly large shape " + shape_str(e.shape);
  if (e.end < e.begin || e.end > data_bytes || e.end - e.begin != static_cast<uint64_t>(bytes))
    return "has data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
           ") that do not match its shape " + shape_str(e.shape) + " and dtype " + e.dtype +
           " within the file; truncated or corrupt";
  return "";
}

// The first two tensors that share bytes, or "".
std::string overlap_error(const std::map<std::string, SafeTensorsReader::Entry>& entries) {
  std::vector<std::pair<uint64_t, std::string>> spans;
  for (auto& [name, e] : entries)
    if (e.end > e.begin) spans.push_back({e.begin, name});
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i)
    if (entries.at(spans[i - 1].second).end > spans[i].first)
      return "tensors '" + spans[i - 1].second + "' and '" + spans[i].second + "' overlap in the file";
  return "";
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
    h = parse_json_checked(std::string_view(base + 8, n), "the header", &duplicate);
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
      if (const std::string why = entry_error(e, data_bytes); !why.empty())
        fail("entry '" + name + "' " + why);
      entries_[name] = e;
    }
  } catch (const nlohmann::json::exception& e) {
    fail(std::string("malformed header (") + e.what() + ")");
  }
  // Tensors must not share bytes (a crafted file could alias two parameters).
  if (const std::string why = overlap_error(entries_); !why.empty()) fail(why);
}

SafeTensorsReader::~SafeTensorsReader() {
  if (map_) ::munmap(map_, bytes_);
}

Tensor SafeTensorsReader::get(const std::string& name, DType dtype) const {
  auto it = entries_.find(name);
  NDT_CHECK(it != entries_.end(), "safetensors file ", path_, ": no tensor '", name, "'");
  const int64_t n = numel_of(it->second.shape);
  return get_range(name, 0, n, dtype).view(it->second.shape);
}

Tensor SafeTensorsReader::get_range(const std::string& name, int64_t begin, int64_t n, DType dtype) const {
  auto it = entries_.find(name);
  NDT_CHECK(it != entries_.end(), "safetensors file ", path_, ": no tensor '", name, "'");
  const Entry& e = it->second;
  NDT_CHECK(begin >= 0 && n >= 0 && begin + n <= numel_of(e.shape), "safetensors file ", path_,
            ": elements [", begin, ", ", begin + n, ") of '", name, "' ", shape_str(e.shape),
            " do not exist");
  DType stored;
  if (e.dtype == "F32")
    stored = DType::f32;
  else if (e.dtype == "BF16")
    stored = DType::bf16;
  else if (e.dtype == "F64")
    stored = DType::f64;
  else if (e.dtype == "I32")
    stored = DType::i32;
  else if (e.dtype == "U16")
    stored = DType::u16;
  else if (e.dtype == "F16") {
    Tensor t = Tensor::empty({n}, DType::f32);
    float* p = t.data<float>();
    const char* src = data_ + e.begin + 2 * begin;
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
  Tensor raw = Tensor::empty({n}, stored);
  const char* src = data_ + e.begin + begin * static_cast<int64_t>(dtype_size(stored));
  if (n) std::memcpy(raw.data_ptr(), src, raw.nbytes());
  release(src, raw.nbytes());
  return raw.to(dtype);
}

void SafeTensorsReader::read_range(const std::string& name, int64_t begin, const Tensor& dst) const {
  NDT_CHECK(dst.is_contiguous() && dst.device().is_cpu(), "read_range: dst must be a contiguous CPU tensor");
  auto it = entries_.find(name);
  NDT_CHECK(it != entries_.end(), "safetensors file ", path_, ": no tensor '", name, "'");
  const Entry& e = it->second;
  const int64_t n = dst.numel();
  const bool same = (e.dtype == "F32" && dst.dtype() == DType::f32) ||
                    (e.dtype == "F64" && dst.dtype() == DType::f64) ||
                    (e.dtype == "BF16" && dst.dtype() == DType::bf16);
  if (!same) {
    dst.copy_(get_range(name, begin, n, dst.dtype()));
    return;
  }
  NDT_CHECK(begin >= 0 && begin + n <= numel_of(e.shape), "safetensors file ", path_, ": elements [", begin,
            ", ", begin + n, ") of '", name, "' ", shape_str(e.shape), " do not exist");
  const char* src = data_ + e.begin + begin * static_cast<int64_t>(dtype_size(dst.dtype()));
  if (n == 0) return;
  std::memcpy(dst.data_ptr(), src, dst.nbytes());
  release(src, dst.nbytes());
}

void SafeTensorsReader::release(const char* p, size_t n) const {
  // A mapped page that was read stays in this process's resident set until unmapped, and
  // the kernel maps some pages around each one it faults in: drop them all, so that reading
  // a file piece by piece never holds more than a piece of it.
  constexpr uintptr_t kAround = 1 << 20;
  static const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t base = reinterpret_cast<uintptr_t>(map_), end = base + bytes_;
  const uintptr_t a = reinterpret_cast<uintptr_t>(p), b = a + n;
  const uintptr_t lo = std::max(base, a > kAround ? a - kAround : 0) / page * page;
  const uintptr_t hi = std::min(end, b + kAround);
  if (hi > lo) ::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_DONTNEED);
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
