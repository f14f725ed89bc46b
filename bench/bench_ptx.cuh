// What the benchmark programs' hand-written kernels share (gpu_read_bw, gpu_chain, gpu_layer_persistent): mbarrier
// rings filled by 1-D bulk copies, a gpu-scope acquire load and release add for counters between CTAs, the CUDA-core
// bf16 dot product of the GEMV prototypes, and the hashed fill of their random weights.
#pragma once

#include <cuda_bf16.h>

#include "cuda/moe/moe_ptx.cuh"

namespace bench_ptx {

using moe_ptx::smem_addr;

// n mbarriers expecting `count` arrivals each, made visible to the async proxy (the bulk copies complete on them).
__device__ __forceinline__ void init_ring_barriers(unsigned long long* bar, int n, unsigned count = 1) {
  for (int i = 0; i < n; ++i)
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(&bar[i])), "r"(count) : "memory");
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// Whether the phase of `parity` of the barrier has completed (no wait: a producer polling several rings).
__device__ __forceinline__ bool test_ring_barrier(const unsigned long long* bar, unsigned parity) {
  unsigned done;
  asm volatile("{\n.reg .pred p;\nmbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
               : "=r"(done)
               : "r"(smem_addr(bar)), "r"(parity)
               : "memory");
  return done != 0;
}
// Spins until the phase of `parity` of the barrier has completed.
__device__ __forceinline__ void wait_ring_barrier(unsigned long long* bar, unsigned parity) {
  unsigned done = 0;
  while (!done)
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(smem_addr(bar)), "r"(parity)
        : "memory");
}
__device__ __forceinline__ void arrive_ring_barrier(unsigned long long* bar) {
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(smem_addr(bar)) : "memory");
}

// One arrival on `bar` that raises its expected transaction bytes; a 1-D bulk copy completing on it (optionally
// with an L2 cache policy, e.g. moe_ptx::l2_evict_first_policy()).
__device__ __forceinline__ void arrive_expect_tx(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, unsigned bytes, unsigned bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   smem_addr(dst)),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}
__device__ __forceinline__ void bulk_copy_hint(void* dst, const void* src, unsigned bytes, unsigned bar,
                                               unsigned long long policy) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;\n" ::
          "r"(smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(bar), "l"(policy)
      : "memory");
}

// The GPU's global nanosecond clock (%globaltimer), common to all SMs: the benchmarks' phase timelines.
__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
  return t;
}

__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// *p += n with release semantics at gpu scope: what this thread (and, behind a block barrier, its block) wrote before
// is visible to whoever reads the count with ld_acquire. The counters between the persistent kernels' stages.
__device__ __forceinline__ void red_release_add(unsigned* p, unsigned n = 1) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;\n" ::"l"(p), "r"(n) : "memory");
}

// Eight bf16 products summed in f32.
__device__ __forceinline__ float dot8(uint4 w, uint4 x) {
  const __nv_bfloat162* a = reinterpret_cast<const __nv_bfloat162*>(&w);
  const __nv_bfloat162* b = reinterpret_cast<const __nv_bfloat162*>(&x);
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 fa = __bfloat1622float2(a[i]), fb = __bfloat1622float2(b[i]);
    s = fmaf(fa.x, fb.x, s);
    s = fmaf(fa.y, fb.y, s);
  }
  return s;
}

// p[i] = scale x a uniform value in [-1, 1) hashed from (i, seed): the same bytes on every run and every GPU.
__global__ void fill_bf16_kernel(__nv_bfloat16* p, size_t n, float scale, unsigned seed) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    unsigned v = unsigned(i) * 2654435761u ^ seed ^ unsigned(i >> 32) * 40503u;
    v ^= v >> 15, v *= 2246822519u, v ^= v >> 13, v *= 3266489917u, v ^= v >> 16;
    p[i] = __float2bfloat16_rn((float(v) / 4294967296.0f * 2.0f - 1.0f) * scale);
  }
}

}  // namespace bench_ptx
