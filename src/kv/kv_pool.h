// The paged KV cache: fixed-size pages of `page_size` token slots per layer, handed out by a free-list page
// allocator. The allocator only manages page ids; the pool only stores. Sequences hold their pages in a
// block table (page ids in position order). Recurrent-state pools for hybrid models sit beside this one.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "kernels/attention/attention.h"

namespace moeserve {

class PageAllocator {
 public:
  explicit PageAllocator(int64_t num_pages);
  int64_t num_pages() const { return num_pages_; }
  int64_t num_free() const { return int64_t(free_.size()); }
  bool can_allocate(int64_t n) const { return n <= num_free(); }
  // Takes n pages; InternalError if !can_allocate(n) (callers check first).
  std::vector<int32_t> allocate(int64_t n);
  void free(const std::vector<int32_t>& pages);

 private:
  int64_t num_pages_;
  std::vector<int32_t> free_;
  std::vector<uint8_t> in_use_;  // catches double frees
};

struct KVPoolShape {
  int64_t num_layers = 0, num_pages = 0, page_size = 16, kv_heads = 0, head_dim = 0;
  size_t bytes() const { return size_t(num_layers) * num_pages * page_size * kv_heads * head_dim * 2 * sizeof(float); }
};

// CPU storage: f32 keys and values, one contiguous block per layer. Without host storage the pool only
// keeps the page bookkeeping (the CUDA executor stores the pages on the GPU).
class KVPool {
 public:
  explicit KVPool(const KVPoolShape& shape, bool host_storage = true);
  const KVPoolShape& shape() const { return shape_; }
  kernels::PagedKV layer(int64_t l) const;
  PageAllocator& allocator() { return alloc_; }
  int64_t pages_for(int64_t tokens) const { return (tokens + shape_.page_size - 1) / shape_.page_size; }

 private:
  KVPoolShape shape_;
  Tensor k_, v_;  // [layers, pages, page_size, kv_heads, head_dim]
  PageAllocator alloc_;
};

// A sequence's view of the cache: its pages and how many positions are filled.
struct BlockTable {
  std::vector<int32_t> pages;
  int64_t num_tokens = 0;
};

}  // namespace moeserve
