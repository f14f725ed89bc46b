// A tensor is a typed view of memory plus an owner that keeps the memory alive (an mmapped checkpoint
// file, a host allocation, later a device buffer). Views of weights that are already in the compute dtype
// point straight into the mmapped file: no copy.
#pragma once

#include <cstdint>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"

namespace moeserve {

using Shape = std::vector<int64_t>;

std::string shape_str(const Shape& s);  // "[4, 128]"

struct Tensor {
  DType dtype = DType::F32;
  Shape shape;
  void* data = nullptr;
  std::shared_ptr<void> owner;

  int64_t numel() const {
    return std::accumulate(shape.begin(), shape.end(), int64_t(1), std::multiplies<int64_t>());
  }
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype); }
  int dim() const { return int(shape.size()); }
  int64_t size(int i) const { return shape.at(i < 0 ? shape.size() + i : i); }
  bool defined() const { return data != nullptr; }

  template <typename T>
  T* ptr() const { return static_cast<T*>(data); }

  // Zero-initialised host memory, 64-byte aligned.
  static Tensor empty(DType dtype, Shape shape);
  // The [index] slice along dim 0 (a view sharing the owner).
  Tensor select0(int64_t index) const;
  // Rows [begin, end) along dim 0 (a view).
  Tensor rows(int64_t begin, int64_t end) const;
};

// A host copy converted to f32 (for weights stored in another dtype than the compute dtype, and tests).
Tensor to_f32(const Tensor& t);
// A host copy converted to `dtype` (f32 / bf16 / f16 only).
Tensor convert(const Tensor& t, DType dtype);

}  // namespace moeserve
