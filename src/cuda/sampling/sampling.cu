// GPU sampling (sampling.h): the 512-thread form of the kernel (sampling_launch.cuh) and the choice between it and the
// 256-thread form (sampling_256.cu).
#include <algorithm>

#include "core/env.h"
#include "cuda/device.h"
#include "cuda/sampling/sampling_launch.cuh"

namespace moeserve::cuda {

void sample_in_256_thread_blocks(const SampleArgs& a, cudaStream_t stream);  // sampling_256.cu

namespace {

size_t align256(size_t n) { return (n + 255) / 256 * 256; }

}  // namespace

size_t sample_workspace_bytes(int rows, int vocab) {
  // One f32 slot per token and row; only the penalised and banned tokens' slots are ever written.
  return align256(size_t(std::max(rows, 0)) * size_t(std::max(vocab, 0)) * sizeof(float));
}

void sample(const SampleArgs& a, cudaStream_t stream) {
  MS_CHECK(a.rows >= 0, "sample: rows = {}", a.rows);
  if (a.rows == 0) return;
  MS_CHECK(a.vocab > 0 && a.vocab < (1 << 24), "sample: vocabulary size {} outside 1 .. 2^24 - 1", a.vocab);
  MS_CHECK(a.logits && a.params && a.out_ids && a.workspace, "sample: logits, params, out_ids and workspace are required");
  MS_CHECK(a.max_top >= 0 && a.max_top <= sampling_detail::kMaxTop, "sample: max_top {} outside 0 .. {}", a.max_top,
           sampling_detail::kMaxTop);
  MS_CHECK(a.max_top == 0 || (a.top_ids && a.top_logprobs), "sample: max_top {} without top_ids / top_logprobs",
           a.max_top);
  // One wave of the 512-thread form holds SMs / 8 rows (one block an SM); beyond it, the 256-thread form (two blocks an
  // SM) runs twice the rows a wave. MOESERVE_SAMPLE_WIDE_FROM=n: the 256-thread form from n rows (1: always, a large
  // n: never; A/B switch).
  static const int sms = current_device_multiprocessors();  // one device per process
  static const int64_t wide_from = env_int("MOESERVE_SAMPLE_WIDE_FROM", sms / sampling_detail::kClusterBlocks + 1, 1,
                                           INT32_MAX);
  if (a.rows >= wide_from) sample_in_256_thread_blocks(a, stream);
  else sampling_detail::launch_sample(a, stream);
}

}  // namespace moeserve::cuda
