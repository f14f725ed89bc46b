#include "kv/kv_pool.h"

#include <algorithm>

#include "core/error.h"

namespace moeserve {

PageAllocator::PageAllocator(int64_t num_pages) : num_pages_(num_pages), in_use_(num_pages, 0) {
  free_.reserve(num_pages);
  // Lowest ids handed out first: deterministic layouts make debugging easier.
  for (int64_t p = num_pages - 1; p >= 0; --p) free_.push_back(int32_t(p));
}

std::vector<int32_t> PageAllocator::allocate(int64_t n) {
  MS_CHECK(can_allocate(n), "allocate({}) with {} free pages", n, num_free());
  std::vector<int32_t> r(free_.end() - n, free_.end());
  std::reverse(r.begin(), r.end());
  free_.resize(free_.size() - n);
  for (int32_t p : r) in_use_[p] = 1;
  return r;
}

void PageAllocator::free(const std::vector<int32_t>& pages) {
  for (int32_t p : pages) {
    MS_CHECK(p >= 0 && p < num_pages_ && in_use_[p], "free of page {} that is not in use", p);
    in_use_[p] = 0;
    free_.push_back(p);
  }
}

KVPool::KVPool(const KVPoolShape& s, bool host_storage) : shape_(s), alloc_(s.num_pages) {
  if (!host_storage) return;
  Shape shape = {s.num_layers, s.num_pages, s.page_size, s.kv_heads, s.head_dim};
  k_ = Tensor::empty(DType::F32, shape);
  v_ = Tensor::empty(DType::F32, shape);
}

kernels::PagedKV KVPool::layer(int64_t l) const {
  kernels::PagedKV kv;
  int64_t page_stride = shape_.page_size * shape_.kv_heads * shape_.head_dim;
  int64_t layer_stride = shape_.num_pages * page_stride;
  kv.k = k_.ptr<float>() + l * layer_stride;
  kv.v = v_.ptr<float>() + l * layer_stride;
  kv.page_stride = page_stride;
  kv.page_size = shape_.page_size;
  kv.kv_heads = shape_.kv_heads;
  kv.head_dim = shape_.head_dim;
  return kv;
}

}  // namespace moeserve
