// The few PTX instructions the MoE kernels use (sm_80 and newer), as inline asm: NVRTC then needs no CUDA
// header at all, and every memory access the tensor-core path makes is spelled out here.
#pragma once

namespace moe_ptx {

__device__ __forceinline__ unsigned smem_addr(const void* p) {
  unsigned long long a;
  asm("cvta.to.shared.u64 %0, %1;\n" : "=l"(a) : "l"(p));
  return unsigned(a);
}

// 16-byte global -> shared copy that bypasses L1 (weights are streamed once). With valid == false nothing is
// read and the destination is zero-filled: rows past the tile and columns past K then add nothing.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
  const unsigned src_bytes = valid ? 16u : 0u;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(smem)), "l"(gmem), "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Four 8x8 b16 matrices; lanes 8i..8i+7 give the row addresses of matrix i, register i receives matrix i.
__device__ __forceinline__ void ldsm_x4(const void* smem, unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(smem_addr(smem)));
}

// d[16x8] += a[16x16] (row-major) * b[16x8] (column-major), BF16 inputs, f32 accumulation.
__device__ __forceinline__ void mma_bf16_16816(float* d, const unsigned* a, const unsigned* b) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Two floats -> packed bf16x2 (lo in the low half), round to nearest even like torch's cast.
__device__ __forceinline__ unsigned pack_bf16x2(float lo, float hi) {
  unsigned r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
__device__ __forceinline__ float bits_to_float(unsigned u) {
  float f;
  asm("mov.b32 %0, %1;\n" : "=f"(f) : "r"(u));
  return f;
}
__device__ __forceinline__ float bf16_lo(unsigned v) { return bits_to_float(v << 16); }
__device__ __forceinline__ float bf16_hi(unsigned v) { return bits_to_float(v & 0xffff0000u); }

// Programmatic dependent launch (sm_90+; no-ops on older GPUs and for grids launched without the attribute).
// grid_dep_wait: blocks until every prerequisite grid has completed and its memory is visible; nothing a
// prerequisite writes may be read (or anything it reads overwritten) before it. grid_dep_launch_dependents: lets
// the dependent grid be scheduled early (it still waits in grid_dep_wait for this grid's completion).
__device__ __forceinline__ void grid_dep_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void grid_dep_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace moe_ptx
