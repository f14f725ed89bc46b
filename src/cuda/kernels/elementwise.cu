// Row-wise and element-wise kernels of a layer: embedding gather, RMSNorm (plain and fused with the residual
// add), SwiGLU. All are memory-bound: 16-byte accesses where the shapes and pointers allow, scalar otherwise.
#include <algorithm>

#include "cuda/kernels/kernel_utils.cuh"
#include "cuda/kernels/ops.h"
#include "cuda/launch.h"
#include "cuda/pdl.cuh"

namespace moeserve::cuda {

namespace {

using detail::aligned_to;
using detail::load_bf16;
using detail::store_bf16;

// ---------------------------------------------------------------------------------------------------------
// Embedding: one block per token.

// Token t's id: ids[t], or where prev_rows[t] >= 0 the id the step before sampled for that row (prev_ids, still on
// the device: the overlap schedule's look-ahead steps).
__device__ __forceinline__ int32_t token_id(const int32_t* ids, const int32_t* prev_rows, const int32_t* prev_ids,
                                            int64_t t) {
  if (prev_rows != nullptr) {
    const int32_t r = prev_rows[t];
    if (r >= 0) return prev_ids[r];
  }
  return ids[t];
}

// partials (H % 16 == 0): the sums of squares of each 16-element part of the row, as the residual GEMVs leave them
// (gemv_norm_in applies the first layer's input norm from them). Threads 2 j and 2 j + 1 hold part j.
__global__ void embedding_vec8_kernel(const int32_t* ids, const int32_t* prev_rows, const int32_t* prev_ids,
                                      const bf16* table, int H, float* residual, float* partials) {
  pdl_enter();
  const int64_t t = blockIdx.x;
  const bf16* src = table + int64_t(token_id(ids, prev_rows, prev_ids, t)) * H;
  float* dst = residual + t * H;
  for (int i = threadIdx.x; i < H / 8; i += blockDim.x) {
    float v[8];
    load_bf16<8>(src + 8 * i, v);
    reinterpret_cast<float4*>(dst)[2 * i] = make_float4(v[0], v[1], v[2], v[3]);
    reinterpret_cast<float4*>(dst)[2 * i + 1] = make_float4(v[4], v[5], v[6], v[7]);
    if (partials != nullptr) {  // both threads of a part are active together (H / 8 is even)
      float sq = 0.f;
#pragma unroll
      for (int j = 0; j < 8; ++j) sq = fmaf(v[j], v[j], sq);
      sq += __shfl_xor_sync(__activemask(), sq, 1);
      if ((i & 1) == 0) partials[t * (H / 16) + i / 2] = sq;
    }
  }
}

__global__ void embedding_scalar_kernel(const int32_t* ids, const int32_t* prev_rows, const int32_t* prev_ids,
                                        const bf16* table, int H, float* residual) {
  pdl_enter();
  const int64_t t = blockIdx.x;
  const bf16* src = table + int64_t(token_id(ids, prev_rows, prev_ids, t)) * H;
  for (int i = threadIdx.x; i < H; i += blockDim.x) residual[t * H + i] = __bfloat162float(src[i]);
}

// ---------------------------------------------------------------------------------------------------------
// RMSNorm: one block per row. The vector path keeps the row in registers (NV float4 per thread) so that the
// row is read once; ADD fuses residual += x first (the new residual is written back in the same pass).

template <int NV, bool ADD>
__global__ void __launch_bounds__(1024) rmsnorm_vec4_kernel(const float* in, float* residual, const bf16* xadd,
                                                             const bf16* w, float eps, int dim, bf16* out,
                                                             float* inv_out) {
  __shared__ float scratch[33];
  const int64_t base = int64_t(blockIdx.x) * dim;
  const int nvec = dim >> 2;
  // The norm weight is never written: load it before the programmatic wait, while the kernel before may still run.
  float wv[NV][4];
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int i = threadIdx.x + k * blockDim.x;
    if (i < nvec) load_bf16<4>(w + 4 * i, wv[k]);
  }
  pdl_enter();
  const float4* src = reinterpret_cast<const float4*>((ADD ? residual : in) + base);
  float4 v[NV];
  float ss = 0.0f;
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int i = threadIdx.x + k * blockDim.x;
    if (i < nvec) {
      float4 a = src[i];
      if constexpr (ADD) {
        float b[4];
        load_bf16<4>(xadd + base + 4 * i, b);
        a.x += b[0];
        a.y += b[1];
        a.z += b[2];
        a.w += b[3];
        reinterpret_cast<float4*>(residual + base)[i] = a;
      }
      v[k] = a;
      ss += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w;
    }
  }
  const float inv = rsqrtf(detail::block_sum(ss, scratch) / float(dim) + eps);
  if (inv_out != nullptr && threadIdx.x == 0) inv_out[blockIdx.x] = inv;
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int i = threadIdx.x + k * blockDim.x;
    if (i < nvec) {
      float o[4] = {wv[k][0] * (v[k].x * inv), wv[k][1] * (v[k].y * inv), wv[k][2] * (v[k].z * inv),
                    wv[k][3] * (v[k].w * inv)};
      store_bf16<4>(out + base + 4 * i, o);
    }
  }
}

