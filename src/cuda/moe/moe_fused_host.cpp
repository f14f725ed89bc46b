// Host side of the fused MoE path: workspace layout, tile-configuration choice, the launcher shared by the AOT
// and JIT kernel tables, and the two ahead-of-time backends (fused_sm90 and the deliberately foreign
// fused_sm100_build).
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "core/env.h"
#include "core/error.h"
#include "core/log.h"
#include "cuda/device.h"
#include "cuda/launch.h"
#include "cuda/moe/moe_internal.h"
#include "cuda/tma.h"

namespace moeserve::cuda {

using namespace moe_kernels;

namespace {
constexpr size_t kAlign = 256;
size_t align_up(size_t v) { return (v + kAlign - 1) / kAlign * kAlign; }
constexpr int kMaxGridY = 65535;
constexpr int kSmallestTile = GemmCfg0::BN;

// Upper bound on the tiles any routing of P pairs over E experts needs with tiles of `bn` rows:
// sum_e ceil(n_e / bn) <= sum_e floor(n_e / bn) + #active <= P / bn + min(E, P).
int max_tiles(int E, int64_t P, int bn) { return int(std::min<int64_t>(E, P) + P / bn); }

// The TMA descriptor of a weight tensor seen as [rows, K] bf16, boxes of 64 (K) x box_rows, for the warp-specialized
// GEMMs' weight loads.
void encode_weight_map(TmaDesc& out, const void* w, int64_t rows, int K, int box_rows) {
  static_assert(sizeof(TmaDesc) == 128 && alignof(TmaDesc) >= 64, "TmaDesc holds a CUtensorMap");
  encode_bf16_tma_2d(&out, w, rows, K, box_rows);
}

// The gate/up GEMM of the warp-specialized cp.async configurations issues its first weight slices before its
// programmatic wait, over a tile table in static slots (GemmParams::static_slots): 2 of configuration 12's 4-deep
// ring. MOESERVE_MOE_GU_PREWAIT=N: N slices, at most the ring's depth (A/B; 0 off). H200, q30b8l, session 28 (two
// calls, three rounds each, same call): 2 slices against the whole ring (4) bs 64 -5 us a step overlapped
// (2,856.6-2,857.5 against 2,861.7-2,862.3; call 1: 2,888.6-2,891.7 against 2,890.9-2,897.0), bs 48 -4 to -6, bs 128
// -4 to -10; 1 slice between the two. Fewer slices queue less in front of the prep's loads (session 27's trace: the
// prep +18 us a step with 4).
int moe_gu_prewait_slices() {
  static const int n = int(env_int("MOESERVE_MOE_GU_PREWAIT", 2, 0, 64));
  return n;
}

// Configurations whose kernels build the tables in shared memory (moe_gemm_ws.cuh: kInline).
bool inline_route_config(int config) {
  const GemmConfigInfo c = gemm_config_info(config);
  return c.persistent && c.weights_cp_async && c.bn == 32;
}

void launch(const void* kernel, dim3 grid, dim3 block, size_t smem, void* params, cudaStream_t stream,
            const char* what, bool programmatic = false) {
  // Programmatic dependent launch: this grid may start while the previous kernel on the stream still runs; the
  // kernel calls griddepcontrol.wait before touching anything that kernel writes (see moe_gemm_kernels.cuh).
  void* args[] = {params};
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t cfg = pdl_config(grid, block, smem, stream, attr, programmatic);
  if (cudaError_t e = cudaLaunchKernelExC(&cfg, kernel, args); e != cudaSuccess)
    throw_cuda_error(e, what, __FILE__, __LINE__);
}
}  // namespace

// Which configurations run on wgmma (configurations 4 and 5 have the tile shapes of 3 and 2, configuration 6 is 4
// with one slice's MMAs in flight while the ring refills; builds that do not target sm_90a compile them as
// mma.sync). MOESERVE_MOE_WGMMA: 0 none (A/B), 1 the prefill tiles (3 -> 4: a layer of 8,192 tokens 1,611 us
// against 2,602 on mma.sync), 2 the small-prefill tiles too (2 -> 5: 512 tokens 328 against 370 us), 3 (default)
// both and 4 -> 6 (8,192 tokens 1,605 against 1,660 us in the fused_sm90 build; H200, session 5).
int moe_wgmma_level() {
  static const int level = int(env_int("MOESERVE_MOE_WGMMA", 3, 0, 3));
  return level;
}

// The warp-specialized persistent configurations (sm_90a tables only; moe_gemm_ws.cuh), H200 session 9, MoE layer
// of q30b shapes alone (jit): 128 tokens (~8 an expert) configuration 9 299.8 us against 309.4 for configuration
// 1; 2,048 tokens configuration 8 517.5 against 524.5 for 6; 8,192 tokens configuration 10 1,411 against 1,587
// for 6 (8: 1,596). MOESERVE_MOE_WS=0 turns them off (A/B); MOESERVE_MOE_WS_PREFILL picks the configuration above
// MOESERVE_MOE_WS_PREFILL_MIN (default 256) tokens an expert: 14 (the default since session 37: 10's tile with the
// tokens as the MMAs' M; H200, same call, three rounds: the layer at 8,192 tokens 1,084.8-1,085.2 us against
// 1,170.0-1,187.3 for 10 in the fused_sm90 build, 1,106.0-1,113.7 against 1,245.7-1,266.8 in the JIT one), or 6, 8
// or 10 (A/B).
bool moe_ws_enabled() {
  static const bool on = env_int("MOESERVE_MOE_WS", 1, 0, 1) != 0;
  return on;
}
// Tokens an expert above which the prefill configuration replaces configuration 8 (MOESERVE_MOE_WS_PREFILL_MIN).
double moe_ws_prefill_min() {
  static const double v = double(env_int("MOESERVE_MOE_WS_PREFILL_MIN", 256, 40, 1 << 20));
  return v;
}
int moe_ws_prefill_config() {
  static const int c = [] {
    const int v = int(env_int("MOESERVE_MOE_WS_PREFILL", 14, 6, 14));
    return v == 6 || v == 8 || v == 10 ? v : 14;
  }();
  return c;
}

// Tokens an expert up to which decode steps take configuration 0 (32 x 16 tiles); above it, 9 (warp-specialized)
// or 1. Default 2 (MOESERVE_MOE_SMALL_TILE_MAX=N for A/B): at 64 sequences (4 tokens an expert) the down GEMM of
// configuration 0 ran at x1.23 of its bytes (its 48 KB tiles all ramp) and the served step took 3,190-3,216 us
// against 3,090-3,094 with configuration 9 (session 12, same call).
double moe_small_tile_max() {
  static const double v = double(env_int("MOESERVE_MOE_SMALL_TILE_MAX", 2, 0, 12));
  return v;
}

// The warp-specialized configuration of batched decode (3-12 tokens an expert): 12 (two CTAs an SM, 32-token tiles,
// the weight tiles by the producers' cp.async with the L2 evict_first priority), or with MOESERVE_MOE_WS_DECODE
// (A/B): 11 (12's shape with TMA weight tiles), 9 (one CTA an SM, 64-token tiles, TMA), 13 (9 with cp.async).
// H200, session 24, 11 against 9, same call, three rounds: the MoE layer at 64 tokens 288.9-289.1 us against
// 292.7-293.3, served steps bs 64 2,982.8-2,986.5 against 2,996.7-3,001.9. Session 25, 12 against 11, same call,
// three rounds: the layer at 64 tokens 281.0-281.5 against 287.6-287.7, at 128 286.5-286.9 against 296.3; served
// steps bs 64 2,874.0-2,876.0 against 2,964.3-2,968.3, bs 128 3,123.3-3,124.6 against 3,221.5-3,226.1 (12 without
// the L2 hint: bs 64 2,944.3-2,946.6; 13: 2,940.6-2,941.1).
int moe_ws_decode_config() {
  static const int c = [] {
    const int v = int(env_int("MOESERVE_MOE_WS_DECODE", 12, 9, 13));
    return v == 9 || v == 11 || v == 13 ? v : 12;
  }();
  return c;
}

// The configuration between batched decode and prefill (12-40 tokens an expert: a 512-token prompt, mixed steps of
// decodes and prompt chunks) on an sm_90a table: 8 (the warp-specialized 128 x 128 tiles, one tile an expert), or
// with MOESERVE_MOE_WS_MID (A/B) 5 (128 x 64 tiles on wgmma, not warp-specialized, the default before session 35),
// 13 (64-token tiles, cp.async weights) or 9 (its TMA twin). H200, session 35, q30b8l steps (gpu_profile, in a CUDA
// graph, experts of 8 layers): a 512-token prompt 2,121-2,137 us against 2,262-2,273 with 5 (9: +1%, 13: +15% of the
// step); 64 decodes + 512 prompt tokens 2,887 against 3,008; served decode1 TTFT p50 3.5-3.6 ms against 3.7-3.8, 64
// concurrent and prefill even. Also 12 (the batched-decode tiles: 32 tokens, two CTAs an SM), 10 and 14 (the
// 256-weight-row prefill tiles, rows or tokens as M), for session 44's question: is a mixed step's expert time
// (64 decodes + 512 prompt tokens: ~36 tokens an expert, the experts +31% over a decode step's for the same weight
// bytes) the gathered token rows (configuration 8 takes them in once a 128-row weight tile, 10 and 14 once a
// 256-row one) or the MMAs on the tile's empty token columns?
int moe_ws_mid_config() {
  static const int c = [] {
    const int v = int(env_int("MOESERVE_MOE_WS_MID", 8, 5, 14));
    return v == 5 || v == 9 || v == 10 || v == 12 || v == 13 || v == 14 ? v : 8;
  }();
  return c;
}

int fused_config_for(const MoeShape& s, int T, bool wgmma) {
  const double per_expert = double(T) * s.top_k / std::max(1, s.num_experts);
  const int level = moe_wgmma_level();
  const bool ws = wgmma && level >= 3 && moe_ws_enabled();
  if (per_expert <= moe_small_tile_max()) return 0;
  if (per_expert <= 12) return ws ? moe_ws_decode_config() : 1;
  if (per_expert <= 40) return ws ? moe_ws_mid_config() : level >= 2 ? 5 : 2;
  if (ws) return per_expert <= moe_ws_prefill_min() ? 8 : moe_ws_prefill_config();
  return level >= 3 ? 6 : level >= 1 ? 4 : 3;
}

// Inline routing (GemmParams::inline_ids): batched decode on configuration 12 without the prep launch, each GEMM CTA
// building the tile table itself; MOESERVE_MOE_INLINE_ROUTE=0 for the prep launch (A/B). Read at each call (the tests
// compare both paths in one process; a launch's host cost, not a graph replay's). H100 (session 57, two calls, four
// same-call pairs, q30b8l served steps overlapped): bs 64 -10 to -19 us (3,724.5-3,732.6 against 3,736.7-3,746.4),
// bs 128 -7 to -11, bs 48 -5 to -10, bs 32 even; the trace: the prep's 4.35 us gone a layer, the route's top-k +1.5
// (the gate/up GEMM's pre-wait slices now queue in front of it instead of the prep), the GEMMs even.
bool fused_inline_route_for(const MoeShape& s, int T, const FusedLayout& l) {
  if (l.direct || !inline_route_config(l.config) || env_int("MOESERVE_MOE_INLINE_ROUTE", 1, 0, 1) == 0) return false;
  const int64_t P = int64_t(T) * s.top_k;
  return inline_route_layout(s.num_experts, T, s.top_k, l.num_slots).bytes <= kInlineRouteMaxBytes &&
         P <= int64_t(gemm_config_info(l.config).threads) * kInlineRoutePerThread;
}

bool fused_direct_for(const MoeShape& s, int T) {
  return T >= 1 && int64_t(T) * s.top_k <= std::max(kDirectMaxPairs, s.top_k);
}

FusedLayout fused_layout(const MoeShape& s, int T, bool wgmma) {
  FusedLayout l;
  const int64_t P = int64_t(T) * s.top_k;
  l.direct = fused_direct_for(s, T);
  // Direct mode: one-row tiles, so the smallest tile configuration, and one slot per pair.
  l.config = l.direct ? 0 : fused_config_for(s, T, wgmma);
  l.num_slots = l.direct ? int(P) : max_tiles(s.num_experts, P, gemm_config_info(l.config).bn);
  // The tile table is sized for the smallest tile of any configuration, so that the region only grows with T.
  const size_t tile_cap = size_t(max_tiles(s.num_experts, P, kSmallestTile));
  size_t off = 0;
  l.tiles = off, off = align_up(off + tile_cap * sizeof(Tile));
  l.perm_pair = off, off = align_up(off + size_t(P) * 4);
  l.pair_pos = off, off = align_up(off + size_t(P) * 4);
  l.act = off, off = align_up(off + size_t(P) * s.inter * 2);
  l.y = off, off = align_up(off + size_t(P) * s.hidden * 2);
  l.total = off;
  return l;
}

std::string fused_shape_check(const MoeShape& s) {
  if (s.format != WeightFormat::BF16)
    return fmt::format("weight format {} is not supported (bf16 only)", weight_format_name(s.format));
  if (s.num_experts < 1 || s.num_experts > kMaxExperts)
    return fmt::format("{} experts: the fused kernels handle 1 to {}", s.num_experts, kMaxExperts);
  if (s.top_k < 1 || s.top_k > s.num_experts) return fmt::format("top_k {} of {} experts", s.top_k, s.num_experts);
  if (s.hidden <= 0 || s.inter <= 0 || s.hidden % 64 != 0 || s.inter % 64 != 0)
    return fmt::format("hidden size {} and intermediate size {} must be positive multiples of 64", s.hidden,
                       s.inter);
  if (s.max_tokens < 1) return fmt::format("max_tokens {} must be at least 1", s.max_tokens);
  const int64_t P = int64_t(s.max_tokens) * s.top_k;
  if (int64_t(s.num_experts) + P / kSmallestTile > kMaxGridY)
    return fmt::format("max_tokens {} x top_k {} is too large for one launch (grid y > {})", s.max_tokens, s.top_k,
                       kMaxGridY);
  return "";
}

std::string fused_check_kernels(const KernelTable& t, const DeviceInfo& dev) {
  std::vector<const void*> all = {t.prep, t.combine};
  for (const void* k : t.down_gemv) all.push_back(k);
  for (int c = 0; c < kNumGemmConfigs; ++c)
    for (int m = 0; m < 2; ++m) all.push_back(t.gemm[c][m]);
  for (const void* k : all) {
    if (!k) return "kernel missing from the kernel table";
    std::string r = check_kernel_present(k, dev);
    if (!r.empty()) return r;
  }
  // A kernel may fill several slots (the JIT table repeats the default's kernel where the other depths were not
  // compiled): its ceiling is the largest that any of its slots launches with, set once. (Setting it slot by slot
  // left the default 8-stage kernel at the 4-stage slot's ceiling: every 1-token launch failed with
  // cudaErrorInvalidValue, session 18.)
  std::vector<std::pair<const void*, int>> ceilings;  // kernel, stages of its largest slot
  for (int v = 0; v < kNumDownGemvVariants; ++v) {
    auto it = std::find_if(ceilings.begin(), ceilings.end(), [&](const auto& c) { return c.first == t.down_gemv[v]; });
    if (it == ceilings.end()) ceilings.emplace_back(t.down_gemv[v], kDownGemvStageVariants[v]);
    else it->second = std::max(it->second, kDownGemvStageVariants[v]);
  }
  for (const auto& [kernel, stages] : ceilings) {
    const int smem = down_gemv_smem_bytes(kDownGemvMaxI, stages);
    if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
        e != cudaSuccess) {
      cudaGetLastError();
      return fmt::format("the down GEMV ({} ring stages) needs {} KiB of shared memory per block: {}", stages,
                         smem / 1024, cudaGetErrorString(e));
    }
  }
  for (int c = 0; c < kNumGemmConfigs; ++c)
    for (int m = 0; m < 2; ++m) {
      const int smem = gemm_config_info(c).smem_bytes + (inline_route_config(c) ? kInlineRouteMaxBytes : 0);
      cudaError_t e = cudaFuncSetAttribute(t.gemm[c][m], cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
      if (e != cudaSuccess) {
        cudaGetLastError();
        return fmt::format("GEMM configuration {} needs {} KiB of shared memory per block: {}", c, smem / 1024,
                           cudaGetErrorString(e));
      }
    }
  return "";
}

size_t fused_direct_counters(const MoeShape& s) {
  return size_t(kDirectMaxPairs) * size_t(ceil_div(s.hidden, gemm_config_info(0).bm));
}

size_t fused_counters(const MoeShape& s) { return fused_direct_counters(s) + 2 * size_t(s.num_experts) + 2; }

std::string DeviceCounters::ensure(size_t n) {
  if (n <= n_) return "";
  if (p_) cudaFree(p_);
  p_ = nullptr, n_ = 0;
  void* p = nullptr;
  if (cudaError_t e = cudaMalloc(&p, n * sizeof(int)); e != cudaSuccess) {
    cudaGetLastError();
    return fmt::format("cannot allocate {} counters: {}", n, cudaGetErrorString(e));
  }
  if (cudaError_t e = cudaMemset(p, 0, n * sizeof(int)); e != cudaSuccess) {
    cudaGetLastError();
    cudaFree(p);
    return fmt::format("cannot zero {} counters: {}", n, cudaGetErrorString(e));
  }
  p_ = static_cast<int*>(p), n_ = n;
  return "";
}

DeviceCounters::~DeviceCounters() {
  if (p_) cudaFree(p_);
}

// MOESERVE_MOE_DOWN_GEMV_STAGES = 2, 3, 4 or 8 (kDownGemvStageVariants): a depth forced for A/B, -1 when unset.
// Another value warns and is ignored.
static int down_gemv_forced_variant() {
  static const int v = [] {
    if (std::getenv("MOESERVE_MOE_DOWN_GEMV_STAGES") == nullptr) return -1;
    const long want = env_int("MOESERVE_MOE_DOWN_GEMV_STAGES", kDownGemvStages, 1, 64);
    for (int i = 0; i < kNumDownGemvVariants; ++i)
      if (kDownGemvStageVariants[i] == want) return i;
    log_warn("MOESERVE_MOE_DOWN_GEMV_STAGES={}: built for 2, 3, 4 or 8 ring stages; ignored", want);
    return -1;
  }();
  return v;
}

int down_gemv_variant(const MoeShape& s, int sms) {
  return down_gemv_variant_for(s.hidden, s.inter, sms, down_gemv_forced_variant());
}

namespace {
// Direct mode of up to kDownGemvWarps pairs: the down projection and the combine as one GEMV launch (see
// down_gemv_body; served bs 1 step 635-637 us against 658-661 with the down GEMM, session 12).
// MOESERVE_MOE_DOWN_GEMV=0: the down GEMM with its last-CTA combine.
bool down_gemv_applies(const MoeShape& s, bool direct, int num_slots) {
  static const bool down_gemv = env_int("MOESERVE_MOE_DOWN_GEMV", 1, 0, 1) != 0;
  return down_gemv && direct && num_slots <= kDownGemvWarps && s.inter <= kDownGemvMaxI &&
         s.hidden % kDownGemvRows == 0;
}
}  // namespace

int fused_residual_parts(const MoeShape& s, int T) {
  if (T < 1 || T > s.max_tokens || !fused_direct_for(s, T)) return 0;
  static_assert(kDownGemvRows == kResidualPartRows, "a residual part is a down GEMV CTA's rows");
  // Direct mode: every pair its own slot (num_slots = T * top_k).
  return down_gemv_applies(s, true, T * s.top_k) && T * kDownGemvRows <= kDownGemvThreads ? s.hidden / kDownGemvRows
                                                                                           : 0;
}

// The combine launch ends the MoE wherever the direct path does not (FusedBackendBase always passes counters, so
// direct mode combines in its down kernel).
bool fused_combine_norm_supported(const MoeShape& s, int T) {
  return T >= 1 && T <= s.max_tokens && !fused_direct_for(s, T) && s.hidden % 8 == 0 &&
         s.hidden / 8 <= kCombineNormChunks * kCombineThreads;
}

void fused_run(const KernelTable& k, const MoeShape& s, const bf16* x, int T, const int32_t* topk_ids,
               const float* topk_weights, const MoeWeights& w, bf16* out, void* workspace, int* counters,
               cudaStream_t stream, float* residual, float* res_partials, const CombineNorm* norm) {
  MS_CHECK(norm == nullptr || (fused_combine_norm_supported(s, T) && counters != nullptr && norm->residual &&
                               norm->norm_w && norm->xn_out),
           "moe: the combine's norm epilogue needs a combine launch ({} tokens) and its buffers", T);
  MS_CHECK((residual == nullptr) == (res_partials == nullptr) &&
               (residual == nullptr || fused_residual_parts(s, T) > 0),
           "moe: the residual epilogue needs the direct-mode down GEMV ({} tokens)", T);
  MS_CHECK(T >= 0 && T <= s.max_tokens, "moe: {} tokens, the backend was prepared for at most {}", T, s.max_tokens);
  MS_CHECK(w.format == WeightFormat::BF16 && w.gate_up && w.down, "moe: bf16 weights expected");
  auto aligned = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; };
  MS_CHECK(aligned(x) && aligned(out) && aligned(w.gate_up) && aligned(w.down) && aligned(workspace),
           "moe: x, out, weights and workspace must be 16-byte aligned");
  if (T == 0) return;
  const FusedLayout l = fused_layout(s, T, k.wgmma);
  const GemmConfigInfo cfg = gemm_config_info(l.config);
  char* ws = static_cast<char*>(workspace);
  Tile* tiles = reinterpret_cast<Tile*>(ws + l.tiles);
  int* perm_pair = reinterpret_cast<int*>(ws + l.perm_pair);
  int* pair_pos = reinterpret_cast<int*>(ws + l.pair_pos);
  auto* act = reinterpret_cast<unsigned short*>(ws + l.act);
  auto* y = reinterpret_cast<unsigned short*>(ws + l.y);
  const unsigned slots = unsigned(l.num_slots);

