// Qwen3 / Qwen3-MoE on the GPU: BF16 weights (fused q|k|v, fused expert gate|up as transformers lays them
// out), an f32 residual stream, a BF16 paged KV cache, and one forward pass built from the op families'
// selected backends. The pass only launches work on a stream (no sync, no allocation, no host reads), so the
// executor can capture it in a CUDA graph.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "cuda/gemm/gemm.h"
#include "cuda/kernels/ops.h"
#include "cuda/moe/moe.h"
#include "cuda/runtime/allocator.h"
#include "model/arch/qwen3.h"

namespace moeserve::cuda {

struct GpuLayer {
  // [(Hq + 2 Hkv) D, H], [H, Hq D]; with router_folded each has E rows more after those, the folded router's
  // products (fold_router_weights: u1's rows ride in the q/k/v GEMV, u2's in o_proj's; moe_route_folded).
  DeviceArray<bf16> qkv, o;
  bool router_folded = false;
  DeviceArray<bf16> q_norm, k_norm, input_norm, post_norm;
  bool is_moe = false;
  DeviceArray<bf16> router;                          // [E, H]
  DeviceArray<bf16> gate_up, down;                   // MoE: [E, 2I, H], [E, H, I]; dense: [2I, H], [H, I]
  MoeWeights moe;                                    // views of gate_up / down
};

// Device pointers of one step's inputs (the executor fills them).
struct StepInputs {
  const int32_t* tokens = nullptr;      // [T]
  // [T] or null: where >= 0, token t is prev_ids[prev_rows[t]] (sampled by the step before, still on the device)
  const int32_t* prev_rows = nullptr;
  const int32_t* prev_ids = nullptr;
  const int32_t* positions = nullptr;   // [T]
  const int32_t* slots = nullptr;       // [T] KV slot of each token
  AttnMeta attn;                        // sequences
  const int32_t* logit_rows = nullptr;  // [R]
  int T = 0, R = 0;
  bool decode = false;                  // every sequence has exactly one new token
  int max_new = 0;                      // largest new_lens (prefill grid)
  int decode_splits = 1;
  double kv_tokens = 0, attn_pairs = 0;  // host-side sums for the profile's floors: keys read, (query, key) pairs
  // The sampler computes the lm_head with the argmax in it (lmhead_argmax: all-greedy steps of 32-64 rows on sm_90):
  // forward stops after the final norm and leaves the rows in head_rows().
  bool head_argmax = false;
  // More logit rows than the lm_head's logits hold (prompt logprobs): forward stops after the final norm and the
  // executor runs head_chunk() and its sampler over slices of at most max_head_rows() rows.
  bool head_in_chunks = false;
};

// Per-op GPU time of one step (events between ops), against each op's floor: bytes / bandwidth or flops / rate.
class StepProfile {
 public:
  void start(cudaStream_t s);
  void mark(const char* op, double bytes, double flops, cudaStream_t s);
  // Waits for the step; one line per op kind (summed over layers).
  std::string report(double bandwidth_bytes_per_s, double flops_per_s);

 private:
  struct Op {
    std::string name;
    double bytes, flops;
  };
  std::vector<cudaEvent_t> events_;
  std::vector<Op> ops_;
};

// Decode steps of kResidualGemvMaxM + 1 to this many tokens take the folded route (ModelBackends::folded_mid_route).
constexpr int kFoldedMidMaxTokens = 128;

struct ModelBackends {
  GemmBackend* gemm = nullptr;
  MoeBackend* moe = nullptr;
  bool reference_attention = false;  // the plain kernel (head sizes the tensor-core kernels do not cover)
  // Steps of a few tokens use the fused decode kernels (norm + GEMV, norm + router + top-k): with the gemv GEMM
  // backend (whose kernels they are) and MOESERVE_FUSED_DECODE=1 (off by default: slower, see gpu_executor).
  bool fused_small_steps = false;
  // Decode steps run the attention input stage (q/k norm, RoPE, KV store) inside the decode attention launch
  // where the model allows it (RoPE over the whole head); MOESERVE_ATTN_FUSED_IN=0 turns it off (A/B).
  bool fused_attention_input = true;
  // Decode steps of up to kResidualGemvMaxM tokens carry the residual stream between kernels with partial sums of
  // squares (gemv_residual_out, gemv_norm_in, MoeBackend::run_residual) instead of the two norm launches a layer,
  // where every layer is MoE and the MoE backend offers the epilogue (served q30b8l bs 1 -18 us with the GEMV ring,
  // +10-33 us without it, docs/PERF.md session 13); MOESERVE_RESIDUAL_FUSION=0 turns it off.
  bool residual_fusion = true;
  // Steps whose MoE ends in a combine launch (not the direct path) fold the next residual add + RMSNorm into it
  // (MoeBackend::run_combine_norm), where every layer is MoE: MOESERVE_MOE_COMBINE_NORM=1 (A/B, off).
  bool moe_combine_norm = false;
  // Decode steps of 9-128 tokens route through the folded router too: its two products ride as E extra output
  // columns of the q/k/v and o_proj GEMMs (the folded rows of GpuLayer), and the post-attention add + RMSNorm launch
  // also routes (moe_add_norm_route), so the router GEMM and the top-k leave the chain. Opt-in,
  // MOESERVE_ROUTER_FOLD_MID=1 (measured slower, gpu_executor.cpp).
  bool folded_mid_route = false;
  // Timing only (MOESERVE_PROFILE_SKIP_OPS, see skip_ops_from_env): ops left out of every step, so that a step's
  // time with and without an op gives that op's marginal cost in the chain of programmatic launches. The
  // outputs are then wrong; never set in serving.
  unsigned skip_ops = 0;
};

// The ops MOESERVE_PROFILE_SKIP_OPS can leave out (comma-separated names: norm, qkv, attention, oproj, router,
// route, experts, lmhead).
enum SkipOp : unsigned {
  kSkipNorm = 1u << 0,
  kSkipQkv = 1u << 1,
  kSkipAttention = 1u << 2,
  kSkipOproj = 1u << 3,
  kSkipRouter = 1u << 4,
  kSkipRoute = 1u << 5,
  kSkipExperts = 1u << 6,
  kSkipLmHead = 1u << 7,
};
// Parses a list of those names; an unknown name is reported (with the valid ones) and ignored.
unsigned parse_skip_ops(const std::string& list);

class GpuQwen3 {
 public:
  // Uploads the CPU model's weights (views of the mmapped checkpoint). max_tokens: rows per step at most;
  // max_rows: logit rows per step at most; max_seqs: sequences per step at most.
  GpuQwen3(const Qwen3Model& cpu, CachingAllocator& alloc, cudaStream_t stream, ThreadPool& pool);
  const ModelConfig& config() const { return cfg_; }
  size_t weight_bytes() const { return weight_bytes_; }

