// The same fused MoE kernels compiled for sm_100a only (an object library of its own, see
// src/cuda/CMakeLists.txt). The "fused_sm100_build" backend claims Hopper support anyway: it models a build made
// for the wrong GPU, which the registry must refuse with "no code for sm_90 in this binary" before any launch.
#define MOE_KERNEL_NAMESPACE moe_sm100
#include "cuda/moe/moe_gemm_kernels.cuh"
#include "cuda/moe/moe_internal.h"

namespace moeserve::cuda {

moe_kernels::KernelTable fused_sm100_kernels() { return moe_sm100::kernel_table(); }

}  // namespace moeserve::cuda
