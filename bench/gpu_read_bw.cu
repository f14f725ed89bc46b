// The GPU's read bandwidth from HBM, the floor of a decode step (which reads weights and writes almost nothing):
// docs/PERF.md's floors use the device-to-device copy (bytes read + written over the time, ~4.3 TB/s on the H200);
// a read-only stream may run faster or slower than that. Three ways of streaming a buffer much larger than L2, each
// at several grid sizes, best of N runs, beside the copy:
//   ld      every thread keeps U independent 16-byte loads in flight (ld.global.nc.L1::no_allocate), grid-stride;
//   cpasync each warp streams 16-byte cp.async.cg copies through a ring of S stages in shared memory (the GEMVs'
//           and the MoE tiles' way);
//   bulk    one thread a block issues 1-D bulk copies (cp.async.bulk, completion on an mbarrier) of C bytes into a
//           ring of S stages (the persistent MoE prototype's way, session 15).
//   tma     the warp-specialized MoE GEMMs' weight pattern: the buffer as a [rows, K] bf16 matrix, units of 128 rows x
//           all K walked persistently (unit blockIdx.x, + gridDim.x, ...), each unit's 64-column slices by 2-D TMA
//           boxes (64 columns x 64 or 128 rows, 128-byte swizzle) into a ring of S slices; G slices of a unit share
//           one barrier and are issued back to back (G = 1 is the GEMMs' pattern; G > 1 asks whether longer runs of
//           one row, 128 G bytes, read faster); R = 1 starts each unit's slice walk at slice (unit mod slices) and
//           wraps (the CTAs of a wave then read different columns at a time instead of the same 128-byte column of
//           rows K * 2 bytes apart: on the H200 that is the slower one, 3.46 against 4.24 TB/s, session 24); one to
//           four blocks an SM.
//   tiled   the same units and rings over the weights stored tile-contiguous ([unit][slice][128 rows x 64 columns]:
//           each 16 KB slice one contiguous run), as a weight layout prepared at load time would store them: the
//           "tiled bulk" rows read a slice by one 1-D bulk copy (read_tma_kernel with R = 2), the "cpasync unit" rows
//           stream the units through a 16-byte cp.async ring of S slices (128 threads a block, the decode MoE
//           tiles' producer form) from either layout. Session 39: the
//           tiled layout reads 4.55-4.59 TB/s where the row-major one reads 4.41-4.48 (K 2,048 / 768, 2 x 4 stages);
//   ld      the row-major layout with padded row pitches (ld = K + 8 .. K + 256): session 39, none faster than ld = K
//           (misaligned pitches much slower: a 128-byte row piece then spans two lines).
//   kv      the decode attention's K / V loader (read_kv_kernel below), with the cache token- or head-major and with
//           persistent blocks; --kv-only runs these rows alone.
//   gpu_read_bw [--mib 2048] [--reps 10] [--kv-only] [--bulk-only]  (--bulk-only: the bulk rows alone, 4-32 KB copies)
// Prints one line a configuration: method, blocks, bytes in flight a block, TB/s. A benchmark, not a test: the
// figures go to docs/PERF.md.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>

#include "core/error.h"
#include "cuda/common.h"
#include "cuda/device.h"
#include "cuda/moe/moe_kernel_params.h"
#include "cuda/moe/moe_ptx.cuh"
#include "cuda/tma.h"
#include "bench_ptx.cuh"
#include "gpu_timer.h"