  // Activations for steps of up to max_tokens rows, max_rows logit rows and max_seqs sequences.
  void plan_workspace(int max_tokens, int max_rows, int max_seqs, int max_decode_splits, const ModelBackends& b);
  // The KV cache: num_pages pages of page_size tokens for every layer.
  void allocate_kv(int64_t num_pages, int page_size);
  static size_t kv_bytes_per_token(const ModelConfig& c);

  // Runs the model over the step's tokens; leaves f32 logits [R, vocab] in logits() (with in.head_in_chunks: none,
  // see head_chunk).
  void forward(const StepInputs& in, cudaStream_t stream, StepProfile* profile = nullptr);
  // After a forward with in.head_in_chunks: the logits of logit rows [r0, r0 + n) into logits()' first n rows
  // (n <= max_head_rows()).
  void head_chunk(const StepInputs& in, int r0, int n, cudaStream_t stream);
  // After a forward with in.head_argmax: the lm_head over its head_rows() into logits(), as a forward without it
  // ends (the same GEMM).
  void head_logits(const StepInputs& in, cudaStream_t stream);
  int max_head_rows() const { return max_rows_; }
  float* logits() const { return logits_.get(); }
  const bf16* head_rows() const { return head_rows_; }  // the lm_head's input rows of the last head_argmax forward
  const bf16* head_weight() const { return cfg_.tie_word_embeddings ? embed_.get() : lm_head_.get(); }
  // Runs every library GEMM kernel the steps' GEMMs can pick (GemmBackend::warm_up_tokens, the shapes of forward())
  // once, so that no step's launch is the first of a kernel (module loading waits for the device to drain).
  // Outputs land in the activations: call before any step. Returns the GEMMs run.
  int warm_up_gemms(cudaStream_t stream);

 private:
  void upload(const Qwen3Model& cpu, cudaStream_t stream, ThreadPool& pool);
  // The lm_head's input rows for logit rows [r0, r0 + n) of a forward's final norm: in place, or gathered into
  // final_rows_.
  const bf16* head_input(const StepInputs& in, int r0, int n, cudaStream_t stream);
  ModelConfig cfg_;
  CachingAllocator& alloc_;
  ModelBackends be_;
  size_t weight_bytes_ = 0;
  DeviceArray<bf16> embed_, lm_head_, final_norm_;
  DeviceArray<float> inv_freq_;
  RopeArgs rope_;
  std::vector<GpuLayer> layers_;
  bool all_moe_ = true;  // every layer MoE (the norm fusions need it)
  const bf16* head_rows_ = nullptr;  // StepInputs::head_argmax
  // KV cache: per layer K then V, each [pages, page_size, kv_heads, head_dim].
  DeviceArray<bf16> kv_;
  int64_t kv_pages_ = 0;
  int page_size_ = 0;
  // Activations.
  int max_tokens_ = 0, max_rows_ = 0;
  DeviceArray<float> residual_, router_logits_, topk_w_, logits_;
  DeviceArray<bf16> xn_, qkv_, attn_, o_, mlp_, mlp_act_, final_rows_;
  DeviceArray<int32_t> topk_ids_;
  DeviceArray<int> grid_counter_;  // the fused kernels' last-block counter (zero between launches)
  // The residual fusion's partial sums of squares: written by o_proj (read by the router), by the MoE (read by the
  // next layer's q/k/v); [kResidualGemvMaxM][hidden / 16] each.
  DeviceArray<float> part_attn_, part_moe_;
  DeviceArray<float> router_u1_, router_u2_;  // the folded router's products [kResidualGemvMaxM, E]
  bool fold_mid_ok_ = false;  // ModelBackends::folded_mid_route asked and this model's shapes take it
  DeviceArray<float> inv_h_;  // fold_mid_ok_: the input norm's RMS factors [kFoldedMidMaxTokens]
  DeviceArray<uint8_t> moe_ws_, decode_ws_;
};

}  // namespace moeserve::cuda