// Any dim and alignment: two passes over the row (the second mostly from L1/L2).
template <bool ADD>
__global__ void rmsnorm_scalar_kernel(const float* in, float* residual, const bf16* xadd, const bf16* w, float eps,
                                      int dim, bf16* out, float* inv_out) {
  pdl_enter();
  __shared__ float scratch[33];
  const int64_t base = int64_t(blockIdx.x) * dim;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) {
    float a;
    if constexpr (ADD) {
      a = residual[base + i] + __bfloat162float(xadd[base + i]);
      residual[base + i] = a;  // read back below by this same thread
    } else {
      a = in[base + i];
    }
    ss += a * a;
  }
  const float inv = rsqrtf(detail::block_sum(ss, scratch) / float(dim) + eps);
  if (inv_out != nullptr && threadIdx.x == 0) inv_out[blockIdx.x] = inv;
  const float* src = ADD ? residual : in;
  for (int i = threadIdx.x; i < dim; i += blockDim.x)
    out[base + i] = __float2bfloat16(__bfloat162float(w[i]) * (src[base + i] * inv));
}

template <bool ADD>
void launch_rmsnorm(const float* in, float* residual, const bf16* xadd, const bf16* w, float eps, int rows, int dim,
                    bf16* out, cudaStream_t stream, float* inv_out) {
  MS_CHECK(rows >= 0 && dim > 0, "rmsnorm: rows {} dim {}", rows, dim);
  if (rows == 0) return;
  const float* src = ADD ? residual : in;
  const bool vec = dim % 4 == 0 && aligned_to(src, 16) && aligned_to(w, 8) && aligned_to(out, 8) &&
                   (!ADD || aligned_to(xadd, 8));
  const int nvec = dim / 4;
  if (vec && nvec <= 8 * 1024) {
    // 256 threads up to 2048 vectors (dim 8192), then up to 1024 threads; NV in {1, 2, 4, 8}.
    int threads = nvec <= 256 ? int(ceil_div(nvec, 32) * 32) : nvec <= 2048 ? 256 : 1024;
    int per = int(ceil_div(nvec, threads));
    int nv = per <= 1 ? 1 : per <= 2 ? 2 : per <= 4 ? 4 : 8;
    auto kernel = nv == 1   ? rmsnorm_vec4_kernel<1, ADD>
                  : nv == 2 ? rmsnorm_vec4_kernel<2, ADD>
                  : nv == 4 ? rmsnorm_vec4_kernel<4, ADD>
                            : rmsnorm_vec4_kernel<8, ADD>;
    launch_pdl(kernel, dim3(rows), dim3(threads), 0, stream, in, residual, xadd, w, eps, dim, out, inv_out);
  } else {
    int threads = dim <= 256 ? int(ceil_div(dim, 32) * 32) : dim <= 4096 ? 256 : 1024;
    launch_pdl(rmsnorm_scalar_kernel<ADD>, dim3(rows), dim3(threads), 0, stream, in, residual, xadd, w, eps, dim,
               out, inv_out);
  }
  MS_CUDA_LAUNCH_CHECK();
}

