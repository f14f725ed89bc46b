// Device memory: a caching allocator (freed blocks are kept by size class and reused, so the step loop never
// calls cudaMalloc), a ledger of what each part of the engine took (weights, KV cache, workspaces, CUDA
// graphs) for the startup log, and pinned host staging buffers.
#pragma once

#include <cstddef>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "cuda/common.h"

namespace moeserve::cuda {

class CachingAllocator {
 public:
  CachingAllocator() = default;
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // Device memory of at least `bytes`, 256-byte aligned, charged to `part` ("weights", "kv cache", ...).
  // Throws UserError naming the part and the free memory when the GPU is out of memory.
  void* allocate(size_t bytes, const std::string& part);
  void free(void* p);
  // Returns cached blocks to the driver.
  void release_cached();

  size_t in_use() const { return in_use_; }
  size_t cached() const { return cached_; }
  std::map<std::string, size_t> by_part() const;

 private:
  static size_t round_size(size_t bytes);
  struct Block {
    size_t size;
    std::string part;
  };
  mutable std::mutex mu_;
  std::multimap<size_t, void*> free_;  // size -> cached block
  std::map<void*, Block> live_;
  std::map<std::string, size_t> part_bytes_;
  size_t in_use_ = 0, cached_ = 0;
};

// A typed device buffer owned through the allocator.
template <class T>
class DeviceArray {
 public:
  DeviceArray() = default;
  DeviceArray(CachingAllocator& a, size_t n, const std::string& part)
      : alloc_(&a), n_(n), p_(static_cast<T*>(n ? a.allocate(n * sizeof(T), part) : nullptr)) {}
  ~DeviceArray() { reset(); }
  DeviceArray(DeviceArray&& o) noexcept { *this = std::move(o); }
  DeviceArray& operator=(DeviceArray&& o) noexcept {
    if (this != &o) {
      reset();
      alloc_ = o.alloc_;
      n_ = o.n_;
      p_ = o.p_;
      o.p_ = nullptr;
      o.n_ = 0;
    }
    return *this;
  }
  void reset() {
    if (p_ && alloc_) alloc_->free(p_);
    p_ = nullptr;
    n_ = 0;
  }
  T* get() const { return p_; }
  size_t size() const { return n_; }
  size_t bytes() const { return n_ * sizeof(T); }

 private:
  CachingAllocator* alloc_ = nullptr;
  size_t n_ = 0;
  T* p_ = nullptr;
};

// Page-locked host memory (for staging weight uploads and per-step metadata).
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(size_t bytes);
  ~PinnedBuffer();
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  PinnedBuffer(PinnedBuffer&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr; o.n_ = 0; }
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  void* get() const { return p_; }
  size_t size() const { return n_; }

 private:
  void* p_ = nullptr;
  size_t n_ = 0;
};

std::string format_bytes(size_t bytes);  // "38.2 GiB", "412.0 MiB"

}  // namespace moeserve::cuda
