#include "tensor/storage.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cstdlib>
#include <map>
#include <mutex>
#include <vector>

#include "tensor/cuda/runtime.h"
#include "tensor/error.h"

namespace ndt {
namespace {

constexpr int kMaxCudaDevices = 16;

struct Counter {
  std::atomic<int64_t> in_use{0};
  std::atomic<int64_t> peak{0};

  void add(int64_t n) {
    int64_t now = in_use.fetch_add(n) + n;
    int64_t p = peak.load();
    while (now > p && !peak.compare_exchange_weak(p, now)) {
    }
  }
  void sub(int64_t n) { in_use.fetch_sub(n); }
};

// The allocators are process-wide like the devices they manage (one per device).
Counter& counter(Device d) {
  static Counter cpu;
  static std::array<Counter, kMaxCudaDevices> gpus;
  if (d.is_cpu()) return cpu;
  NDT_CHECK(d.index >= 0 && d.index < kMaxCudaDevices, "device ", d.str(), " out of range");
  return gpus[d.index];
}

// CPU blocks rounded up to 64 bytes; freed blocks wait in a free list per size class. Up to
// 64 KiB a class is one size; above, the sizes between two powers of two fall into 8 classes,
// each block allocated at its class's largest size (at most 1/8 more than asked for). So the
// buffers whose sizes follow the data (a mixture of experts' routed rows: a few thousand
// different sizes a run) reuse freed blocks: with one list per exact size each new size
// would be a fresh allocation, pages the kernel zeroes on first touch (half an expert-parallel
// step's time was those page faults).
size_t size_class(size_t nbytes) {
  constexpr size_t kExact = size_t(64) << 10;
  if (nbytes <= kExact) return nbytes;
  const size_t step = std::bit_floor(nbytes) / 8;
  return (nbytes + step - 1) / step * step;
}

class CpuCache {
 public:
  void* alloc(size_t asked) {
    const size_t nbytes = size_class(asked);
    {
      std::lock_guard<std::mutex> g(mu_);
      auto it = free_.find(nbytes);
      if (it != free_.end() && !it->second.empty()) {
        void* p = it->second.back();
        it->second.pop_back();
        cached_ -= nbytes;
        return p;
      }
    }
    void* p = std::aligned_alloc(64, nbytes);
    if (!p) {
      empty();
      p = std::aligned_alloc(64, nbytes);
    }
    NDT_CHECK(p != nullptr, "out of CPU memory allocating ", nbytes, " bytes");
    return p;
  }
  void free(void* p, size_t asked) {
    const size_t nbytes = size_class(asked);
    std::lock_guard<std::mutex> g(mu_);
    if (cached_ + nbytes > kMaxCached) {
      std::free(p);
      return;
    }
    free_[nbytes].push_back(p);
    cached_ += nbytes;
  }
  void empty() {
    std::lock_guard<std::mutex> g(mu_);
    for (auto& [n, v] : free_)
      for (void* p : v) std::free(p);
    free_.clear();
    cached_ = 0;
  }
  int64_t cached() {
    std::lock_guard<std::mutex> g(mu_);
    return cached_;
  }

 private:
  static constexpr int64_t kMaxCached = int64_t(8) << 30;
  std::mutex mu_;
  std::map<size_t, std::vector<void*>> free_;
  int64_t cached_ = 0;
};

CpuCache& cpu_cache() {
  static CpuCache* c = new CpuCache();  // never destroyed: storages may outlive statics
  return *c;
}

size_t round_up(size_t n) { return std::max<size_t>(64, (n + 63) / 64 * 64); }

}  // namespace

Storage::Storage(size_t nbytes, Device device) : Storage(nbytes, device, true) {}

Storage::Storage(size_t nbytes, Device device, bool allocate_now) : nbytes_(nbytes), device_(device) {
  if (allocate_now) allocate();
}

void Storage::allocate() {
  if (data_) return;
  const size_t n = round_up(nbytes_);
  data_ = device_.is_cpu() ? cpu_cache().alloc(n) : cuda::alloc(n, device_.index);
  counter(device_).add(static_cast<int64_t>(n));
}

void Storage::borrow(void* data) {
  NDT_CHECK(!data_, "Storage::borrow: the storage holds memory; release it first");
  NDT_CHECK(data, "Storage::borrow: no memory to borrow");
  data_ = data;
  borrowed_ = true;
}

void Storage::release() {
  if (!data_) return;
  if (borrowed_) {  // not ours: neither counted nor freed here
    data_ = nullptr;
    borrowed_ = false;
    return;
  }
  const size_t n = round_up(nbytes_);
  counter(device_).sub(static_cast<int64_t>(n));
  if (device_.is_cpu())
    cpu_cache().free(data_, n);
  else
    cuda::free(data_, device_.index);
  data_ = nullptr;
}

Storage::~Storage() {
  try {
    release();
  } catch (...) {
    // A destructor must not throw; a failing free during shutdown is not recoverable.
  }
}

MemoryStats memory_stats(Device d) {
  MemoryStats s;
  s.in_use = counter(d).in_use.load();
  s.peak = counter(d).peak.load();
  s.cached = d.is_cpu() ? cpu_cache().cached() : 0;
  return s;
}

void reset_peak_memory(Device d) { counter(d).peak.store(counter(d).in_use.load()); }

void empty_cache(Device d) {
  if (d.is_cpu())
    cpu_cache().empty();
  else
    cuda::trim_pool(d.index);
}

}  // namespace ndt