  // Direct mode: the GEMMs take the routing straight from topk_ids (no prep launch) and the down GEMM's last
  // CTAs do the combine (when counters are given). Every kernel is a programmatic dependent of the one before
  // (weights prefetched before the wait where the routing allows; see moe_gemm_kernels.cuh).
  const bool direct = l.direct;
  const int* direct_ids = direct ? topk_ids : nullptr;
  const bool fused_combine = direct && counters != nullptr;
  const bool pdl = k.pdl;
  // Static slots: the gate/up GEMM's first weight slices go out before its wait (GemmParams::static_slots). (A
  // cp.async-weights configuration is warp-specialized, which fused_config_for picks for wgmma tables only.)
  const int prewait = !direct && cfg.weights_cp_async && int64_t(T) * s.top_k >= s.num_experts
                          ? moe_gu_prewait_slices()
                          : 0;
  // Inline routing: no prep launch where the tables fit a CTA (moe_gemm_ws.cuh's inline_route).
  const bool inline_route = fused_inline_route_for(s, T, l);
  const size_t route_smem =
      inline_route ? size_t(inline_route_layout(s.num_experts, T, s.top_k, l.num_slots).bytes) : 0;
  if (!direct && !inline_route) {
    const int P = T * s.top_k;
    PrepParams pp{topk_ids, P, s.num_experts, cfg.bn, l.num_slots, tiles, perm_pair, pair_pos, kPrepWhole,
                  nullptr, nullptr, nullptr, prewait};
    if (P > kPrepChunk && counters != nullptr) {
      pp.counts = counters + fused_direct_counters(s);
      pp.offsets = pp.counts + s.num_experts;
      pp.done = pp.offsets + s.num_experts + 1;
      const dim3 grid(unsigned(ceil_div(P, kPrepChunk)));
      pp.mode = kPrepCount;
      launch(k.prep, grid, dim3(kPrepThreads), kPrepSmemBytes, &pp, stream, "moe prep (count) launch", pdl);
      pp.mode = kPrepScatter;
      launch(k.prep, grid, dim3(kPrepThreads), kPrepSmemBytes, &pp, stream, "moe prep (scatter) launch", pdl);
    } else {
      launch(k.prep, dim3(1), dim3(kPrepThreads), kPrepSmemBytes, &pp, stream, "moe prep launch", pdl);
    }
  }

