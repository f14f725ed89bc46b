// The GEMM backends behind make_gemm_backends(), visible to each other: "gemv" falls back to cuBLASLt for the
// shapes its kernel is not written for.
#pragma once

#include <memory>

#include "cuda/gemm/gemm.h"

namespace moeserve::cuda {

std::unique_ptr<GemmBackend> make_cublas_backend();
std::unique_ptr<GemmBackend> make_cublaslt_backend();

}  // namespace moeserve::cuda
