// Internals of the MoE backends shared by their translation units (and the tests): the backend factories, the
// fused path's workspace layout and launcher (shared by the AOT sm_90a, AOT sm_100a and JIT kernels), and the
// JIT compiler entry points.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cuda/moe/moe.h"
#include "cuda/moe/moe_kernel_params.h"

namespace moeserve {
class ThreadPool;
}

namespace moeserve::cuda {

std::unique_ptr<MoeBackend> make_cublas_ref_backend();
std::unique_ptr<MoeBackend> make_fused_sm90_backend();
std::unique_ptr<MoeBackend> make_fused_sm100_build_backend();
// `source_override` replaces the main kernel source (tests use it to check how a compile failure is reported).
std::unique_ptr<MoeBackend> make_jit_backend(std::string source_override = {});

// Kernel tables of the two ahead-of-time builds (moe_fused.cu for sm_90a, fused_sm100.cu for sm_100a).
moe_kernels::KernelTable fused_sm90_kernels();
moe_kernels::KernelTable fused_sm100_kernels();

// Every backend here lays its workspace out for the T of the call, not for max_tokens: the regions grow with T,
// so workspace_bytes(shape with max_tokens = T) serves any call with at most T tokens (the self-test relies on
// it), and the offsets depend on T only (a graph replay sees the same ones).
//
// Byte offsets into the fused path's workspace for T tokens.
struct FusedLayout {
  int config = 0;     // GEMM tile configuration (index into moe_kernels::GemmCfg*)
  int num_slots = 0;  // tile slots: the GEMMs' grid y, an upper bound on tiles for any routing
  bool direct = false;  // small-T direct mode: no prep, slot y = pair y (see moe_kernels::kDirectMaxPairs)
  size_t tiles = 0, perm_pair = 0, pair_pos = 0, act = 0, y = 0, total = 0;
};
// wgmma: the kernel table holds sm_90a code (KernelTable::wgmma), so the warp-specialized configurations may run.
FusedLayout fused_layout(const MoeShape& s, int T, bool wgmma = false);
// The configuration for T tokens: by the average number of tokens per expert.
int fused_config_for(const MoeShape& s, int T, bool wgmma = false);
// Whether T tokens take the direct (prep-less, one pair per tile) path: T * top_k <= max(kDirectMaxPairs, top_k).
bool fused_direct_for(const MoeShape& s, int T);
// Whether T tokens skip the prep launch, the GEMMs building the routing tables themselves (GemmParams::inline_ids):
// configuration 12 where the tables fit, unless MOESERVE_MOE_INLINE_ROUTE=0.
bool fused_inline_route_for(const MoeShape& s, int T, const FusedLayout& l);
// "" when the fused kernels support these shapes, else why not.
std::string fused_shape_check(const MoeShape& s);
// Checks that every kernel of `t` has code for this device and allows its dynamic shared memory. "" or why not.
std::string fused_check_kernels(const moe_kernels::KernelTable& t, const DeviceInfo& dev);
// The direct-mode down GEMV's ring depth for a shape on `sms` SMs, an index into kDownGemvStageVariants
// (down_gemv_variant_for: the default where its grid is one wave, else 4 stages; MOESERVE_MOE_DOWN_GEMV_STAGES forces
// one). The JIT build compiles the other depths only when the shape takes one.
int down_gemv_variant(const MoeShape& s, int sms);
// Device ints, zeroed when allocated: the direct path's fused-combine counters (each launch leaves them at zero
// again). One set per backend: a backend must not run on two streams at once.
class DeviceCounters {
 public:
  DeviceCounters() = default;
  DeviceCounters(const DeviceCounters&) = delete;
  DeviceCounters& operator=(const DeviceCounters&) = delete;
  ~DeviceCounters();
  std::string ensure(size_t n);  // "" or why not
  int* get() const { return p_; }