  GemmParams gu{static_cast<const unsigned short*>(w.gate_up), reinterpret_cast<const unsigned short*>(x), act,
                tiles, perm_pair, topk_weights, s.hidden, s.inter, s.top_k, direct_ids, s.num_experts,
                nullptr, nullptr, l.num_slots};
  gu.weight_evict_first = l2_evict_first_weights() ? 1 : 0;
  gu.static_slots = prewait;
  if (inline_route) gu.inline_ids = topk_ids, gu.num_tokens = T, gu.inline_pair_pos = pair_pos;

  // Direct mode's gate/up may run a configuration of its own (the same tile shape, another ring depth; A/B switch:
  // see GemmCfg7). The down GEMM keeps configuration 0 (5 stages there: 29.2 against 26.9 us at 1 token).
  static const int direct_gu_config = int(env_int("MOESERVE_MOE_DIRECT_GU_CONFIG", 0, 0, kNumGemmConfigs - 1));
  const int gu_config = direct && gemm_config_info(direct_gu_config).bm == cfg.bm &&
                                gemm_config_info(direct_gu_config).bn == cfg.bn
                            ? direct_gu_config
                            : l.config;
  const GemmConfigInfo gu_cfg = gemm_config_info(gu_config);
  // A persistent (warp-specialized) configuration walks the grid with ctas_per_sm CTAs an SM.
  auto grid_of = [&](const GemmConfigInfo& c, int gx) {
    return c.persistent ? dim3(unsigned(std::min<int64_t>(int64_t(std::max(k.num_sms, 1)) * c.ctas_per_sm,
                                                          int64_t(gx) * slots)))
                        : dim3(unsigned(gx), slots);
  };
  if (gu_cfg.persistent)
    encode_weight_map(gu.wmap, w.gate_up, int64_t(s.num_experts) * 2 * s.inter, s.hidden, gu_cfg.bm / 2);
  launch(k.gemm[gu_config][kGateUp], grid_of(gu_cfg, ceil_div(s.inter, gu_cfg.bm / 2)), dim3(gu_cfg.threads),
         size_t(gu_cfg.smem_bytes) + route_smem, &gu, stream, "moe gate/up GEMM launch", pdl);

