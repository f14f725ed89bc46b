// Mixture-of-Experts on the GPU: routing (softmax, top-k, renormalisation) shared by all backends, and the
// backend interface for the expert computation (gate/up grouped GEMM with fused SwiGLU, down grouped GEMM,
// weighted combine). Weight formats other than BF16 (FP8 block-scale, NVFP4) join through MoeWeights' scale
// fields and BackendSpec::formats.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "cuda/common.h"
#include "cuda/registry.h"

namespace moeserve::cuda {

enum class WeightFormat { BF16, FP8Block128, NVFP4 };
const char* weight_format_name(WeightFormat f);  // "bf16", "fp8_block128", "nvfp4"

struct MoeShape {
  int num_experts = 0, hidden = 0, inter = 0, top_k = 0;
  WeightFormat format = WeightFormat::BF16;
  int max_tokens = 0;  // largest T a step will pass (sizes workspaces)
};

// One layer's expert weights on the device.
struct MoeWeights {
  WeightFormat format = WeightFormat::BF16;
  const void* gate_up = nullptr;  // [E, 2 * I, H]: rows 0..I-1 gate, I..2I-1 up (transformers' fused layout)
  const void* down = nullptr;     // [E, H, I]
  // Every expert's weights must be readable, routed to or not: the batched-decode gate/up GEMM issues its first
  // weight slices before the routing is known (GemmParams::static_slots).
  // Per-group scales for quantized formats (unused for BF16): FP8 128x128 blocks, NVFP4 16-element groups.
  const void* gate_up_scale = nullptr;
  const void* down_scale = nullptr;
  float gate_up_global_scale = 1.0f, down_global_scale = 1.0f;
};

// Router: logits [T, E] f32 -> softmax over experts -> top-k (descending probability, ties: lower expert
// index first, as torch.topk) -> weights renormalised to sum 1 when `renormalize`. ids/weights: [T, k].
void moe_route_topk(const float* logits, int T, int E, int k, bool renormalize, int32_t* ids, float* weights,
                    cudaStream_t stream);

// The router GEMV and the routing above in one launch, for decode-sized steps: logits[t, e] = x[t] . router[e]
// (x [T, H] bf16, router [E, H] bf16, f32 sums), then the same softmax / top-k / renormalisation. `logits` is
// [T, E] f32 scratch; `counter` router_topk_groups(T) ints of device memory (one a group of 8 tokens), zero before
// the first call (each call leaves them zero). Serves moe_router_topk_fits(T, H, E, k) shapes: T <= 128, H a multiple
// of 8 up to 4096.
constexpr int kFusedRouterMaxTokens = 8;  // tokens a group (a block's tokens)
constexpr int kRouterTopkMaxTokens = 128;
constexpr int router_topk_groups(int T) { return (T + kFusedRouterMaxTokens - 1) / kFusedRouterMaxTokens; }
constexpr int kRouterTopkMaxGroups = router_topk_groups(kRouterTopkMaxTokens);
bool moe_router_topk_fits(int T, int H, int E, int k);

// The folded router of a decode step of T <= kFusedRouterMaxTokens tokens (the residual fusion's layers): the
// router's logits W_r rmsnorm(x) g_post for the residual x = h + W_o a after o_proj, from two products the q/k/v and
// o_proj GEMVs computed as extra rows, u1 = (W_r diag(g_post / g_in)) xn_in (xn_in = rmsnorm(h) g_in, their input)
// and u2 = (W_r diag(g_post) W_o) a, and the RMS factors of h and x from the partial sums:
// logits = (u1 / inv_h + u2) inv_x. Then the top-k as moe_route_topk, and xn_out = bf16(x inv_x g_post) (the
// experts' input). One launch where the router GEMV and the route were two.
struct FoldedRouterInputs {
  const float* u1 = nullptr;
  int64_t ld_u1 = 0;
  const float* u2 = nullptr;
  int64_t ld_u2 = 0;
  const float* part_h = nullptr;  // [T, nparts]: sums of squares of h over parts (the q/k/v GEMV's norm input)
  const float* part_x = nullptr;  // [T, nparts]: of x (o_proj's residual output)
  int nparts = 0;
  const float* residual = nullptr;  // x [T, H]
  const bf16* post_norm = nullptr;  // g_post [H]
  float eps = 0;
  int H = 0;
  bf16* xn_out = nullptr;       // [T, H]
  float* logits_out = nullptr;  // [T, E] or null: the logits (tests)
};
void moe_route_folded(const FoldedRouterInputs& f, int T, int E, int k, bool renormalize, int32_t* ids,
                      float* weights, cudaStream_t stream);
void moe_router_topk(const bf16* x, const bf16* router, int T, int H, int E, int k, bool renormalize,
                     float* logits, int* counter, int32_t* ids, float* weights, cudaStream_t stream);

// The folded route of decode steps beyond the residual fusion's few tokens (gpu_model.cpp, 9-128 tokens): the
// post-attention residual add + RMSNorm exactly as add_rmsnorm computes them (residual += delta; xn_out =
// bf16(rmsnorm(residual) * norm_w), the same bits), then each token's router logits from the two folded products
// that rode as extra output columns of the q/k/v and o_proj GEMMs - u1 = (W_r diag(g_post / g_in)) xn_in and u2 =
// (W_r diag(g_post) W_o) a, [T, E] bf16 - and the input norm's RMS factor inv_h [T] (rmsnorm's inv_out): logits =
// (u1 / inv_h + u2) inv_x, as moe_route_folded; the experts those rank in the top k + 4 get their logits recomputed
// exactly from the router weights and the expert input (so the top-k and its weights are the unfolded router's);
// then the top-k. One launch in place of add_rmsnorm, the router GEMM and the top-k.
struct FoldedMidRoute {
  const bf16* router = nullptr;  // W_r [E, H]
  const bf16* u1 = nullptr;
  int64_t ld_u1 = 0;
  const bf16* u2 = nullptr;
  int64_t ld_u2 = 0;
  const float* inv_h = nullptr;  // [T]
  float* logits_out = nullptr;   // [T, E] or null: the logits routed (exact for the candidates; tests)
};
bool moe_add_norm_route_fits(int H, int E, int k);
// delta: [T] rows of H with stride ld_delta (o_proj's output with u2 beside it).
void moe_add_norm_route(float* residual, const bf16* delta, int64_t ld_delta, const bf16* norm_w, float eps, int T,
                        int H, const FoldedMidRoute& f, int E, int k, bool renormalize, bf16* xn_out, int32_t* ids,
                        float* weights, cudaStream_t stream);

// The same with the post-attention residual add + RMSNorm in front (decode steps of T <= 4 tokens): x =
// bf16(rmsnorm(residual + delta) * norm_w) is computed by every block, written to xn_out (the experts' input)
// and routed; residual += delta. Replaces add_rmsnorm + moe_router_topk: one launch instead of two.
constexpr int kFusedNormRouterMaxTokens = 4;
bool moe_norm_router_topk_fits(int T, int H, int E, int k);
void moe_norm_router_topk(float* residual, const bf16* delta, const bf16* norm_w, float eps, bf16* xn_out,
                          const bf16* router, int T, int H, int E, int k, bool renormalize, float* logits,
                          int* counter, int32_t* ids, float* weights, cudaStream_t stream);

class MoeBackend {
 public:
  virtual ~MoeBackend() = default;
  virtual const BackendSpec& spec() const = 0;
  // Checks the architecture claim and the code for this device (present in the binary, or JIT-compiled for
  // the device's exact architecture for these shapes). Returns "" when ready, else the reason it cannot run
  // here (the backend is then never used). Fills `code` with what was found ("sm_90a in binary",
  // "JIT sm_90a in 0.41 s", "JIT sm_90a from disk cache").
  virtual std::string prepare(const DeviceInfo& dev, const MoeShape& shape, std::string& code) = 0;
  virtual size_t workspace_bytes(const MoeShape& shape) const = 0;
  // out[T, H] = bf16(sum over j < k of topk_weights[t, j] * expert_{topk_ids[t, j]}(x[t])), where
  // expert(x) = down(silu(gate(x)) * up(x)). x: [T, H] bf16. workspace: workspace_bytes(shape) bytes.
  // topk_ids: a token's ids are distinct (a top-k: the fused path's batched decode ranks an expert's rows by token);
  // an id outside [0, E) drops its pair.
  // T <= shape.max_tokens. Capturable backends never synchronize with the host.
  virtual void run(const bf16* x, int T, const int32_t* topk_ids, const float* topk_weights, const MoeWeights& w,
                   bf16* out, void* workspace, cudaStream_t stream) = 0;

