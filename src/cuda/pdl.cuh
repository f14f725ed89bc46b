// Device side of programmatic dependent launch (see cuda/launch.h for the contract). Both are no-ops before
// sm_90 and for grids launched without the attribute.
//
// Data written by an earlier kernel must not be read through the non-coherent path (__ldg, ld.global.nc, or
// what the compiler makes of `const T* __restrict__`): the grid may have started, and cached such lines, before
// pdl_wait() returned. Use plain loads, __ldcg or cp.async.cg; weights (never written) may use any.
#pragma once

namespace moeserve::cuda {

// Blocks until every prerequisite grid has completed and its writes are visible.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// Lets the next grid on the stream be scheduled now (it still waits for this grid's completion in pdl_wait).
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// Both, in the order the contract needs: for kernels with nothing to do before their inputs are ready.
__device__ __forceinline__ void pdl_enter() {
  pdl_wait();
  pdl_launch_dependents();
}

// Starts pulling [p, p + bytes) from memory into L2 without waiting (sm_90 bulk prefetch; bytes a multiple of
// 16, p 16-byte aligned). For weights a kernel will stream once it may run.
__device__ __forceinline__ void prefetch_l2(const void* p, unsigned bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(p), "r"(bytes) : "memory");
#endif
}

}  // namespace moeserve::cuda