  GemmParams dn{static_cast<const unsigned short*>(w.down), act, y, tiles, perm_pair, topk_weights, s.hidden, s.inter,
                s.top_k, direct_ids, s.num_experts, fused_combine ? counters : nullptr,
                fused_combine ? reinterpret_cast<unsigned short*>(out) : nullptr, l.num_slots};
  dn.weight_evict_first = gu.weight_evict_first;
  if (inline_route) dn.inline_ids = topk_ids, dn.num_tokens = T, dn.static_slots = prewait;  // (the table's layout)
  if (down_gemv_applies(s, direct, l.num_slots)) {
    dn.combine_out = reinterpret_cast<unsigned short*>(out);
    dn.residual = residual;
    dn.res_partials = res_partials;
    const int v = down_gemv_variant(s, k.num_sms);
    launch(k.down_gemv[v], dim3(unsigned(s.hidden / kDownGemvRows)), dim3(kDownGemvThreads),
           size_t(down_gemv_smem_bytes(s.inter, kDownGemvStageVariants[v])), &dn, stream, "moe down GEMV launch", pdl);
    return;
  }
  if (cfg.persistent) encode_weight_map(dn.wmap, w.down, int64_t(s.num_experts) * s.hidden, s.inter, cfg.bm);
  launch(k.gemm[l.config][kDown], grid_of(cfg, ceil_div(s.hidden, cfg.bm)), dim3(cfg.threads),
         size_t(cfg.smem_bytes) + route_smem, &dn, stream, "moe down GEMM launch", pdl);
  if (fused_combine) return;

