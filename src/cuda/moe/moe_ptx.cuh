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
// The L2 evict_first priority for the weight streams of decode steps (sm_80+). A weight byte is read once a step
// and a step reads far more than L2 holds, so its lines are worth nothing after use; marked evict_first they do
// not push out what else L2 holds (H200, served q30b8l decode step against no hint, session 14: bs 1 -5 us,
// bs 8 -12 to -24, bs 32 -27 to -31, bs 64 / 128 even). An explicit evict_normal policy is not the same as no hint:
// it was slower than both.
__device__ __forceinline__ unsigned long long l2_evict_first_policy() {
  unsigned long long p;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(p));
  return p;
}
// cp_async16 with the L2 policy from l2_evict_first_policy when `hint`, else without a cache hint.
__device__ __forceinline__ void cp_async16_hint(void* smem, const void* gmem, bool valid, bool hint,
                                                unsigned long long policy) {
  if (!hint) return cp_async16(smem, gmem, valid);
  const unsigned src_bytes = valid ? 16u : 0u;
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(smem_addr(smem)), "l"(gmem),
               "r"(src_bytes), "l"(policy)
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

// ---- sm_90a warpgroup MMA (wgmma), used by the prefill tile configuration where the build targets sm_90a. ----
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MOE_HAVE_WGMMA 1
#else
#define MOE_HAVE_WGMMA 0
#endif

// p moved up to the next multiple of `align` bytes of the shared window (a power of two).
__device__ __forceinline__ char* align_smem(char* p, unsigned align) {
  return p + ((align - (smem_addr(p) & (align - 1))) & (align - 1));
}

#if MOE_HAVE_WGMMA
// Shared-memory matrix descriptor of a K-major bf16 tile whose rows are 128 bytes (64 elements) with the 128-byte
// swizzle (16-byte chunk c of row r stored at chunk c ^ (r % 8): the XOR layout the loaders already write), from a
// 1024-byte aligned base: start address >> 4 (bits 0-13), leading byte offset 1 (unused by swizzled K-major
// layouts), stride byte offset 1024 >> 4 (the step between 8-row groups, bits 32-45), swizzle mode 1 = 128 B
// (bits 62-63). A K step of 16 elements inside the row adds 32 bytes to the start address.
__device__ __forceinline__ unsigned long long wgmma_desc_sw128(unsigned smem_byte_addr) {
  return (unsigned long long)((smem_byte_addr & 0x3FFFFu) >> 4) | (1ull << 16) | (64ull << 32) | (1ull << 62);
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// mbarrier rings between producer and consumer warps (sm_90): the warp-specialized MoE GEMMs (moe_gemm_ws.cuh) and
// the warp-specialized prefill attention (attention_wgmma_ws.cuh).
__device__ __forceinline__ void mbar_init(unsigned addr, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(addr), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned addr) {
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(addr) : "memory");
}
// Waits until the phase of the barrier with this parity has completed (acquire, CTA scope).
__device__ __forceinline__ void mbar_wait(unsigned addr, unsigned parity) {
  asm volatile(
      "{\n.reg .pred done;\nWAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n}\n" ::"r"(addr),
      "r"(parity)
      : "memory");
}
// Arrives on the barrier once all of this thread's earlier cp.async copies have completed; .noinc: the arrival is
// one of the barrier's expected count.
__device__ __forceinline__ void cp_async_arrive_noinc(unsigned addr) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(addr) : "memory");
}
// Register rebalancing between the warpgroups of a warp-specialized kernel.
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
// Makes this thread's shared-memory writes (cp.async lands through the generic proxy) visible to wgmma's reads
// (async proxy); a barrier after it covers the other threads' writes.
__device__ __forceinline__ void fence_proxy_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// Four 8x8 b16 matrices stored transposed (sm_90): register i of each lane holds elements (lane / 4, 2 (lane % 4))
// and (lane / 4, 2 (lane % 4) + 1) of matrix i (the mma / wgmma accumulator fragment, packed); lanes 8i..8i+7 give
// the addresses of matrix i's 16-byte memory rows, and memory row c receives the matrix's column c.
__device__ __forceinline__ void stsm_x4_trans(unsigned smem_byte_addr, unsigned r0, unsigned r1, unsigned r2,
                                              unsigned r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(smem_byte_addr),
               "r"(r0), "r"(r1), "r"(r2), "r"(r3)
               : "memory");
}
// The same without the transpose: memory row r of matrix i (address from lane 8i + r) receives the matrix's row r
// (the fragment's elements (lane / 4, 2 (lane % 4)) and (lane / 4, 2 (lane % 4) + 1) of each lane).
__device__ __forceinline__ void stsm_x4(unsigned smem_byte_addr, unsigned r0, unsigned r1, unsigned r2, unsigned r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(smem_byte_addr), "r"(r0),
               "r"(r1), "r"(r2), "r"(r3)
               : "memory");
}
// d (64 x N f32, the warpgroup's accumulator: warp w holds rows 16w + lane/4 (+8), columns 8j + 2(lane%4) (+1) in
// d[4j .. 4j+3]) += A (64 x 16, K-major, descriptor) * B (N x 16, K-major, descriptor)^T, for N = 256, 128, 64, 32, 16
// (N / 2 floats a thread).
__device__ __forceinline__ void wgmma_m64nk16_bf16(float (&d)[128], unsigned long long a_desc,
                                                   unsigned long long b_desc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(a_desc), "l"(b_desc), "r"(1));
}
__device__ __forceinline__ void wgmma_m64nk16_bf16(float (&d)[64], unsigned long long a_desc,
                                                   unsigned long long b_desc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(a_desc), "l"(b_desc), "r"(1));
}
__device__ __forceinline__ void wgmma_m64nk16_bf16(float (&d)[32], unsigned long long a_desc,
                                                   unsigned long long b_desc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(a_desc), "l"(b_desc), "r"(1));
}
__device__ __forceinline__ void wgmma_m64nk16_bf16(float (&d)[16], unsigned long long a_desc,
                                                   unsigned long long b_desc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(a_desc), "l"(b_desc), "r"(1));
}
__device__ __forceinline__ void wgmma_m64nk16_bf16(float (&d)[8], unsigned long long a_desc,
                                                   unsigned long long b_desc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "l"(a_desc), "l"(b_desc), "r"(1));
}
#endif