 private:
  int* p_ = nullptr;
  size_t n_ = 0;
};
// Counters the direct path's fused combine needs for these shapes, then those of the two-launch prep (counts,
// offsets, done); fused_counters is both.
size_t fused_direct_counters(const MoeShape& s);
size_t fused_counters(const MoeShape& s);
// prep -> gate/up GEMM with SwiGLU -> down GEMM with routing weights -> combine, all on `stream`, no host sync.
// counters: fused_counters(s) device ints (zero between launches), or null. Direct mode: the same without prep,
// and with counters the combine is done by the down GEMM (no combine launch). Prefill-sized steps with counters
// run the prep as two launches over many CTAs (PrepParams).
// residual / res_partials (both or neither): MoeBackend::run_residual, where fused_residual_parts(s, T) > 0.
// norm (optional): MoeBackend::run_combine_norm, where fused_combine_norm_supported(s, T).
struct CombineNorm {
  float* residual;
  const bf16* norm_w;
  float eps;
  bf16* xn_out;
};
void fused_run(const moe_kernels::KernelTable& k, const MoeShape& s, const bf16* x, int T, const int32_t* topk_ids,
               const float* topk_weights, const MoeWeights& w, bf16* out, void* workspace, int* counters,
               cudaStream_t stream, float* residual = nullptr, float* res_partials = nullptr,
               const CombineNorm* norm = nullptr);
int fused_residual_parts(const MoeShape& s, int T);
bool fused_combine_norm_supported(const MoeShape& s, int T);

// What the ahead-of-time and JIT fused backends share: the checked kernel table and the shapes it was prepared
// for, the combine counters, and run() over fused_run. Each backend fills spec_ and, in prepare(), calls
// set_ready once its table's code has been checked against the device.
class FusedBackendBase : public MoeBackend {
 public:
  const BackendSpec& spec() const override { return spec_; }
  size_t workspace_bytes(const MoeShape& shape) const override;
  void run(const bf16* x, int T, const int32_t* topk_ids, const float* topk_weights, const MoeWeights& w, bf16* out,
           void* workspace, cudaStream_t stream) override;
  int residual_parts(int T) const override { return ready_ ? fused_residual_parts(shape_, T) : 0; }
  bool combine_norm_supported(int T) const override { return ready_ && fused_combine_norm_supported(shape_, T); }
  void run_combine_norm(const bf16* x, int T, const int32_t* topk_ids, const float* topk_weights, const MoeWeights& w,
                        bf16* out, float* residual, const bf16* norm_w, float eps, bf16* xn_out, void* workspace,
                        cudaStream_t stream) override;
  void run_residual(const bf16* x, int T, const int32_t* topk_ids, const float* topk_weights, const MoeWeights& w,
                    bf16* out, float* residual, float* partials, void* workspace, cudaStream_t stream) override;

 protected:
  std::string set_ready(const moe_kernels::KernelTable& t, const MoeShape& shape);  // "" or why not
  BackendSpec spec_;
  moe_kernels::KernelTable table_{};
  MoeShape shape_;
  DeviceCounters counters_;
  bool ready_ = false;
};

// Relative error allowed against the f32 CPU reference: the GPU paths round the SwiGLU output (and the fused
// path each weighted expert output) to BF16, about 2^-9 relative each.
constexpr double kMoeSelfTestTolerance = 2e-2;
// out[T, H] (f32) = sum_j weights[t, j] * expert_{ids[t, j]}(x[t]) on the CPU (kernels::linear, f32 math on the
// BF16 values). gate_up: [E, 2I, H], down: [E, H, I], bf16 bits; ids < 0 are skipped.
void moe_cpu_reference(const uint16_t* x, int T, int H, int I, const uint16_t* gate_up, const uint16_t* down,
                       const int32_t* ids, const float* weights, int k, float* out, ThreadPool& pool);
// "" when every |got - want| <= tol * max|want| and nothing is NaN/inf; else the worst element, precisely.
// max_err: the largest |got - want| / max|want|. token_of_row: the token each row stands for, in messages.
std::string moe_compare(const uint16_t* got, const float* want, int T, int H, double tol, double& max_err,
                        const std::vector<int>* token_of_row = nullptr);

// NVRTC: the embedded kernel sources and one compilation to a cubin for `arch` ("sm_90a", "sm_80", ...).
struct JitSource {
  std::string main;                                            // moe_gemm_kernels.cuh
  std::vector<std::pair<std::string, std::string>> headers;  // include name -> text
};
JitSource jit_embedded_source();
// Returns "" and fills `cubin`, or the failure with the first ~2000 characters of the NVRTC log.
std::string jit_compile(const JitSource& src, const std::vector<std::string>& options, std::string& cubin);
// The NVRTC options the JIT backend compiles with for `arch` (e.g. "sm_90a") and these shapes; depth_variants: also
// the down GEMV's other ring depths (moe_down_gemv_s2 / s3 / s4).
std::vector<std::string> jit_options(const std::string& arch, const MoeShape& shape, bool depth_variants);
// "sm_90a" for compute capability 9.0 (the arch-specific variant: the same target the AOT build uses), else "sm_XY".
std::string jit_arch_for(const DeviceInfo& dev);

}  // namespace moeserve::cuda