  CombineParams cp{y, pair_pos, reinterpret_cast<unsigned short*>(out), T, s.top_k, s.hidden, direct_ids,
                   s.num_experts};
  if (norm != nullptr) {
    cp.residual = norm->residual;
    cp.norm_w = reinterpret_cast<const unsigned short*>(norm->norm_w);
    cp.eps = norm->eps;
    cp.xn_out = reinterpret_cast<unsigned short*>(norm->xn_out);
  }
  launch(k.combine, dim3(unsigned(T)), dim3(kCombineThreads), 0, &cp, stream, "moe combine launch", pdl);
}

size_t FusedBackendBase::workspace_bytes(const MoeShape& shape) const {
  return fused_layout(shape, shape.max_tokens, false).total;  // the sizes do not depend on the configuration
}

void FusedBackendBase::run(const bf16* x, int T, const int32_t* topk_ids, const float* topk_weights,
                           const MoeWeights& w, bf16* out, void* workspace, cudaStream_t stream) {
  // Never launch kernels whose code was not checked against this device (fused_sm100_build on Hopper).
  MS_CHECK(ready_, "moe backend {} used without a successful prepare()", spec_.name);
  fused_run(table_, shape_, x, T, topk_ids, topk_weights, w, out, workspace, counters_.get(), stream);
}

