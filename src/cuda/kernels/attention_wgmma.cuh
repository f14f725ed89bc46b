// Prefill attention on Hopper's warpgroup MMA (sm_90a builds, head_dim 128; internal header, included by
// attention.cu only). Same rows, masking, online softmax and output as the prefill tiles of attention_mma.cuh,
// but both products run on wgmma, reading K and V straight from shared memory (no ldmatrix):
//   - a CTA owns 128 rows (two warpgroups of 64; a row is a (query token, q head of the group) pair, as there),
//     two CTAs an SM;
//   - Q and each 64-key K / V tile sit in shared memory as two 64-dim halves of 128-byte rows with the 128-byte
//     swizzle (16-byte chunk c of row r at chunk c ^ (r % 8), 1024-byte aligned halves), gathered from the pages
//     with cp.async into a 2-stage ring;
//   - S = Q K^T: eight m64n64k16 wgmma a warpgroup (A = Q, B = K, both K-major descriptors);
//   - online softmax on the S accumulators in registers (a thread holds two rows' 16 scores);
//   - O += P V: four m64n128k16 wgmma with P from registers (the S accumulator layout is the A-fragment layout,
//     packed to bf16) and V through an MN-major descriptor (imm-trans-b): 64 dims of a key contiguous, 8 keys an
//     atom (stride byte offset 1,024), the second 64 dims one half further (leading byte offset).
// Why: the mma.sync tiles read every K and V fragment with ldmatrix for two MMAs each and hold Q in registers
// (168 registers, 3 CTAs an SM): ncu found them issue-bound at ~120 TFLOP/s (2.2 ms of a 19 ms prefill step).
#pragma once

#include "cuda/kernels/attention_mma.cuh"
#include "cuda/moe/moe_ptx.cuh"

namespace moeserve::cuda::detail {

constexpr int kWgRows = 128;  // rows a CTA: two warpgroups of 64
constexpr int kWgKeys = 64;   // keys a tile
constexpr int kWgDim = 128;   // head_dim
constexpr int kWgQBytes = kWgRows * kWgDim * 2;     // 32 KB
constexpr int kWgTileBytes = kWgKeys * kWgDim * 2;  // 16 KB: K or V of one tile (two halves of 8 KB)
constexpr size_t kWgSmemBytes = 1024 + kWgQBytes + 2 * 2 * kWgTileBytes;  // + alignment slack; 2 stages of K and V

#if MOE_HAVE_WGMMA
// Byte offset of 16-byte chunk cc (0..15) of row r in a tile of `rows` rows stored as two swizzled 64-dim halves.
__device__ __forceinline__ unsigned wg_chunk_offset(int rows, int r, int cc) {
  return unsigned((cc >> 3) * rows * 128 + r * 128 + (((cc & 7) ^ (r & 7)) << 4));
}

// Descriptor of an MN-major bf16 operand with the 128-byte swizzle: atoms of 8 K rows x 64 MN elements (128-byte
// rows), K atoms `sbo` bytes apart, MN atoms `lbo` bytes apart.
__device__ __forceinline__ unsigned long long wg_desc_mn_sw128(unsigned addr, unsigned lbo, unsigned sbo) {
  return (unsigned long long)((addr & 0x3FFFFu) >> 4) | ((unsigned long long)((lbo >> 4) & 0x3FFFu) << 16) |
         ((unsigned long long)((sbo >> 4) & 0x3FFFu) << 32) | (1ull << 62);
}

// d (64 x 128 f32) += A (64 x 16, bf16 registers in the mma.m16n8k16 A layout per warp) * B (16 x 128, MN-major
// descriptor, transposed on read).
__device__ __forceinline__ void wgmma_m64n128k16_rs_tb(float (&d)[64], const unsigned (&a)[4],
                                                       unsigned long long b_desc) {
  asm volatile(
      "{\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, "
      "%12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, "
      "%34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "
      "%56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, 1, 1, 1, 1;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc));
}
#endif

// The epilogue of a warpgroup's 64 rows: the quads' row sums reduced, O normalized and stored as bf16 (this
// thread's rows wr0 + lane / 4 and + 8; rows at or past rows_total are not stored). Row r of the tile is token r / G,
// head kvh G + r % G.
__device__ __forceinline__ void wg_store_rows(const AttnParams& p, const float (&o)[64], float (&l_r)[2], int wr0,
                                              int lane, int rows_total, int G, int kvh, int q_row_base) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l_r[i] += __shfl_xor_sync(0xffffffffu, l_r[i], 1);
    l_r[i] += __shfl_xor_sync(0xffffffffu, l_r[i], 2);
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int row = wr0 + (lane >> 2) + 8 * i;
    if (row >= rows_total) continue;
    const float inv = l_r[i] > 0.0f ? 1.0f / l_r[i] : 0.0f;
    const int tok = row / G, h = kvh * G + (row - tok * G);
    bf16* dst = p.out + int64_t(q_row_base + tok) * p.out_stride + int64_t(h) * kWgDim + ((lane & 3) << 1);
#pragma unroll
    for (int j = 0; j < 16; ++j)
      *reinterpret_cast<__nv_bfloat162*>(dst + 8 * j) =
          __floats2bfloat162_rn(o[4 * j + 2 * i] * inv, o[4 * j + 2 * i + 1] * inv);
  }
}

