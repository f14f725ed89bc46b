#include "cuda/sampling/greedy.h"

#include <algorithm>
#include <cfloat>

#include <cooperative_groups.h>

#include "core/env.h"
#include "cuda/device.h"
#include "cuda/launch.h"
#include "cuda/pdl.cuh"
#include "cuda/sampling/greedy_state.cuh"

namespace moeserve::cuda {

namespace {

constexpr int kThreads = 512;
// Each row gets a cluster of the most blocks (8, 4, 2, else 1) that keeps the grid within kBlocksPerSm blocks an SM:
// a lone block per row leaves the GPU idle while it reads 600 KB of logits. (H200, q30b8l served step: clusters of
// 8 up to 16 rows: 702-704 us at batch 1 against 718-720 with one block; 1,737-1,746 against 1,756 at batch 8.
// Session 13, this rule against that one: batch 32 2,837 / 2,849 against 2,864 / 2,859, batch 64 -2 to -6 (the
// kernel 26.6 us against 32), batch 128 even.) MOESERVE_GREEDY_WIDE=0: clusters of 8 up to 16 rows only, one block
// a row above (A/B).
constexpr int kBlocksPerSm = 2;
constexpr int kNarrowRows = 16;

using greedy_state::State;
using greedy_state::add;
using greedy_state::merge;
using greedy_state::empty_state;

// The warp's states merged by a butterfly of shuffles (every lane ends with the warp's state).
__device__ __forceinline__ State warp_reduce(State s) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) {
    s = merge(s, greedy_state::shfl_xor(s, o));
  }
  return s;
}
// Block reduction of every thread's state (deterministic order: lanes, then warps); the block's state in the
// returned value of thread 0.
__device__ __forceinline__ State block_reduce(State s) {
  s = warp_reduce(s);
  __shared__ State warps[kThreads / 32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warps[warp] = s;
  __syncthreads();
  if (warp == 0) s = warp_reduce(lane < kThreads / 32 ? warps[lane] : empty_state());
  return s;
}

// A row's 16-byte aligned body as float4 chunks [0, n4) after its first n_head scalars (row_parts), and the scan of
// one thread's share of it: chunks begin, begin + step, ... below end, U of them in flight at a time.
struct RowParts {
  int n_head, n4;
};
__device__ __forceinline__ RowParts row_parts(const float* row, int vocab) {
  const int head = int((16 - (reinterpret_cast<uintptr_t>(row) & 15)) / 4) & 3;
  const int n_head = min(head, vocab);
  return RowParts{n_head, (vocab - n_head) / 4};
}
// The unaligned head and the tail past the last chunk (a block does them once a row, scalar loads).
__device__ __forceinline__ void scan_row_ends(State& s, const float* row, int vocab, RowParts rp) {
  for (int i = threadIdx.x; i < rp.n_head; i += kThreads) add(s, __ldcg(row + i), i);
  for (int i = rp.n_head + 4 * rp.n4 + threadIdx.x; i < vocab; i += kThreads) add(s, __ldcg(row + i), i);
}
template <int U>
__device__ __forceinline__ void scan_chunks(State& s, const float* row, RowParts rp, int begin, int end, int step) {
  const float4* v4 = reinterpret_cast<const float4*>(row + rp.n_head);
  for (int i0 = begin; i0 < end; i0 += U * step) {
    float4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int i = i0 + u * step;
      v[u] = i < end ? __ldcg(v4 + i) : make_float4(-INFINITY, -INFINITY, -INFINITY, -INFINITY);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int b = rp.n_head + 4 * (i0 + u * step);
      add(s, v[u].x, b);
      add(s, v[u].y, b + 1);
      add(s, v[u].z, b + 2);
      add(s, v[u].w, b + 3);
    }
  }
}

// One cluster of `cluster` blocks per row (launched with that cluster size; 1 for large batches): block `rank`
// takes every cluster-th run of kThreads 16-byte chunks of the row, each thread kUnroll chunks in flight at a
// time; rank 0 merges the blocks' states in rank order through distributed shared memory. A programmatic
// dependent of lm_head: the logits are read only after the wait, through L2.
constexpr int kUnroll = 8;
__global__ void __launch_bounds__(kThreads) greedy_kernel(const float* logits, int vocab, int cluster,
                                                          int32_t* __restrict__ out_ids, float* __restrict__ out_lp) {
  namespace cg = cooperative_groups;
  const int rank = cluster > 1 ? int(cg::this_cluster().block_rank()) : 0;
  const int row_idx = int(blockIdx.x) / cluster;
  const float* row = logits + int64_t(row_idx) * vocab;
  pdl_enter();
  State s = empty_state();
  // Aligned 16-byte loads over the bulk of the row, scalar loads for the ends (rank 0).
  const RowParts rp = row_parts(row, vocab);
  if (rank == 0) scan_row_ends(s, row, vocab, rp);
  scan_chunks<kUnroll>(s, row, rp, rank * kThreads + int(threadIdx.x), rp.n4, cluster * kThreads);
  s = block_reduce(s);
  __shared__ State block_state;
  if (threadIdx.x == 0) block_state = s;
  if (cluster > 1) {
    cg::cluster_group cl = cg::this_cluster();
    cl.sync();  // every block's state is in its shared memory
    if (rank == 0 && threadIdx.x == 0) {
      s = block_state;
      for (int r = 1; r < cluster; ++r) s = merge(s, *cl.map_shared_rank(&block_state, unsigned(r)));
    }
    cl.sync();  // the peers' shared memory stays until rank 0 has read it
  }
  if (rank == 0 && threadIdx.x == 0) {
    out_ids[row_idx] = s.id;
    if (out_lp) out_lp[row_idx] = -logf(s.sum);  // logit(argmax) - max - log(sum) with logit == max
  }
}

