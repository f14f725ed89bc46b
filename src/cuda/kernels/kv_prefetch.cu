// kv_l2_prefetch (ops.h): a layer's cached keys and values pulled towards L2 ahead of its decode attention.
// Experiment, off by default (gpu_model.cpp, MOESERVE_KV_L2_PREFETCH_STRIDE). Why: at 64 decodes the attention
// reads its 75.5 MB of keys and values at ~3.4 TB/s, a ceiling of the read structure itself (short streams, one wave;
// docs/PERF.md session 30), while the q/k/v GEMM before it, a library kernel that does not release its dependents
// early, moves its 21 MB at ~2.3 TB/s: HBM has room for ~20 MB more during it. Launched on a side stream beside the
// q/k/v GEMM, this kernel issues bulk L2 prefetches of every `stride`-th page of each sequence's cached keys and
// values, so that every split of the attention finds a share of its pages in L2. Prefetches are hints: the results
// are the same with or without them.
#include "cuda/kernels/ops.h"
#include "cuda/pdl.cuh"

namespace moeserve::cuda {
namespace {

// Block s: sequence s; its threads take the sequence's prefetched pages in turn.
__global__ void kv_l2_prefetch_kernel(AttnMeta meta, const bf16* k_cache, const bf16* v_cache, unsigned page_bytes,
                                      int stride) {
  const int s = blockIdx.x;
  if (meta.new_lens[s] <= 0) return;  // padding
  const int cached = meta.kv_lens[s] - meta.new_lens[s];
  const int pages = (cached + meta.page_size - 1) / meta.page_size;
  const int32_t* table = meta.block_tables + int64_t(s) * meta.max_pages;
  for (int p = int(threadIdx.x) * stride; p < pages; p += int(blockDim.x) * stride) {
    const int64_t off = int64_t(table[p]) * page_bytes;
    prefetch_l2(reinterpret_cast<const char*>(k_cache) + off, page_bytes);
    prefetch_l2(reinterpret_cast<const char*>(v_cache) + off, page_bytes);
  }
}

}  // namespace

void kv_l2_prefetch(const bf16* k_cache, const bf16* v_cache, const AttnMeta& meta, const AttnShape& shape,
                    int stride, cudaStream_t stream) {
  const size_t page_bytes = size_t(meta.page_size) * size_t(shape.kv_heads) * size_t(shape.head_dim) * sizeof(bf16);
  if (meta.num_seqs <= 0 || stride <= 0 || page_bytes % 16 != 0 || page_bytes >= (size_t(1) << 31)) return;
  kv_l2_prefetch_kernel<<<meta.num_seqs, 32, 0, stream>>>(meta, k_cache, v_cache, unsigned(page_bytes), stride);
  MS_CUDA_LAUNCH_CHECK();
}

}  // namespace moeserve::cuda
