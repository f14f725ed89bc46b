// Greedy rows under grammar masks after the lm_head screen (lmhead_screen_masked, lmhead_screen.h), or without it
// where every row's mask allows few tokens (`picked` false: every masked row evaluated): the screen's pick
// is the argmax over every token, so where a row's mask allows it, it is the argmax over the allowed ones too; only
// the rows whose mask refuses it get the argmax over their allowed tokens, evaluated exactly (the screen picks' own
// warp dot, exact_logit) from the BF16 weight rows of those tokens alone. A structural JSON state allows a few hundred
// tokens: a few hundred weight rows read instead of the whole lm_head.
//
// Two launches: the scan (a grid of vocabulary slices; each block walks, for every refused row, the mask words of its
// slice, a warp a word at a time, a token a warp dot; its warps' best (logit, id) into the row's 64-bit key by
// atomicMax), then the write (one block: each keyed row's id, its key back to 0 for the next launch).
#include <algorithm>

#include "core/env.h"
#include "cuda/launch.h"
#include "cuda/pdl.cuh"
#include "cuda/registry.h"
#include "cuda/sampling/lmhead_screen_common.cuh"

namespace moeserve::cuda {
namespace screen_detail {
namespace {

constexpr int kMaskedWarps = 8;

// Whether row r's mask refuses its current pick (the rows whose argmax the scan replaces); with no picks (`picked`
// false), every masked row.
__device__ __forceinline__ bool pick_refused(const SampleRowParams* params, const uint32_t* masks, size_t words,
                                             const int32_t* ids, int r, bool picked) {
  const int mr = params[r].mask_row;
  if (mr < 0) return false;
  if (!picked) return true;
  const int id = __ldcg(ids + r);
  return ((__ldcg(masks + size_t(mr) * words + size_t(id >> 5)) >> (id & 31)) & 1u) == 0;
}

// A block's vocabulary slice: mask words [w0, w1) of `words`, the grid's blocks in order.
struct Slice {
  int w0, w1;
  __device__ explicit Slice(size_t words) {
    const int per = int((words + gridDim.x - 1) / gridDim.x);
    w0 = int(blockIdx.x) * per;
    w1 = min(int(words), w0 + per);
  }
};

// f(t) for every token t that mask row m allows in the block's slice, a warp a mask word at a time (the bits past the
// vocabulary never: no weight row there).
template <class F>
__device__ __forceinline__ void for_allowed(const uint32_t* m, const Slice& sl, int vocab, int warp, F&& f) {
  const int words = (vocab + 31) / 32;
  for (int wi = sl.w0 + warp; wi < sl.w1; wi += kMaskedWarps) {
    unsigned bits = __ldcg(m + wi);
    if (wi == words - 1 && vocab % 32) bits &= (1u << (vocab % 32)) - 1u;
    while (bits) {
      const int t = wi * 32 + __ffs(int(bits)) - 1;
      bits &= bits - 1;
      f(t);
    }
  }
}

__global__ void __launch_bounds__(kMaskedWarps * 32)
    masked_scan_kernel(const bf16* x, int rows, int K, const bf16* w, int vocab, const uint32_t* masks,
                       const SampleRowParams* params, const int32_t* ids, bool picked, unsigned long long* keys) {
  pdl_enter();  // ids and x come from the kernels before
  const size_t words = (size_t(vocab) + 31) / 32;
  const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31;
  const Slice sl(words);
  for (int r = 0; r < rows; ++r) {
    if (!pick_refused(params, masks, words, ids, r, picked)) continue;  // (uniform over the grid)
    const bf16* xr = x + size_t(r) * size_t(K);
    Best best{-INFINITY, INT_MAX};
    for_allowed(masks + size_t(params[r].mask_row) * words, sl, vocab, warp,
                [&](int t) { best = better(best, Best{exact_logit(xr, w + int64_t(t) * K, K, lane), t}); });
    if (lane == 0 && best.id != INT_MAX && !(best.v != best.v)) atomicMax(keys + r, best_key(best.v, best.id));
  }
}

// The masked rows' logits for the general sampler: every allowed token's exact logit, -inf elsewhere (the fill first,
// then the allowed tokens over a grid of vocabulary slices, a warp a mask word at a time).
__global__ void __launch_bounds__(256) masked_fill_kernel(float* logits, int64_t n) {
  pdl_enter();
  for (int64_t i = int64_t(blockIdx.x) * 256 + threadIdx.x; i < n; i += int64_t(gridDim.x) * 256) logits[i] = -INFINITY;
}

__global__ void __launch_bounds__(kMaskedWarps * 32)
    masked_logits_kernel(const bf16* x, int rows, int K, const bf16* w, int vocab, const uint32_t* masks,
                         const SampleRowParams* params, float* logits) {
  pdl_enter();  // x comes from the kernels before; the fill has run
  const size_t words = (size_t(vocab) + 31) / 32;
  const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31;
  const Slice sl(words);
  for (int r = 0; r < rows; ++r) {
    const int mr = params[r].mask_row;
    if (mr < 0) continue;
    const bf16* xr = x + size_t(r) * size_t(K);
    float* lr = logits + size_t(r) * size_t(vocab);
    for_allowed(masks + size_t(mr) * words, sl, vocab, warp, [&](int t) {
      const float v = exact_logit(xr, w + int64_t(t) * K, K, lane);
      if (lane == 0) lr[t] = v;
    });
  }
}

__global__ void __launch_bounds__(256)
    masked_write_kernel(int rows, const SampleRowParams* params, bool picked, int32_t* ids, unsigned long long* keys) {
  pdl_enter();
  for (int r = int(threadIdx.x); r < rows; r += 256) {
    const unsigned long long k = keys[r];
    // Key 0: kept its pick, or its mask allows no token (the constraint then refuses what it gets: without picks,
    // token 0).
    if (k == 0 && (picked || params[r].mask_row < 0)) continue;
    ids[r] = row_of_key(k);
    keys[r] = 0;
  }
}

// The scan grids' blocks: each warp walks its slice's words a token at a time (one 4 KB weight row in flight a
// warp), so more blocks keep more rows in flight; MOESERVE_MASKED_BLOCKS_PER_SM (A/B switch) sets how many an SM.
int masked_blocks(int words) {
  static const int sms = current_device_multiprocessors();  // one device per process
  static const int per_sm = int(env_int("MOESERVE_MASKED_BLOCKS_PER_SM", 8, 1, 32));
  return std::max(1, std::min(per_sm * sms, words));
}

}  // namespace

std::string masked_code(const DeviceInfo& dev) {
  for (const void* k : {reinterpret_cast<const void*>(masked_scan_kernel),
                        reinterpret_cast<const void*>(masked_write_kernel),
                        reinterpret_cast<const void*>(masked_fill_kernel),
                        reinterpret_cast<const void*>(masked_logits_kernel)})
    if (std::string why = check_kernel_present(k, dev); !why.empty()) return why;
  return "";
}

}  // namespace screen_detail

size_t lmhead_screen_masked_workspace_bytes(int max_rows) {
  return size_t(std::max(max_rows, 1)) * sizeof(unsigned long long);
}

void lmhead_screen_masked(const bf16* x, int rows, int K, const bf16* w, int vocab, const uint32_t* masks,
                          const SampleRowParams* params, int32_t* ids, void* workspace, cudaStream_t stream,
                          bool picked) {
  using namespace screen_detail;
  MS_CHECK(rows >= 1 && K % 8 == 0 && vocab > 0, "lmhead_screen_masked: {} rows of K {} over {}", rows, K, vocab);
  const int blocks = masked_blocks((vocab + 31) / 32);
  auto* keys = static_cast<unsigned long long*>(workspace);
  launch_pdl(masked_scan_kernel, dim3(unsigned(blocks)), dim3(kMaskedWarps * 32), 0, stream, x, rows, K, w, vocab,
             masks, params, static_cast<const int32_t*>(ids), picked, keys);
  launch_pdl(masked_write_kernel, dim3(1), dim3(256), 0, stream, rows, params, picked, ids, keys);
}

void lmhead_masked_logits(const bf16* x, int rows, int K, const bf16* w, int vocab, const uint32_t* masks,
                          const SampleRowParams* params, float* logits, cudaStream_t stream) {
  using namespace screen_detail;
  MS_CHECK(rows >= 1 && K % 8 == 0 && vocab > 0, "lmhead_masked_logits: {} rows of K {} over {}", rows, K, vocab);
  static const int sms = current_device_multiprocessors();  // one device per process
  const int64_t n = int64_t(rows) * vocab;
  launch_pdl(masked_fill_kernel, dim3(unsigned(std::min<int64_t>(4 * sms, (n + 255) / 256))), dim3(256), 0, stream,
             logits, n);
  launch_pdl(masked_logits_kernel, dim3(unsigned(masked_blocks((vocab + 31) / 32))), dim3(kMaskedWarps * 32), 0,
             stream, x, rows, K, w, vocab, masks, params, logits);
}

}  // namespace moeserve::cuda