namespace {

using namespace moe_ptx;
using bench_ptx::arrive_expect_tx;
using bench_ptx::bulk_copy;
using bench_ptx::init_ring_barriers;
using bench_ptx::wait_ring_barrier;

constexpr int kThreads = 256;

__device__ __forceinline__ uint4 load_stream(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// Each thread: U loads of 16 bytes in flight, then the next U; the xor of everything is stored only if it equals a
// value no buffer of ours produces, so the loads cannot be dropped and nothing is written.
template <int U>
__global__ void __launch_bounds__(kThreads) read_ld_kernel(const uint4* src, size_t n16, unsigned* sink) {
  const size_t stride = size_t(gridDim.x) * kThreads * U;
  unsigned acc = 0;
  for (size_t base = size_t(blockIdx.x) * kThreads * U + threadIdx.x; base < n16; base += stride) {
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const size_t i = base + size_t(u) * kThreads;
      v[u] = i < n16 ? load_stream(src + i) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  if (acc == 0x9e3779b9u) sink[blockIdx.x] = acc;
}

// Each warp: a ring of S stages of 32 x 16 bytes x 4 (2 KB, the GEMV ring's slice) in shared memory; each stage is
// refilled as soon as the wait says it landed (nothing reads it: the copies are the measurement).
template <int S>
__global__ void __launch_bounds__(kThreads) read_cpasync_kernel(const char* src, size_t bytes, unsigned* sink) {
  extern __shared__ __align__(16) char ring[];
  constexpr int kSlice = 32 * 16 * 4;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = kThreads / 32;
  char* my = ring + size_t(warp) * S * kSlice;
  const size_t slices = bytes / kSlice, step = size_t(gridDim.x) * warps;
  size_t s = size_t(blockIdx.x) * warps + warp;
  auto issue = [&](int stage, size_t slice) {
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      const int off = (lane + 32 * m) * 16;
      const bool ok = slice < slices;
      cp_async16(my + stage * kSlice + off, ok ? src + slice * kSlice + off : src, ok);
    }
    cp_async_commit();
  };
#pragma unroll
  for (int i = 0; i < S; ++i) issue(i, s + size_t(i) * step);
  for (int i = 0; s < slices; ++i, s += step) {
    cp_async_wait<S - 1>();
    issue(i % S, s + size_t(S) * step);
  }
  cp_async_wait<0>();
  if (reinterpret_cast<const unsigned*>(my)[lane] == 0x9e3779b9u) sink[blockIdx.x] = 1;
}

// The decode attention's K / V pattern (read_kv_kernel, read_kv_bulk_kernel): pages of 16 slots, 256-byte head rows
// (head_dim 128, bf16), 64-key tiles of K and V through a 3-stage ring.
constexpr int kKvPage = 16, kKvRow = 256, kKvTile = 64, kKvStages = 3;
// Byte offset of slot `off` of page `page`, head h of H: token-major ([page][slot][H][128], the engine's cache) or
// head-major ([page][H][slot][128]).
template <bool HEAD_MAJOR>
__device__ __forceinline__ long long kv_row_offset(long long page, int off, int h, int H) {
  return HEAD_MAJOR ? ((page * H + h) * kKvPage + off) * kKvRow : ((page * kKvPage + off) * H + h) * kKvRow;
}

// The decode attention's K / V reads (attention_decode_gqa.cuh's loader): item i = (sequence i / H, kv head i % H)
// is its head's rows of the sequence's `ctx` keys, read 64 keys a tile, K and V, through a 3-stage cp.async ring
// (128 threads, 16-byte copies), with the cache in pages of 16 slots either token-major ([page][slot][H][128] bf16,
// the engine's layout: a head's row is 256 bytes every H x 256) or head-major ([page][H][slot][128]: 4 KB runs).
// One block an item (the attention's grid: gridDim.x == items), or fewer persistent blocks walking items
// blockIdx.x, + gridDim.x, ... with the ring running on across them (no drain between items).
template <bool HEAD_MAJOR>
__global__ void __launch_bounds__(128) read_kv_kernel(const char* k, const char* v, int ctx, int H, int items,
                                                      unsigned* sink) {
  extern __shared__ __align__(16) char ring[];  // [stages][K, V][keys][row bytes]
  constexpr int P = kKvPage, ROW = kKvRow, TILE = kKvTile, STAGES = kKvStages;
  const int pages = (ctx + P - 1) / P, tiles_per_item = (ctx + TILE - 1) / TILE;
  const int my_items = items > int(blockIdx.x) ? (items - int(blockIdx.x) + int(gridDim.x) - 1) / int(gridDim.x) : 0;
  const int n_tiles = my_items * tiles_per_item;
  const int ch = threadIdx.x % 16, rg = threadIdx.x / 16;
  auto issue = [&](int t, int stage) {
    const int item = int(blockIdx.x) + (t / tiles_per_item) * int(gridDim.x), tt = t % tiles_per_item;
    const int seq = item / H, h = item % H;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int r = rg * 8 + j, key = tt * TILE + r;
      const bool ok = t < n_tiles && key < ctx;
      const long long o = kv_row_offset<HEAD_MAJOR>((long long)seq * pages + key / P, key % P, h, H);
      cp_async16(ring + ((stage * 2 + 0) * TILE + r) * ROW + ch * 16, ok ? k + o + ch * 16 : k, ok);
      cp_async16(ring + ((stage * 2 + 1) * TILE + r) * ROW + ch * 16, ok ? v + o + ch * 16 : v, ok);
    }
    cp_async_commit();
  };
  for (int i = 0; i < STAGES - 1; ++i) issue(i, i);
  unsigned acc = 0;
  for (int t = 0; t < n_tiles; ++t) {
    issue(t + STAGES - 1, (t + STAGES - 1) % STAGES);
    cp_async_wait<STAGES - 1>();
    __syncthreads();
    acc ^= reinterpret_cast<const unsigned*>(ring + size_t(t % STAGES) * 2 * TILE * ROW)[threadIdx.x];
    __syncthreads();
  }
  cp_async_wait<0>();
  if (acc == 0x9e3779b9u) sink[blockIdx.x] = acc;
}

// Shared memory of read_kv_bulk_kernel: token-major rows padded to 272 bytes.
__host__ __device__ constexpr size_t kv_bulk_smem(bool head_major) {
  return size_t(kKvStages) * 2 * kKvTile * (head_major ? kKvRow : kKvRow + 16);
}

// The same K / V reads by bulk copies (the copy engine) on one warp a block, a 3-stage ring of 64-key tiles whose
// stage's mbarrier expects the tile's 32 KB: token-major, each key row (256 bytes) one copy into a row padded to 272
// bytes (the padding an ldmatrix of 8 rows needs to stay conflict-free); head-major, each page's 16 rows (4 KB) one
// copy. A block an item.
template <bool HEAD_MAJOR>
__global__ void __launch_bounds__(32) read_kv_bulk_kernel(const char* k, const char* v, int ctx, int H,
                                                          unsigned* sink) {
  extern __shared__ __align__(128) char ring[];
  __shared__ __align__(8) unsigned long long bar[4];
  constexpr int P = kKvPage, ROW = kKvRow, TILE = kKvTile, STAGES = kKvStages;
  constexpr int STAGE_BYTES = int(kv_bulk_smem(HEAD_MAJOR) / STAGES), PAD = STAGE_BYTES / (2 * TILE);
  const int lane = threadIdx.x;
  const int seq = blockIdx.x / H, h = blockIdx.x % H;
  const int pages = (ctx + P - 1) / P, n_tiles = (ctx + TILE - 1) / TILE;
  if (lane == 0) init_ring_barriers(bar, STAGES);
  __syncwarp();
  auto issue = [&](int t, int stage) {
    if (t >= n_tiles) return;
    const int keys = min(TILE, ctx - t * TILE);
    const unsigned b = smem_addr(&bar[stage]);
    if (lane == 0) arrive_expect_tx(b, 2u * keys * ROW);
    __syncwarp();
    char* dk = ring + size_t(stage) * STAGE_BYTES;
    char* dv = dk + TILE * PAD;
    if constexpr (HEAD_MAJOR) {  // lanes 0-3: K pages, 4-7: V pages (whole pages: ctx a multiple of 16 here)
      if (lane < 8 && (lane % 4) * P < keys) {
        const long long o = kv_row_offset<true>((long long)seq * pages + t * (TILE / P) + lane % 4, 0, h, H);
        bulk_copy((lane < 4 ? dk : dv) + (lane % 4) * P * ROW, (lane < 4 ? k : v) + o, P * ROW, b);
      }
    } else {
      for (int r = lane; r < keys; r += 32) {
        const int key = t * TILE + r;
        const long long o = kv_row_offset<false>((long long)seq * pages + key / P, key % P, h, H);
        bulk_copy(dk + r * PAD, k + o, ROW, b);
        bulk_copy(dv + r * PAD, v + o, ROW, b);
      }
    }
  };
  for (int i = 0; i < STAGES; ++i) issue(i, i);
  unsigned acc = 0, phase = 0;
  for (int t = 0; t < n_tiles; ++t) {
    const int stage = t % STAGES;
    wait_ring_barrier(&bar[stage], (phase >> stage) & 1u);
    phase ^= 1u << stage;
    acc ^= reinterpret_cast<const unsigned*>(ring + size_t(stage) * STAGE_BYTES)[lane];
    __syncwarp();
    issue(t + STAGES, stage);
  }
  if (acc == 0x9e3779b9u) sink[blockIdx.x] = acc;
}

// One thread a block: S stages of C bytes, each a 1-D bulk copy completing on the stage's mbarrier.
__global__ void __launch_bounds__(32) read_bulk_kernel(const char* src, size_t bytes, int S, unsigned C,
                                                       unsigned* sink) {
  extern __shared__ __align__(128) char ring[];
  __shared__ __align__(8) unsigned long long bar[32];
  if (threadIdx.x != 0) return;
  init_ring_barriers(bar, S);
  const size_t chunks = bytes / C, step = gridDim.x;
  auto issue = [&](int stage, size_t chunk) {
    if (chunk >= chunks) return;
    const unsigned b = smem_addr(&bar[stage]);
    arrive_expect_tx(b, C);
    bulk_copy(ring + size_t(stage) * C, src + chunk * C, C, b);
  };
  size_t c = blockIdx.x;
  for (int i = 0; i < S; ++i) issue(i, c + size_t(i) * step);
  unsigned phase = 0;
  for (int i = 0; c < chunks; ++i, c += step) {
    const int stage = i % S;
    wait_ring_barrier(&bar[stage], (phase >> stage) & 1u);
    phase ^= 1u << stage;
    issue(stage, c + size_t(S) * step);
  }
  if (reinterpret_cast<const unsigned*>(ring)[0] == 0x9e3779b9u) sink[blockIdx.x] = 1;
}

// One thread a block: the ring holds S / G stages of G slices (128 rows x 64 columns each, 16 KB); a stage's G
// slices are loaded as G x (128 / BOX_ROWS) boxes completing on its mbarrier.
__global__ void __launch_bounds__(32) read_tma_kernel(const __grid_constant__ moe_kernels::TmaDesc map, int units, int K,
                                                      int box_rows, int S, int G, int R, unsigned* sink,
                                                      const char* tiled) {
  extern __shared__ __align__(1024) char tring[];
  __shared__ __align__(8) unsigned long long bar[32];
  if (threadIdx.x != 0) return;
  constexpr int kUnitRows = 128;
  constexpr unsigned kSliceBytes = kUnitRows * 64 * 2;
  const int stages = S / G, kt_count = K / 64;
  const int groups = kt_count / G;  // stages a unit
  init_ring_barriers(bar, stages);
  // Stage sequence number q: unit blockIdx.x + (q / groups) gridDim.x, slices (q % groups) G .. + G - 1.
  const long long my_units = units > int(blockIdx.x) ? (units - 1 - int(blockIdx.x)) / int(gridDim.x) + 1 : 0;
  const long long total = my_units * groups;
  auto issue = [&](long long q) {
    if (q >= total) return;
    const int stage = int(q % stages);
    const int unit = int(blockIdx.x) + int(q / groups) * int(gridDim.x);
    int kt0 = int(q % groups) * G;
    if (R == 1) kt0 = (kt0 + (unit % groups) * G) % kt_count;
    const unsigned b = smem_addr(&bar[stage]);
    const unsigned dst = smem_addr(tring + size_t(stage) * G * kSliceBytes);
    arrive_expect_tx(b, G * kSliceBytes);
    if (R == 2) {  // tile-contiguous layout: slice kt of the unit is the 16 KB at (unit K / 64 + kt) x 16 KB
      for (int g = 0; g < G; ++g)
        bulk_copy(tring + size_t(stage) * G * kSliceBytes + size_t(g) * kSliceBytes,
                  tiled + (size_t(unit) * kt_count + size_t(kt0 + g)) * kSliceBytes, kSliceBytes, b);
      return;
    }
    for (int g = 0; g < G; ++g)
      for (int r = 0; r < kUnitRows; r += box_rows)
        asm volatile(
            "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
            ::"r"(dst + unsigned(g * kSliceBytes + r * 128)), "l"(&map), "r"((kt0 + g) * 64), "r"(unit * kUnitRows + r),
            "r"(b)
            : "memory");
  };
  for (int i = 0; i < stages; ++i) issue(i);
  for (long long q = 0; q < total; ++q) {
    wait_ring_barrier(&bar[q % stages], unsigned(q / stages) & 1u);
    issue(q + stages);
  }
  if (reinterpret_cast<const unsigned*>(tring)[0] == 0x9e3779b9u) sink[blockIdx.x] = 1;
}

// 128 threads a block walking units of 128 rows x K persistently (unit blockIdx.x, + gridDim.x, ...), each unit's
// 64-column slices (16 KB) by 16-byte cp.async into a ring of S slices, 8 copies a thread a slice: row idx / 8, chunk
// idx % 8 of the slice from the [rows, K] matrix (TILED false, rows `ld` elements apart: K when 0) or from the
// slice's contiguous 16 KB (TILED true).
template <bool TILED, int S>
__global__ void __launch_bounds__(128) read_unit_cpasync_kernel(const char* src, int units, int K, unsigned* sink,
                                                                int ld = 0) {
  extern __shared__ __align__(128) char uring[];
  constexpr int kSliceBytes = 128 * 64 * 2;
  const int kt_count = K / 64;
  const long long my_units = units > int(blockIdx.x) ? (units - 1 - int(blockIdx.x)) / int(gridDim.x) + 1 : 0;
  const long long total = my_units * kt_count;
  auto issue = [&](long long q) {
    const bool ok = q < total;
    const int unit = int(blockIdx.x) + int((ok ? q : 0) / kt_count) * int(gridDim.x), kt = int((ok ? q : 0) % kt_count);
    char* dst = uring + size_t(q % S) * kSliceBytes;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int idx = int(threadIdx.x) + 128 * i, r = idx / 8, ch = idx % 8;
      const char* g = TILED ? src + (size_t(unit) * kt_count + kt) * kSliceBytes + size_t(idx) * 16
                            : src + (size_t(unit) * 128 + r) * size_t(ld > 0 ? ld : K) * 2 + size_t(kt) * 128 + ch * 16;
      cp_async16(dst + idx * 16, ok ? g : src, ok);
    }
    cp_async_commit();
  };
  for (int i = 0; i < S - 1; ++i) issue(i);
  unsigned acc = 0;
  for (long long q = 0; q < total; ++q) {
    issue(q + S - 1);
    cp_async_wait<S - 1>();
    __syncthreads();  // everyone's copies of slice q landed; slice q - 1's stage may be refilled next iteration
    acc ^= reinterpret_cast<const unsigned*>(uring + size_t(q % S) * kSliceBytes)[threadIdx.x];
    __syncthreads();
  }
  if (acc == 0x9e3779b9u) sink[blockIdx.x] = acc;
}

