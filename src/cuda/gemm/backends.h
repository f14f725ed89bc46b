// The GEMM backends behind make_gemm_backends(), visible to each other: "gemv" falls back to cuBLASLt for the
// shapes its kernel is not written for.
#pragma once

#include <memory>

#include "cuda/gemm/gemm.h"

namespace moeserve::cuda {

std::unique_ptr<GemmBackend> make_cublas_backend();
// m_buckets: token counts above 256 share one algorithm per bucket of 256 (see CublasLtBackend::bucket_m); the
// default is MOESERVE_CUBLASLT_M_BUCKETS=1 (off otherwise until measured on a GPU).
std::unique_ptr<GemmBackend> make_cublaslt_backend();
std::unique_ptr<GemmBackend> make_cublaslt_backend(bool m_buckets);

}  // namespace moeserve::cuda
