// The GEMM backends behind make_gemm_backends(), visible to each other: "gemv" falls back to cuBLASLt for the
// shapes its kernel is not written for.
#pragma once

#include <memory>

#include "cuda/gemm/gemm.h"

namespace moeserve::cuda {

std::unique_ptr<GemmBackend> make_cublas_backend();
// m_buckets: token counts above 256 share one algorithm per bucket of 256 (see CublasLtBackend::bucket_m); the
// default (MOESERVE_CUBLASLT_M_BUCKETS=0 turns it off): a bounded set of kernels, all run once at startup
// (GemmBackend::warm_up_tokens). H200 session 18: buckets on +0.4 / +0.6% at 64 / 128 concurrent (run-to-run
// spread).
std::unique_ptr<GemmBackend> make_cublaslt_backend();
std::unique_ptr<GemmBackend> make_cublaslt_backend(bool m_buckets);

}  // namespace moeserve::cuda
