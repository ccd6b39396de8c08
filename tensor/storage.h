// ndtrain: reference-counted memory and the allocators behind it.
//
// A Storage is one allocation on one device; tensors are views into it (shared_ptr).
//   CPU : 64-byte aligned, with a small cache of freed blocks by size so a training step
//         reuses the previous step's memory instead of calling the OS again.
//   CUDA: cudaMallocAsync from the device's stream-ordered memory pool (tensor/cuda/).
// Each device counts the bytes its live storages hold and the peak since the last reset:
//
//   reset_peak_memory(Device::cpu());
//   ... run something ...
//   MemoryStats s = memory_stats(Device::cpu());   // s.in_use, s.peak (bytes)
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "tensor/dtype.h"

namespace ndt {

struct MemoryStats {
  int64_t in_use = 0;  // bytes held by live storages
  int64_t peak = 0;    // most bytes in use since the last reset_peak_memory
  int64_t cached = 0;  // bytes kept for reuse by the allocator (not in use)
};

MemoryStats memory_stats(Device d);
void reset_peak_memory(Device d);
void empty_cache(Device d);  // return cached blocks to the system

class Storage {
 public:
  Storage(size_t nbytes, Device device);  // uninitialized memory
  // With allocate = false the storage starts released (no memory until allocate()).
  Storage(size_t nbytes, Device device, bool allocate);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }

  // FSDP frees a gathered unit between its uses while every view of it (the parameters,
  // tensors saved for backward) keeps pointing at this Storage: release() gives the memory
  // back (counted as freed), allocate() takes it again, uninitialized. Both are no-ops when
  // already in that state.
  void release();
  void allocate();
  // FSDP over a group of one rank: the whole buffer is the rank's own shard, so instead of a
  // copy the storage borrows the shard's memory (nbytes of it at `data`, owned and counted
  // elsewhere) until release(), which then only lets go of it. Released storages only.
  void borrow(void* data);
  bool allocated() const { return data_ != nullptr; }
  bool borrowed() const { return borrowed_; }
  Device device() const { return device_; }

 private:
  void* data_ = nullptr;
  size_t nbytes_ = 0;
  bool borrowed_ = false;  // data_ is another storage's memory (borrow)
  Device device_;
};

}  // namespace ndt
