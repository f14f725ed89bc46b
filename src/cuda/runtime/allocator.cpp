#include "cuda/runtime/allocator.h"

#include <fmt/format.h>

#include "core/log.h"

namespace moeserve::cuda {

std::string format_bytes(size_t b) {
  if (b >= (size_t(1) << 30)) return fmt::format("{:.1f} GiB", double(b) / double(size_t(1) << 30));
  return fmt::format("{:.1f} MiB", double(b) / double(1 << 20));
}

CachingAllocator::~CachingAllocator() {
  for (auto& [p, b] : live_) cudaFree(p);
  for (auto& [s, p] : free_) cudaFree(p);
}

// Small blocks round to 512 bytes, large ones to 2 MiB, so that freed blocks are reusable by similar requests.
size_t CachingAllocator::round_size(size_t bytes) {
  if (bytes == 0) bytes = 1;
  const size_t q = bytes < (size_t(1) << 20) ? 512 : (size_t(2) << 20);
  return (bytes + q - 1) / q * q;
}

void* CachingAllocator::allocate(size_t bytes, const std::string& part) {
  std::lock_guard<std::mutex> lock(mu_);
  const size_t size = round_size(bytes);
  void* p = nullptr;
  // Reuse a cached block of the same size class (at most 25% larger, to keep waste low).
  auto it = free_.lower_bound(size);
  if (it != free_.end() && it->first <= size + size / 4) {
    p = it->second;
    cached_ -= it->first;
    live_[p] = {it->first, part};
    in_use_ += it->first;
    part_bytes_[part] += it->first;
    free_.erase(it);
    return p;
  }
  cudaError_t e = cudaMalloc(&p, size);
  if (e != cudaSuccess && !free_.empty()) {
    cudaGetLastError();
    for (auto& [s, q] : free_) cudaFree(q);
    free_.clear();
    cached_ = 0;
    e = cudaMalloc(&p, size);
  }
  if (e != cudaSuccess) {
    cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    throw_user("out of GPU memory allocating {} for {} ({} free of {}; in use by moeserve: {}). Lower "
               "--mem-fraction-static, --max-total-tokens or --cuda-graph-max-bs, or use a smaller model",
               format_bytes(size), part, format_bytes(free_b), format_bytes(total_b), format_bytes(in_use_));
  }
  live_[p] = {size, part};
  in_use_ += size;
  part_bytes_[part] += size;
  return p;
}

void CachingAllocator::free(void* p) {
  if (!p) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(p);
  MS_CHECK(it != live_.end(), "freeing device memory that this allocator did not hand out");
  in_use_ -= it->second.size;
  part_bytes_[it->second.part] -= it->second.size;
  cached_ += it->second.size;
  free_.emplace(it->second.size, p);
  live_.erase(it);
}

void CachingAllocator::release_cached() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [s, p] : free_) cudaFree(p);
  free_.clear();
  cached_ = 0;
}

std::map<std::string, size_t> CachingAllocator::by_part() const {
  std::lock_guard<std::mutex> lock(mu_);
  return part_bytes_;
}

PinnedBuffer::PinnedBuffer(size_t bytes) : n_(bytes) { MS_CUDA_CHECK(cudaMallocHost(&p_, bytes)); }
PinnedBuffer::~PinnedBuffer() {
  if (p_) cudaFreeHost(p_);
}

}  // namespace moeserve::cuda