void FusedBackendBase::run_combine_norm(const bf16* x, int T, const int32_t* topk_ids, const float* topk_weights,
                                        const MoeWeights& w, bf16* out, float* residual, const bf16* norm_w, float eps,
                                        bf16* xn_out, void* workspace, cudaStream_t stream) {
  MS_CHECK(ready_, "moe backend {} used without a successful prepare()", spec_.name);
  const CombineNorm norm{residual, norm_w, eps, xn_out};
  fused_run(table_, shape_, x, T, topk_ids, topk_weights, w, out, workspace, counters_.get(), stream, nullptr, nullptr,
            &norm);
}

void FusedBackendBase::run_residual(const bf16* x, int T, const int32_t* topk_ids, const float* topk_weights,
                                    const MoeWeights& w, bf16* out, float* residual, float* partials,
                                    void* workspace, cudaStream_t stream) {
  MS_CHECK(ready_, "moe backend {} used without a successful prepare()", spec_.name);
  MS_CHECK(residual != nullptr && partials != nullptr && (reinterpret_cast<uintptr_t>(residual) & 15) == 0,
           "moe run_residual: residual (16-byte aligned) and partials");
  fused_run(table_, shape_, x, T, topk_ids, topk_weights, w, out, workspace, counters_.get(), stream, residual,
            partials);
}