using UnitKernel = void (*)(const char*, int, int, unsigned*, int);
// read_unit_cpasync_kernel of a layout and ring depth chosen at run time (S: 4, 6 or 8).
UnitKernel unit_cpasync_kernel(bool tiled, int S) {
  static constexpr UnitKernel kernels[2][3] = {
      {read_unit_cpasync_kernel<false, 4>, read_unit_cpasync_kernel<false, 6>, read_unit_cpasync_kernel<false, 8>},
      {read_unit_cpasync_kernel<true, 4>, read_unit_cpasync_kernel<true, 6>, read_unit_cpasync_kernel<true, 8>}};
  return kernels[tiled ? 1 : 0][S == 4 ? 0 : S == 6 ? 1 : 2];
}

}  // namespace

// A kernel's dynamic shared-memory ceiling raised to `bytes` (cuda/device.h), or a clear error.
static void smem_ceiling(const void* kernel, size_t bytes) {
  MS_CHECK(moeserve::cuda::raise_dynamic_smem(kernel, bytes), "the device refuses {} bytes of shared memory", bytes);
}

static int run(int argc, char** argv) {
  size_t mib = 2048;
  int reps = 10;
  bool kv_only = false, bulk_only = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--mib" && i + 1 < argc) mib = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--reps" && i + 1 < argc) reps = std::atoi(argv[++i]);
    else if (a == "--kv-only") kv_only = true;
    else if (a == "--bulk-only") bulk_only = true;
    else {
      std::fprintf(stderr, "usage: gpu_read_bw [--mib 2048] [--reps 10] [--kv-only] [--bulk-only]\n");
      return 2;
    }
  }
  if (mib < 64 || reps < 1) {
    std::fprintf(stderr, "--mib must be at least 64 (several times L2) and --reps at least 1\n");
    return 2;
  }
  int dev = 0, sms = 0;
  MS_CUDA_CHECK(cudaGetDevice(&dev));
  MS_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  cudaDeviceProp prop{};
  MS_CUDA_CHECK(cudaGetDeviceProperties(&prop, dev));
  const size_t bytes = mib << 20;
  struct Buffers {  // freed on every return
    char *src = nullptr, *dst = nullptr;
    unsigned* sink = nullptr;
    ~Buffers() { cudaFree(src), cudaFree(dst), cudaFree(sink); }
  } buf;
  MS_CUDA_CHECK(cudaMalloc(&buf.src, bytes));
  MS_CUDA_CHECK(cudaMalloc(&buf.dst, bytes));
  MS_CUDA_CHECK(cudaMalloc(&buf.sink, size_t(sms) * 64 * sizeof(unsigned)));
  char *src = buf.src, *dst = buf.dst;
  unsigned* sink = buf.sink;
  MS_CUDA_CHECK(cudaMemset(src, 0x3c, bytes));
  std::printf("%s, %d SMs, %zu MiB buffer, best of %d\n", prop.name, sms, mib, reps);
  std::printf("%-24s %8s %14s %8s\n", "method", "blocks", "bytes/block", "TB/s");
  moeserve::bench::GpuTimer t;
  auto row = [&](const char* m, int blocks, size_t inflight, double s, double moved) {
    std::printf("%-24s %8d %14zu %8.3f\n", m, blocks, inflight, moved / s * 1e-12);
  };
  // The decode attention's K / V pattern at q30b shapes (4 kv heads, context 576: 512 prompt + 64 generated), 64 and
  // 128 sequences: both cache layouts with a block an item, then the token-major cache with 1 or 2 persistent blocks
  // an SM; each run reads the next region of the buffer, so that none starts in L2.
  for (const int seqs : {64, 128}) {
    constexpr int H = 4, ctx = 576;
    const size_t half = size_t(seqs) * ((ctx + kKvPage - 1) / kKvPage) * kKvPage * H * kKvRow, region = 2 * half;
    const int regions = int(bytes / region), items = seqs * H;
    if (regions < 2) continue;
    // One row: `launch(k, v)` timed over successive regions.
    auto kv_row = [&](const std::string& name, int blocks, size_t smem, auto launch) {
      int r = 0;
      const double s = t.best(reps, [&] {
        const char* base = src + size_t(r++ % regions) * region;
        launch(base, base + half);
      });
      row((name + " bs" + std::to_string(seqs)).c_str(), blocks, smem, s, double(region));
    };
    const size_t smem = size_t(kKvStages) * 2 * kKvTile * kKvRow;
    smem_ceiling(reinterpret_cast<const void*>(read_kv_kernel<false>), smem);
    smem_ceiling(reinterpret_cast<const void*>(read_kv_kernel<true>), smem);
    for (const int form : {0, 1, 2, 3}) {  // token-major, head-major, persistent 1 / SM, persistent 2 / SM
      const int blocks = form <= 1 ? items : std::min(items, (form - 1) * sms);
      const char* name = form == 0 ? "kv token-major" : form == 1 ? "kv head-major" : form == 2 ? "kv persistent x1"
                                                                                               : "kv persistent x2";
      kv_row(name, blocks, smem, [&](const char* k, const char* v) {
        if (form == 1)
          read_kv_kernel<true><<<blocks, 128, smem>>>(k, v, ctx, H, items, sink);
        else
          read_kv_kernel<false><<<blocks, 128, smem>>>(k, v, ctx, H, items, sink);
      });
    }
    for (const bool head_major : {false, true}) {  // the copy engine's form
      const size_t bsmem = kv_bulk_smem(head_major);
      smem_ceiling(reinterpret_cast<const void*>(head_major ? read_kv_bulk_kernel<true> : read_kv_bulk_kernel<false>),
                   bsmem);
      kv_row(head_major ? "kv bulk head-major" : "kv bulk token-major", items, bsmem,
             [&](const char* k, const char* v) {
               if (head_major)
                 read_kv_bulk_kernel<true><<<items, 32, bsmem>>>(k, v, ctx, H, sink);
               else
                 read_kv_bulk_kernel<false><<<items, 32, bsmem>>>(k, v, ctx, H, sink);
             });
    }
  }
  if (kv_only) return 0;
  // The copy, as docs/PERF.md's floor measures it (read + write).
  row("copy", 0, 0, t.best(reps, [&] { MS_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice)); }),
      2.0 * double(bytes));
  if (!bulk_only) {
    const size_t n16 = bytes / 16;
    for (int per_sm : {1, 2, 4, 8}) {
      const int blocks = per_sm * sms;
      row("ld x4", blocks, size_t(kThreads) * 4 * 16,
          t.best(reps, [&] { read_ld_kernel<4><<<blocks, kThreads>>>(reinterpret_cast<const uint4*>(src), n16, sink); }),
          double(bytes));
      row("ld x8", blocks, size_t(kThreads) * 8 * 16,
          t.best(reps, [&] { read_ld_kernel<8><<<blocks, kThreads>>>(reinterpret_cast<const uint4*>(src), n16, sink); }),
          double(bytes));
    }
    constexpr int kSlice = 32 * 16 * 4;
    for (int per_sm : {1, 2, 3}) {
      const int blocks = per_sm * sms;
      const size_t smem4 = size_t(kThreads / 32) * 4 * kSlice, smem8 = size_t(kThreads / 32) * 8 * kSlice;
      smem_ceiling(reinterpret_cast<const void*>(read_cpasync_kernel<4>), smem4);
      smem_ceiling(reinterpret_cast<const void*>(read_cpasync_kernel<8>), smem8);
      row("cpasync4", blocks, smem4,
          t.best(reps, [&] { read_cpasync_kernel<4><<<blocks, kThreads, smem4>>>(src, bytes, sink); }), double(bytes));
      if (per_sm * smem8 <= size_t(prop.sharedMemPerMultiprocessor) - 2048)
        row("cpasync8", blocks, smem8,
            t.best(reps, [&] { read_cpasync_kernel<8><<<blocks, kThreads, smem8>>>(src, bytes, sink); }), double(bytes));
    }
  }
  for (int per_sm : {1, 2, 4}) {
    for (unsigned chunk : {4u << 10, 8u << 10, 16u << 10, 32u << 10}) {
      for (int stages : {2, 4, 6, 8, 16, 24}) {
        const size_t smem = size_t(stages) * chunk;
        if (per_sm * (smem + 1024) > size_t(prop.sharedMemPerMultiprocessor) - 1024 || smem > (227u << 10)) continue;
        const int blocks = per_sm * sms;
        smem_ceiling(reinterpret_cast<const void*>(read_bulk_kernel), smem);
        char name[16];
        std::snprintf(name, sizeof(name), "bulk%uk", chunk >> 10);
        row(name, blocks, smem,
            t.best(reps, [&] { read_bulk_kernel<<<blocks, 32, smem>>>(src, bytes, stages, chunk, sink); }),
            double(bytes));
      }
    }
  }
  if (bulk_only) return 0;
  // The MoE GEMMs' weight pattern (tma): the gate/up weights' K (2,048) and the down weights' (768).
  for (int K : {2048, 768}) {
    const int64_t rows = int64_t(bytes / (size_t(K) * 2)) / 128 * 128;
    const int units = int(rows / 128);
    const double moved = double(rows) * K * 2;
    for (int box_rows : {64, 128}) {
      moe_kernels::TmaDesc map;
      moeserve::cuda::encode_bf16_tma_2d(&map, src, rows, K, box_rows);
      for (int per_sm : {1, 2, 3, 4}) {
        for (int S : {2, 3, 4, 8, 12}) {
          for (int G : {1, 2}) {
            for (int R : {0, 1}) {
              if (S % G != 0 || (K / 64) % G != 0 || S / G < 2) continue;
              if ((per_sm > 2 || S < 4) && (G > 1 || R > 0)) continue;  // the many-CTA rows: the GEMMs' pattern only
              const size_t smem = size_t(S) * 128 * 64 * 2 + 1024;
              if (per_sm * (smem + 1024) > size_t(prop.sharedMemPerMultiprocessor) || (per_sm == 1 && S < 8)) continue;
              smem_ceiling(reinterpret_cast<const void*>(read_tma_kernel), smem);
              char name[40];
              std::snprintf(name, sizeof(name), "tma K%d b%d S%d G%d R%d", K, box_rows, S, G, R);
              row(name, per_sm * sms, smem - 1024, t.best(reps, [&] {
                    read_tma_kernel<<<per_sm * sms, 32, smem>>>(map, units, K, box_rows, S, G, R, sink, src);
                  }), moved);
            }
          }
        }
      }
    }
    // The tile-contiguous layout (the same bytes read as units of contiguous 16 KB slices), same call: 1-D bulk
    // copies in the TMA rows' ring (R2), then both layouts by the cp.async ring of the decode tiles' producers.
    moe_kernels::TmaDesc unused_map;  // R2 reads `src` by 1-D copies; the kernel's descriptor is not read
    moeserve::cuda::encode_bf16_tma_2d(&unused_map, src, rows, K, 128);
    for (int per_sm : {1, 2, 3, 4}) {
      for (int S : {4, 8, 12}) {
        const size_t smem = size_t(S) * 128 * 64 * 2 + 1024;
        if (per_sm * (smem + 1024) > size_t(prop.sharedMemPerMultiprocessor) || (per_sm == 1 && S < 8)) continue;
        smem_ceiling(reinterpret_cast<const void*>(read_tma_kernel), smem);
        char name[40];
        std::snprintf(name, sizeof(name), "tiled bulk K%d S%d", K, S);
        row(name, per_sm * sms, smem - 1024, t.best(reps, [&] {
              read_tma_kernel<<<per_sm * sms, 32, smem>>>(unused_map, units, K, 128, S, 1, 2, sink, src);
            }), moved);
      }
    }
    for (int per_sm : {1, 2, 3}) {
      for (int S : {4, 6, 8}) {
        const size_t smem = size_t(S) * 128 * 64 * 2;
        if (per_sm * (smem + 1024) > size_t(prop.sharedMemPerMultiprocessor)) continue;
        for (const bool tiled : {false, true}) {
          const UnitKernel kernel = unit_cpasync_kernel(tiled, S);
          smem_ceiling(reinterpret_cast<const void*>(kernel), smem);
          char name[40];
          std::snprintf(name, sizeof(name), "cpasync unit%s K%d S%d", tiled ? " tiled" : "", K, S);
          row(name, per_sm * sms, smem, t.best(reps, [&] {
                kernel<<<per_sm * sms, 128, smem>>>(src, units, K, sink, 0);
              }), moved);
        }
      }
    }
  }
  // Padded row pitches (ld = K + pad elements) of the [rows, K] layout: the decode tiles' form (2 CTAs an SM, 4-deep
  // cp.async rings) and the TMA rows' (2 x 4 stages, 128-row boxes).
  for (int K : {2048, 768}) {
    for (int pad : {0, 8, 32, 64, 128, 256}) {
      const int64_t ld = K + pad;
      const int64_t rows = int64_t(bytes / (size_t(ld) * 2)) / 128 * 128;
      const int units = int(rows / 128);
      const double moved = double(rows) * K * 2;
      constexpr int kS = 4;
      const size_t smem = size_t(kS) * 128 * 64 * 2;
      smem_ceiling(reinterpret_cast<const void*>(read_unit_cpasync_kernel<false, kS>), smem);
      char name[48];
      std::snprintf(name, sizeof(name), "cpasync unit K%d ld%lld S4", K, (long long)ld);
      row(name, 2 * sms, smem, t.best(reps, [&] {
            read_unit_cpasync_kernel<false, kS><<<2 * sms, 128, smem>>>(src, units, K, sink, int(ld));
          }), moved);
      moe_kernels::TmaDesc map;
      moeserve::cuda::encode_bf16_tma_2d(&map, src, rows, K, 128, ld);
      const size_t tsmem = size_t(kS) * 128 * 64 * 2 + 1024;
      smem_ceiling(reinterpret_cast<const void*>(read_tma_kernel), tsmem);
      std::snprintf(name, sizeof(name), "tma K%d ld%lld b128 S4", K, (long long)ld);
      row(name, 2 * sms, tsmem - 1024, t.best(reps, [&] {
            read_tma_kernel<<<2 * sms, 32, tsmem>>>(map, units, K, 128, kS, 1, 0, sink, src);
          }), moved);
    }
  }
  return 0;
}

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {  // MS_CUDA_CHECK's errors (no GPU, a launch that failed)
    std::fprintf(stderr, "gpu_read_bw: %s\n", e.what());
    return 1;
  }
}