// 256 threads held to 128 registers: two CTAs an SM (H200, AttentionTiming 16 x 512 at head_dim 128: 201.9 us,
// against 292.8 with one CTA an SM at 137 registers, 256.4 with three warpgroups a CTA, 280.9 for the mma.sync
// tiles).
__global__ void __launch_bounds__(256, 2) paged_attention_prefill_wgmma_kernel(const AttnParams p) {
#if MOE_HAVE_WGMMA
  constexpr int D = kWgDim, BN = kWgKeys, kThreads = 256;
  constexpr float kNegInf = -INFINITY;
  extern __shared__ __align__(128) unsigned char wg_smem_raw[];
  char* smem = moe_ptx::align_smem(reinterpret_cast<char*>(wg_smem_raw), 1024);
  char* sQ = smem;                // [2 halves][128 rows][64]
  char* sK = sQ + kWgQBytes;      // [2 stages][2 halves][64 keys][64]
  char* sV = sK + 2 * kWgTileBytes;
  const unsigned q_addr = moe_ptx::smem_addr(sQ), k_addr = moe_ptx::smem_addr(sK), v_addr = moe_ptx::smem_addr(sV);

  pdl_enter();  // q and this step's K / V come from the kernel before
  const int s = blockIdx.z, kvh = blockIdx.y;
  const int m_tile = int(gridDim.x - 1 - blockIdx.x);  // the late (longest) causal tiles first
  const int new_len = p.new_lens[s];
  if (new_len <= 0) return;
  const int G = p.group;
  const int rows_total = new_len * G;
  const int row0 = m_tile * kWgRows;
  if (row0 >= rows_total) return;
  const int kv_len = p.kv_lens[s];
  const int start = kv_len - new_len;
  const int last_row = min(row0 + kWgRows, rows_total) - 1;
  const int k_end = visible_key_end(start, last_row, G);
  const int n_tiles = (k_end + BN - 1) / BN;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, wg = warp >> 2;
  const int q_row_base = p.q_rows[s];

  // Q -> shared (zeros past the last row): 16 chunks a row.
  for (int c = tid; c < kWgRows * 16; c += kThreads) {
    const int r = c >> 4, cc = c & 15, row = row0 + r;
    const bool valid = row < rows_total;
    const bf16* src = p.q;
    if (valid) {
      const int i = row / G, g = row - i * G;
      src = p.q + int64_t(q_row_base + i) * p.q_stride + int64_t(kvh * G + g) * D + cc * 8;
    }
    moe_ptx::cp_async16(sQ + wg_chunk_offset(kWgRows, r, cc), src, valid);
  }
  // K / V tile loader: chunk c = 16 r + cc of the tile's key r, K and V.
  const int P = p.page_size;
  const int32_t* table = p.block_tables + int64_t(s) * p.max_pages;
  const int64_t kv_row_stride = int64_t(p.kv_heads) * D;
  const bf16* k_head = p.k_cache + int64_t(kvh) * D;
  const bf16* v_head = p.v_cache + int64_t(kvh) * D;
  auto load_kv = [&](int tile, int stage) {
    char* dk = sK + stage * kWgTileBytes;
    char* dv = sV + stage * kWgTileBytes;
#pragma unroll
    for (int c = tid; c < BN * 16; c += kThreads) {
      const int r = c >> 4, ld_cc = c & 15, key = tile * BN + r;
      const bool valid = key < k_end;
      int64_t o = 0;
      if (valid) {
        const int page = table[key / P];
        o = (int64_t(page) * P + key % P) * kv_row_stride + ld_cc * 8;
      }
      const unsigned off = wg_chunk_offset(BN, r, ld_cc);
      moe_ptx::cp_async16(dk + off, k_head + o, valid);
      moe_ptx::cp_async16(dv + off, v_head + o, valid);
    }
  };
  load_kv(0, 0);
  moe_ptx::cp_async_commit();  // group: Q and tile 0

  // This thread's rows (lane / 4 and + 8 of its warp's 16) and their causal limits; rows past the end borrow
  // the last row's limit (their Q is zero and nothing of them is stored).
  const int wr0 = row0 + wg * 64 + (warp & 3) * 16;
  const int rA = min(wr0 + (lane >> 2), rows_total - 1), rB = min(wr0 + (lane >> 2) + 8, rows_total - 1);
  const int lim[2] = {start + rA / G, start + rB / G};
  const bool wg_active = row0 + wg * 64 < rows_total;
  const int wg_lim_lo = start + min(row0 + wg * 64, rows_total - 1) / G;
  const int wg_lim_hi = start + min(row0 + wg * 64 + 63, rows_total - 1) / G;

  float m_r[2] = {kNegInf, kNegInf}, l_r[2] = {0.0f, 0.0f};
  float o[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) o[i] = 0.0f;
  constexpr unsigned v_lbo = BN * 128, v_sbo = 1024;  // V: the second 64 dims one half further; 8 keys an atom

  for (int t = 0; t < n_tiles; ++t) {
    const int stage = t & 1;
    if (t + 1 < n_tiles) load_kv(t + 1, stage ^ 1);
    moe_ptx::cp_async_commit();
    moe_ptx::cp_async_wait<1>();       // tile t (and Q) landed for this thread ...
    moe_ptx::fence_proxy_async_smem();  // ... visible to the async proxy (wgmma) ...
    __syncthreads();           // ... and for every thread
    const int key0 = t * BN;
    if (wg_active && key0 <= wg_lim_hi) {  // warpgroup-uniform
      const unsigned ks = k_addr + unsigned(stage * kWgTileBytes), vs = v_addr + unsigned(stage * kWgTileBytes);
      float sacc[32];
#pragma unroll
      for (int i = 0; i < 32; ++i) sacc[i] = 0.0f;
      moe_ptx::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        const unsigned half = unsigned(kk >> 2), within = unsigned((kk & 3) * 32);
        moe_ptx::wgmma_m64nk16_bf16(sacc, moe_ptx::wgmma_desc_sw128(q_addr + half * (kWgRows * 128) + unsigned(wg * 64 * 128) + within),
                           moe_ptx::wgmma_desc_sw128(ks + half * (BN * 128) + within));
      }
      moe_ptx::wgmma_commit();
      moe_ptx::wgmma_wait<0>();
      const bool need_mask = key0 + BN - 1 > wg_lim_lo || key0 + BN > k_end;
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float x = sacc[4 * j + e] * p.scale_log2;
          if (need_mask) {
            const int key = key0 + 8 * j + ((lane & 3) << 1) + (e & 1);
            if (key >= k_end || key > lim[e >> 1]) x = kNegInf;
          }
          sacc[4 * j + e] = x;
        }
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        // The m64n64 accumulator is eight n8 tiles of the mma.m16n8 layout a warp.
        const float alpha = softmax_update_row<8>(reinterpret_cast<float(&)[8][4]>(sacc), i, m_r[i], l_r[i]);
        if (__any_sync(0xffffffffu, alpha != 1.0f)) {
#pragma unroll
          for (int j = 0; j < 16; ++j) {
            o[4 * j + 2 * i] *= alpha;
            o[4 * j + 2 * i + 1] *= alpha;
          }
        }
      }
      unsigned pa[4][4];
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        pa[kk][0] = moe_ptx::pack_bf16x2(sacc[8 * kk + 0], sacc[8 * kk + 1]);
        pa[kk][1] = moe_ptx::pack_bf16x2(sacc[8 * kk + 2], sacc[8 * kk + 3]);
        pa[kk][2] = moe_ptx::pack_bf16x2(sacc[8 * kk + 4], sacc[8 * kk + 5]);
        pa[kk][3] = moe_ptx::pack_bf16x2(sacc[8 * kk + 6], sacc[8 * kk + 7]);
      }
      moe_ptx::wgmma_fence();  // o and pa were written by ordinary instructions
#pragma unroll
      for (int kk = 0; kk < 4; ++kk)
        wgmma_m64n128k16_rs_tb(o, pa[kk], wg_desc_mn_sw128(vs + unsigned(kk * 2 * 1024), v_lbo, v_sbo));
      moe_ptx::wgmma_commit();
      moe_ptx::wgmma_wait<0>();
    }
    __syncthreads();  // the stage read here is overwritten by the next iteration's loads
  }
  moe_ptx::cp_async_wait<0>();
  wg_store_rows(p, o, l_r, wr0, lane, rows_total, G, kvh, q_row_base);
#else
  (void)p;
#endif
}

}  // namespace moeserve::cuda::detail
