// The fused MoE kernels compiled ahead of time for sm_90a (this library's architecture).
#define MOE_KERNEL_NAMESPACE moe_sm90
#define MOE_TABLE_WGMMA true  // sm_90a code: the warp-specialized configuration may run
#include "cuda/moe/moe_gemm_kernels.cuh"
#include "cuda/moe/moe_internal.h"

namespace moeserve::cuda {

moe_kernels::KernelTable fused_sm90_kernels() { return moe_sm90::kernel_table(); }

}  // namespace moeserve::cuda
