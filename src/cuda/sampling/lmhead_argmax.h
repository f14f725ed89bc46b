// The lm_head of an all-greedy decode step with the argmax in its epilogue
// (lmhead_argmax.cu): ids[m] = argmax over v of x[m] . w[v] (f32 sums of bf16 products; the lowest id on ties) and
// its raw logprob, without writing the logits. Two launches (the GEMM, a merge), programmatic dependents. The executor runs it for
// all-greedy steps of 32-64 rows on sm_90 (GpuExecutor::head_argmax_for; MOESERVE_LMHEAD_ARGMAX=0 turns it off).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "cuda/common.h"
#include "cuda/device.h"

namespace moeserve::cuda {

// sm_90 only; 1-64 token rows; K a multiple of 8 and at least 64 (x and w rows 16-byte aligned, K contiguous).
bool lmhead_argmax_supported(int rows, int K, int vocab);
// "" when this binary holds the kernels' code for `dev`, else why not (check_kernel_present's words).
std::string lmhead_argmax_code(const DeviceInfo& dev);
int lmhead_argmax_units(int vocab);  // vocabulary units (192 rows each)
// Device memory the launch writes its (token, unit) states into: max_rows x units states.
size_t lmhead_argmax_workspace_bytes(int max_rows, int vocab);
// x: [rows, K] bf16, w: [vocab, K] bf16; out_ids[rows]; out_logprobs[rows] or nullptr.
void lmhead_argmax(const bf16* x, int rows, int K, const bf16* w, int vocab, int32_t* out_ids, float* out_logprobs,
                   void* workspace, cudaStream_t stream);

}  // namespace moeserve::cuda