std::string FusedBackendBase::set_ready(const KernelTable& t, const MoeShape& shape) {
  if (std::string r = counters_.ensure(fused_counters(shape)); !r.empty()) return r;
  table_ = t;
  shape_ = shape;
  ready_ = true;
  return "";
}

namespace {

// fused_sm90 and fused_sm100_build: the same launcher over an ahead-of-time kernel table.
class FusedAotBackend final : public FusedBackendBase {
 public:
  FusedAotBackend(BackendSpec spec, KernelTable (*table)(), std::string built_for)
      : aot_table_(table()), built_for_(std::move(built_for)) {
    spec_ = std::move(spec);
  }

  std::string prepare(const DeviceInfo& dev, const MoeShape& shape, std::string& code) override {
    ready_ = false;
    code = "absent";
    if (std::string r = check_arch_claim(spec_, dev); !r.empty()) return r;
    // Binary before shapes: a build without code for this GPU is the more fundamental refusal.
    if (std::string r = fused_check_kernels(aot_table_, dev); !r.empty()) return r;
    code = built_for_ + " in binary";
    if (std::string r = fused_shape_check(shape); !r.empty()) return r;
    KernelTable t = aot_table_;
    t.num_sms = dev.multiprocessors;
    return set_ready(t, shape);
  }

 private:
  KernelTable aot_table_;
  std::string built_for_;
};

}  // namespace

std::unique_ptr<MoeBackend> make_fused_sm90_backend() {
  BackendSpec s;
  s.name = "fused_sm90";
  s.family = OpFamily::Moe;
  s.archs = {90};
  s.formats = {"bf16"};
  s.capturable = true;
  s.summary = "grouped GEMM (mma.sync, swap-AB token tiles, fused SwiGLU), device-side routing prep; AOT sm_90a";
  return std::make_unique<FusedAotBackend>(std::move(s), &fused_sm90_kernels, "sm_90a");
}

std::unique_ptr<MoeBackend> make_fused_sm100_build_backend() {
  BackendSpec s;
  s.name = "fused_sm100_build";
  s.family = OpFamily::Moe;
  s.archs = {90, 100};  // the claim is wrong on purpose: its binary holds sm_100a code only
  s.formats = {"bf16"};
  s.capturable = true;
  s.summary = "the fused kernels built for sm_100a only (claims Hopper too: the binary check must refuse it)";
  return std::make_unique<FusedAotBackend>(std::move(s), &fused_sm100_kernels, "sm_100a");
}

}  // namespace moeserve::cuda