// ---------------------------------------------------------------------------------------------------------
// SwiGLU: grid-stride over (token, group of 8 columns).

__device__ __forceinline__ float silu_mul_f(float g, float u) { return g / (1.0f + expf(-g)) * u; }

__global__ void silu_mul_vec8_kernel(const bf16* gate_up, int64_t T, int I, bf16* out) {
  pdl_enter();
  const int groups = I / 8;
  const int64_t n = T * groups;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = e / groups;
    const int c = int(e - t * groups) * 8;
    float g[8], u[8], o[8];
    load_bf16<8>(gate_up + t * 2 * I + c, g);
    load_bf16<8>(gate_up + t * 2 * I + I + c, u);
#pragma unroll
    for (int i = 0; i < 8; ++i) o[i] = silu_mul_f(g[i], u[i]);
    store_bf16<8>(out + t * I + c, o);
  }
}

__global__ void silu_mul_scalar_kernel(const bf16* gate_up, int64_t T, int I, bf16* out) {
  pdl_enter();
  const int64_t n = T * I;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = e / I;
    const int i = int(e - t * I);
    const float g = __bfloat162float(gate_up[t * 2 * I + i]), u = __bfloat162float(gate_up[t * 2 * I + I + i]);
    out[e] = __float2bfloat16(silu_mul_f(g, u));
  }
}

int grid_for(int64_t n, int threads) {
  // Enough blocks to fill an H200 several times over; the kernels stride over the rest.
  return int(std::min<int64_t>(ceil_div(n, threads), 132 * 32));
}

}  // namespace

void embedding(const int32_t* ids, const bf16* table, int T, int H, float* residual, cudaStream_t stream,
               const int32_t* prev_rows, const int32_t* prev_ids, float* partials) {
  MS_CHECK(T >= 0 && H > 0, "embedding: T {} H {}", T, H);
  MS_CHECK((prev_rows == nullptr) == (prev_ids == nullptr), "embedding: prev_rows and prev_ids go together");
  const bool vec8 = H % 8 == 0 && aligned_to(table, 16) && aligned_to(residual, 16);
  MS_CHECK(partials == nullptr || (vec8 && H % 16 == 0),
           "embedding: partial sums need H {} a multiple of 16 and 16-byte aligned rows", H);
  if (T == 0) return;
  if (vec8) {
    const int threads = H / 8 >= 256 ? 256 : int(ceil_div(H / 8, 32) * 32);
    embedding_vec8_kernel<<<T, threads, 0, stream>>>(ids, prev_rows, prev_ids, table, H, residual, partials);
  } else {
    embedding_scalar_kernel<<<T, 256, 0, stream>>>(ids, prev_rows, prev_ids, table, H, residual);
  }
  MS_CUDA_LAUNCH_CHECK();
}

void rmsnorm(const float* x, const bf16* w, float eps, int rows, int dim, bf16* out, cudaStream_t stream,
             float* inv_out) {
  launch_rmsnorm<false>(x, nullptr, nullptr, w, eps, rows, dim, out, stream, inv_out);
}

void add_rmsnorm(float* residual, const bf16* x, const bf16* w, float eps, int rows, int dim, bf16* out,
                 cudaStream_t stream, float* inv_out) {
  launch_rmsnorm<true>(nullptr, residual, x, w, eps, rows, dim, out, stream, inv_out);
}

void silu_mul(const bf16* gate_up, int T, int I, bf16* out, cudaStream_t stream) {
  MS_CHECK(T >= 0 && I > 0, "silu_mul: T {} I {}", T, I);
  if (T == 0) return;
  constexpr int threads = 256;
  if (I % 8 == 0 && aligned_to(gate_up, 16) && aligned_to(out, 16)) {
    launch_pdl(silu_mul_vec8_kernel, dim3(grid_for(int64_t(T) * (I / 8), threads)), dim3(threads), 0, stream, gate_up,
               int64_t(T), I, out);
  } else {
    launch_pdl(silu_mul_scalar_kernel, dim3(grid_for(int64_t(T) * I, threads)), dim3(threads), 0, stream, gate_up,
               int64_t(T), I, out);
  }
  MS_CUDA_LAUNCH_CHECK();
}

}  // namespace moeserve::cuda
