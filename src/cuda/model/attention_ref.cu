#include "cuda/model/attention_ref.h"

namespace moeserve::cuda {

namespace {

constexpr int kWarps = 4;
constexpr int kMaxPerLane = 8;  // head_dim <= 256

__global__ void __launch_bounds__(kWarps * 32)
attention_ref_kernel(const bf16* __restrict__ q, int64_t q_stride, const bf16* __restrict__ kc,
                     const bf16* __restrict__ vc, AttnMeta m, AttnShape sh, bf16* __restrict__ out,
                     int64_t out_stride) {
  const int s = blockIdx.z, h = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int i = blockIdx.x * kWarps + warp;  // query index within the sequence
  const int n_new = m.new_lens[s];
  if (i >= n_new) return;
  const int kv_len = m.kv_lens[s];
  const int pos = kv_len - n_new + i;  // this query's position: keys 0..pos are visible
  const int row = m.q_rows[s] + i;
  const int D = sh.head_dim, kvh = h / (sh.heads / sh.kv_heads);
  const int32_t* bt = m.block_tables + int64_t(s) * m.max_pages;
  float qv[kMaxPerLane], acc[kMaxPerLane];
#pragma unroll
  for (int j = 0; j < kMaxPerLane; ++j) {
    const int d = lane + 32 * j;
    qv[j] = d < D ? __bfloat162float(q[int64_t(row) * q_stride + int64_t(h) * D + d]) * sh.scale : 0.0f;
    acc[j] = 0.0f;
  }
  float mx = -INFINITY, l = 0.0f;
  for (int t = 0; t <= pos; ++t) {
    const int64_t base = (int64_t(bt[t / m.page_size]) * m.page_size + t % m.page_size) * sh.kv_heads * D +
                         int64_t(kvh) * D;
    float dot = 0.0f;
#pragma unroll
    for (int j = 0; j < kMaxPerLane; ++j) {
      const int d = lane + 32 * j;
      if (d < D) dot += qv[j] * __bfloat162float(kc[base + d]);
    }
#pragma unroll
    for (int o = 16; o > 0; o /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, o);
    const float nm = fmaxf(mx, dot);
    const float corr = __expf(mx - nm), p = __expf(dot - nm);
    l = l * corr + p;
#pragma unroll
    for (int j = 0; j < kMaxPerLane; ++j) {
      const int d = lane + 32 * j;
      acc[j] = acc[j] * corr + (d < D ? p * __bfloat162float(vc[base + d]) : 0.0f);
    }
    mx = nm;
  }
  const float inv = 1.0f / l;
#pragma unroll
  for (int j = 0; j < kMaxPerLane; ++j) {
    const int d = lane + 32 * j;
    if (d < D) out[int64_t(row) * out_stride + int64_t(h) * D + d] = __float2bfloat16(acc[j] * inv);
  }
}

}  // namespace

void paged_attention_reference(const bf16* q, int64_t q_stride, const bf16* k_cache, const bf16* v_cache,
                               const AttnMeta& meta, const AttnShape& shape, int max_new_lens, bf16* out,
                               int64_t out_stride, cudaStream_t stream) {
  MS_CHECK(shape.head_dim > 0 && shape.head_dim <= 32 * kMaxPerLane, "head_dim {} > 256", shape.head_dim);
  MS_CHECK(shape.kv_heads > 0 && shape.heads % shape.kv_heads == 0, "{} heads over {} kv heads", shape.heads,
           shape.kv_heads);
  if (meta.num_seqs == 0 || max_new_lens == 0) return;
  dim3 grid(unsigned((max_new_lens + kWarps - 1) / kWarps), unsigned(shape.heads), unsigned(meta.num_seqs));
  attention_ref_kernel<<<grid, kWarps * 32, 0, stream>>>(q, q_stride, k_cache, v_cache, meta, shape, out, out_stride);
  MS_CUDA_LAUNCH_CHECK();
}

}  // namespace moeserve::cuda