  // The residual stream of a decode step folded into the MoE's last launch (the residual fusion of the decode
  // graphs, see GpuQwen3): besides out, residual[t, :] += float(out[t, :]) and partials[t * parts + b] = the
  // sum of squares of the updated residual[t, rows of part b] (parts of kResidualPartRows hidden rows, in order),
  // so that the next GEMV can apply the RMSNorm without a reduction of its own. residual_parts(T): those parts
  // when run_residual serves T tokens, 0 when it cannot (then run() and a norm launch).
  virtual int residual_parts(int /*T*/) const { return 0; }
  // The next RMSNorm folded into the MoE's combine launch (the opt-in MOESERVE_MOE_COMBINE_NORM of the decode
  // graphs): besides out, residual[t, :] += float(out[t, :]) and xn_out[t, :] = bf16(norm_w * rmsnorm(residual[t])),
  // the norm in f32 as the rmsnorm kernels compute it. combine_norm_supported(T): whether run_combine_norm serves
  // T tokens (a combine launch ends the MoE there).
  virtual bool combine_norm_supported(int /*T*/) const { return false; }
  virtual void run_combine_norm(const bf16* x, int T, const int32_t* topk_ids, const float* topk_weights,
                                const MoeWeights& w, bf16* out, float* residual, const bf16* norm_w, float eps,
                                bf16* xn_out, void* workspace, cudaStream_t stream);
  virtual void run_residual(const bf16* x, int T, const int32_t* topk_ids, const float* topk_weights,
                            const MoeWeights& w, bf16* out, float* residual, float* partials, void* workspace,
                            cudaStream_t stream);
};
constexpr int kResidualPartRows = 16;  // hidden rows a residual partial sum covers

// Every MoE backend this binary knows, in preference order for ties.
std::vector<std::unique_ptr<MoeBackend>> make_moe_backends();

// Self-test on a small random problem with the hidden / inter sizes of `shape` (few experts, odd token
// count) against the CPU reference (kernels::moe_forward in f32 on the same BF16 values). Returns "" on
// pass, else what went wrong; max_err gets the largest relative error seen.
std::string moe_self_test(MoeBackend& b, const MoeShape& shape, double& max_err);

}  // namespace moeserve::cuda
