#include "cuda/tma.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstring>

#include "core/error.h"

namespace moeserve::cuda {

void encode_bf16_tma_2d(void* out, const void* base, int64_t rows, int K, int box_rows, int64_t ld) {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      f = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  MS_CHECK(encode != nullptr, "the CUDA driver does not provide cuTensorMapEncodeTiled (TMA)");
  CUtensorMap m;
  const cuuint64_t dims[2] = {cuuint64_t(K), cuuint64_t(rows)};
  const cuuint64_t strides[1] = {cuuint64_t(ld > 0 ? ld : K) * 2};
  const cuuint32_t box[2] = {64, cuuint32_t(box_rows)};
  const cuuint32_t elem_strides[2] = {1, 1};
  const CUresult r = encode(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(base), dims, strides, box,
                            elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  MS_CHECK(r == CUDA_SUCCESS, "cuTensorMapEncodeTiled failed (CUresult {}) for [{}, {}] bf16, boxes of 64 x {}", int(r),
           rows, K, box_rows);
  static_assert(sizeof(CUtensorMap) == 128, "a CUtensorMap is 128 bytes");
  std::memcpy(out, &m, sizeof m);
}

}  // namespace moeserve::cuda