// A warpgroup's m64nN wgmma accumulator (NH = N / 2 floats a thread; see wgmma_m64nk16_bf16 for the fragment) into
// a token-major f32 tile cs[token][row] (row stride ldc): m is the thread's first row (16 (warp % 4) + lane / 4 plus
// the warpgroup's offset), tig = lane % 4.
template <int NH>
__device__ __forceinline__ void wgmma_acc_to_token_major(const float (&d)[NH], float* cs, int ldc, int m, int tig) {
#pragma unroll
  for (int jn = 0; jn < NH / 4; ++jn) {
    const int n = jn * 8 + tig * 2;
    cs[n * ldc + m] = d[4 * jn];
    cs[(n + 1) * ldc + m] = d[4 * jn + 1];
    cs[n * ldc + m + 8] = d[4 * jn + 2];
    cs[(n + 1) * ldc + m + 8] = d[4 * jn + 3];
  }
}

__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// One arrival that also raises the barrier's expected transaction bytes (the TMA loads count them down).
__device__ __forceinline__ void mbar_arrive_expect_tx(unsigned addr, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(addr), "r"(bytes) : "memory");
}
// TMA: the box at (c0 = inner / K element, c1 = row) of the descriptor `map` (a __grid_constant__ parameter) into
// shared memory at dst, completing `bytes` on the mbarrier bar.
__device__ __forceinline__ void tma_load_2d(unsigned dst, const void* map, int c0, int c1, unsigned bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
          dst),
      "l"(map), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}

}  // namespace moe_ptx
