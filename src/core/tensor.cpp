#include "core/tensor.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

namespace moeserve {

std::string shape_str(const Shape& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

Tensor Tensor::empty(DType dtype, Shape shape) {
  Tensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  size_t bytes = std::max<size_t>(64, (t.nbytes() + 63) / 64 * 64);
  if (bytes >= (size_t(1) << 21)) {
    // Large buffers (KV pools, converted weights) come zeroed from the kernel, page by page on first touch:
    // no upfront memset of memory that may never be used.
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw InternalError(fmt::format("out of host memory mapping {} bytes", bytes));
    t.data = p;
    t.owner = std::shared_ptr<void>(p, [bytes](void* q) { ::munmap(q, bytes); });
    return t;
  }
  void* p = std::aligned_alloc(64, bytes);
  if (!p) throw InternalError(fmt::format("out of host memory allocating {} bytes", bytes));
  std::memset(p, 0, bytes);
  t.data = p;
  t.owner = std::shared_ptr<void>(p, [](void* q) { std::free(q); });
  return t;
}

Tensor Tensor::select0(int64_t index) const {
  MS_CHECK(dim() >= 1 && index >= 0 && index < shape[0], "select0({}) of {}", index, shape_str(shape));
  Tensor v = *this;
  v.shape.erase(v.shape.begin());
  v.data = static_cast<char*>(data) + size_t(index) * v.nbytes();
  return v;
}

Tensor Tensor::rows(int64_t begin, int64_t end) const {
  MS_CHECK(dim() >= 1 && begin >= 0 && begin <= end && end <= shape[0], "rows({}, {}) of {}", begin, end,
           shape_str(shape));
  Tensor v = *this;
  int64_t row_bytes = shape[0] ? int64_t(nbytes()) / shape[0] : 0;
  v.shape[0] = end - begin;
  v.data = static_cast<char*>(data) + begin * row_bytes;
  return v;
}

static float load_as_f32(const Tensor& t, int64_t i) {
  switch (t.dtype) {
    case DType::F32: return t.ptr<float>()[i];
    case DType::BF16: return bf16_to_f32(t.ptr<uint16_t>()[i]);
    case DType::F16: return f16_to_f32(t.ptr<uint16_t>()[i]);
    case DType::F8E4M3: return fp8e4m3_to_f32(t.ptr<uint8_t>()[i]);
    case DType::F64: return float(t.ptr<double>()[i]);
    default: throw InternalError(fmt::format("to_f32: unsupported dtype {}", dtype_name(t.dtype)));
  }
}

Tensor to_f32(const Tensor& t) {
  Tensor r = Tensor::empty(DType::F32, t.shape);
  int64_t n = t.numel();
  float* o = r.ptr<float>();
  for (int64_t i = 0; i < n; ++i) o[i] = load_as_f32(t, i);
  return r;
}

Tensor convert(const Tensor& t, DType dtype) {
  if (dtype == DType::F32) return to_f32(t);
  Tensor r = Tensor::empty(dtype, t.shape);
  int64_t n = t.numel();
  uint16_t* o = r.ptr<uint16_t>();
  if (dtype == DType::BF16) {
    for (int64_t i = 0; i < n; ++i) o[i] = t.dtype == DType::BF16 ? t.ptr<uint16_t>()[i] : f32_to_bf16(load_as_f32(t, i));
  } else if (dtype == DType::F16) {
    for (int64_t i = 0; i < n; ++i) o[i] = t.dtype == DType::F16 ? t.ptr<uint16_t>()[i] : f32_to_f16(load_as_f32(t, i));
  } else {
    throw InternalError(fmt::format("convert: unsupported target dtype {}", dtype_name(dtype)));
  }
  return r;
}

}  // namespace moeserve