// ---- The grid form (sample_greedy with a workspace): gridDim.x blocks a row (grid_blocks_per_row), each takes a
// contiguous slice of it, leaves its state in the workspace, and the row's last block merges the states in index
// order (a fixed tree: deterministic) and resets the row's counter. The cluster form keeps each row on at most 8
// SMs, whose reads of 600 KB of logits and cluster barriers cost ~9.5 us after lm_head at batch 1, and 2 SMs a row
// at batch 64, where the kernel takes 27-32 us for 39 MB of logits (H200 traces, sessions 13 and 16).
constexpr int kGridBlocksMax = 64;   // blocks a row
constexpr int kGridStates = 256;     // blocks in all: rows x blocks a row
constexpr int kGridRowsMax = 128;    // with 2 blocks a row
struct GridWorkspace {
  State states[kGridStates];
  int count[kGridRowsMax];
};
// Blocks a row: 64 up to 4 rows, then as many as keep the grid at kGridStates blocks (~2 an SM), at least 2.
int grid_blocks_per_row(int rows) { return std::clamp(kGridStates / std::max(rows, 1), 2, kGridBlocksMax); }

__global__ void __launch_bounds__(kThreads) greedy_grid_kernel(const float* logits, int vocab,
                                                               int32_t* __restrict__ out_ids,
                                                               float* __restrict__ out_lp, GridWorkspace* ws) {
  const int row_idx = int(blockIdx.y), b = int(blockIdx.x), nb = int(gridDim.x);
  const float* row = logits + int64_t(row_idx) * vocab;
  pdl_enter();
  State s = empty_state();
  const RowParts rp = row_parts(row, vocab);
  if (b == 0) scan_row_ends(s, row, vocab, rp);
  const int per = (rp.n4 + nb - 1) / nb, i0 = b * per, i1 = min(rp.n4, i0 + per);
  if (per <= 2 * kThreads)
    scan_chunks<2>(s, row, rp, i0 + int(threadIdx.x), i1, kThreads);  // one or two 16-byte loads a thread
  else
    scan_chunks<kUnroll>(s, row, rp, i0 + int(threadIdx.x), i1, kThreads);  // few blocks a row: longer slices
  s = block_reduce(s);
  __shared__ bool last;
  if (threadIdx.x == 0) {
    ws->states[row_idx * nb + b] = s;
    __threadfence();
    last = atomicAdd(&ws->count[row_idx], 1) == nb - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  State m = empty_state();
  if (int(threadIdx.x) < nb) {
    const State* st = ws->states + row_idx * nb + threadIdx.x;
    m = State{__ldcg(&st->max), __ldcg(&st->id), __ldcg(&st->sum)};
  }
  m = block_reduce(m);
  if (threadIdx.x == 0) {
    ws->count[row_idx] = 0;  // for the next launch
    out_ids[row_idx] = m.id;
    if (out_lp) out_lp[row_idx] = -logf(m.sum);
  }
}

}  // namespace

size_t greedy_workspace_bytes() { return sizeof(GridWorkspace); }

void sample_greedy(const float* logits, int rows, int vocab, int32_t* out_ids, float* out_logprobs,
                   cudaStream_t stream, void* workspace) {
  MS_CHECK(vocab > 0, "vocabulary of {} tokens", vocab);
  if (rows <= 0) return;
  // MOESERVE_GREEDY_GRID: 2 (the default) the grid form up to kGridRowsMax rows, 1 up to 4, 0 never. Served q30b8l
  // decode step, H200, session 18 (same call), with the deeper GEMV rings: bs 1 -4 us, bs 2 -3, bs 64 -5 to -7.
  static const int grid_mode = int(env_int("MOESERVE_GREEDY_GRID", 2, 0, 2));
  const int grid_rows = grid_mode == 1 ? 4 : grid_mode == 2 ? kGridRowsMax : 0;
  if (const int nb = grid_blocks_per_row(rows); workspace != nullptr && rows <= grid_rows && vocab >= 4 * nb) {
    launch_pdl(greedy_grid_kernel, dim3(unsigned(nb), unsigned(rows)), dim3(kThreads), 0, stream, logits, vocab,
               out_ids, out_logprobs, static_cast<GridWorkspace*>(workspace));
    return;
  }
  static const bool wide = env_flag("MOESERVE_GREEDY_WIDE", true);
  int cluster = 1;
  if (wide) {
    static const int sms = current_device_multiprocessors();  // one device per process
    for (int c : {8, 4, 2})
      if (int64_t(rows) * c <= int64_t(kBlocksPerSm) * sms) {
        cluster = c;
        break;
      }
  } else if (rows <= kNarrowRows) {
    cluster = 8;
  }
  MS_CHECK(int64_t(rows) * cluster <= INT32_MAX, "sample_greedy: {} rows are too many for one launch", rows);
  if (cluster > 1)
    launch_pdl_cluster(greedy_kernel, dim3(unsigned(rows * cluster)), dim3(kThreads), 0, stream, unsigned(cluster),
                       logits, vocab, cluster, out_ids, out_logprobs);
  else
    launch_pdl(greedy_kernel, dim3(unsigned(rows)), dim3(kThreads), 0, stream, logits, vocab, cluster, out_ids,
               out_logprobs);
}

}  // namespace moeserve::cuda
