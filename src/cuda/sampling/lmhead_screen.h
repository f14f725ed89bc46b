// The lm_head of an all-greedy decode step of 1-64 rows without logprobs, as an exact screen (lmhead_screen.cu;
// the bound in lmhead_screen_math.h): an int8 copy of the lm_head (made once by lmhead_screen_quantize) gives every
// row's logit within a proven bound, and only the rows whose bound reaches the best lower bound are evaluated from
// the BF16 weights. ids[m] = argmax over v of the f32 sum x[m] . w[v] (the lowest id on ties), as the lm_head GEMM +
// greedy sampler pick it except where two logits lie within f32 summation noise of each other (as between any two
// GEMM kernels). No logits and no logprob are written. 1-8 rows: three launches (a stream of the int8 rows on
// mma.sync, a pick, a merge); 9-64 rows (sm_90): three (the token rows' fp16 copy, the stream on wgmma, a pick a
// token); programmatic dependents. The executor runs it for all-greedy steps of 1-64 rows without logprobs
// (MOESERVE_LMHEAD_SCREEN=0 turns it off). By default the picks ride in the stream kernels' tails (1-8
// rows: one launch; 9-64 rows: two; session 46, H100: decode1 +0.3%, 64 concurrent +0.3%); MOESERVE_LMHEAD_SCREEN_FOLD=0
// keeps them as their own launches (the launch counts above).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "cuda/common.h"
#include "cuda/device.h"
#include "cuda/sampling/sampling_types.h"

namespace moeserve::cuda {

// 1-8 token rows on sm_80+ (mma.sync f16), 9-64 on sm_90 (wgmma); K a multiple of 128 up to 8,192; vocab < 2^24.
bool lmhead_screen_supported(int rows, int K, int vocab);
// "" when this binary holds the kernels' code for `dev`, else why not.
std::string lmhead_screen_code(const DeviceInfo& dev);
// Device bytes of the int8 copy and its row data (vocab x K + ~8 vocab).
size_t lmhead_screen_weight_bytes(int vocab, int K);
// Writes the int8 copy of w [vocab, K] into screen_weights (lmhead_screen_weight_bytes of device memory).
void lmhead_screen_quantize(const bf16* w, int vocab, int K, void* screen_weights, cudaStream_t stream);
// The largest |w| over the lm_head (A of the bound), read back once after lmhead_screen_quantize (synchronizes).
float lmhead_screen_amax(const void* screen_weights, int vocab, int K, cudaStream_t stream);
// Device memory a launch uses (any 1-64 rows), and its one-time initialization (before the first launch on it: the
// folded form's grid state, which each launch leaves as it found it).
size_t lmhead_screen_workspace_bytes(int vocab, int K);
void lmhead_screen_workspace_init(void* workspace, int vocab, int K, cudaStream_t stream);
// x: [rows, K] bf16 (the final norm's rows), w: [vocab, K] bf16 (the lm_head the copy was made from); out_ids[rows].
void lmhead_screen(const bf16* x, int rows, int K, const bf16* w, const void* screen_weights, float amax_all,
                   int vocab, int32_t* out_ids, void* workspace, cudaStream_t stream);

// Greedy rows under grammar masks (lmhead_screen_masked.cu), after lmhead_screen over the same rows wrote each row's
// argmax over every token to ids: a row whose mask (params[r].mask_row >= 0: its row of `masks`, (vocab + 31) / 32
// words, bit t % 32 of word t / 32 set where token t may be picked) refuses that argmax gets ids[r] = the argmax over
// its allowed tokens of the f32 sum x[r] . w[v] (the lowest id on ties), evaluated as the screen's picks evaluate
// theirs from the allowed tokens' BF16 weight rows alone; the other rows keep theirs (the argmax over every token is
// the argmax over any set holding it). A mask that allows no token leaves the row's id. workspace: the bytes below,
// zeroed once before the first launch (each launch leaves it zeroed). Two launches, programmatic dependents.
// picked = false: no screen ran, ids hold nothing - every masked row gets the argmax over its allowed tokens (token 0
// where it allows none), the unmasked rows' ids are left as they are (for steps whose every mask allows few tokens:
// their rows read instead of the screen's 311 MB). Any number of rows.
size_t lmhead_screen_masked_workspace_bytes(int max_rows);
void lmhead_screen_masked(const bf16* x, int rows, int K, const bf16* w, int vocab, const uint32_t* masks,
                          const SampleRowParams* params, int32_t* ids, void* workspace, cudaStream_t stream,
                          bool picked = true);
// The logits [rows, vocab] f32 of rows whose every allowed token is known (lmhead_screen_masked's masks and params):
// each allowed token's exact logit (as lmhead_screen_masked evaluates it), -inf for every other token and for every
// token of an unmasked row - for the general sampler where every row's mask is small (it then reads the allowed
// tokens' weight rows instead of the whole lm_head; its penalties, biases, temperature and filters act on the same
// values over the allowed set). Any number of rows; two launches, programmatic dependents.
void lmhead_masked_logits(const bf16* x, int rows, int K, const bf16* w, int vocab, const uint32_t* masks,
                          const SampleRowParams* params, float* logits, cudaStream_t stream);

// The screen for sampled steps of 1-64 rows (lmhead_screen_topk.cu's draw after the screen and a top-k pick; 9-64 rows on
// sm_90: the wide stream writing every row's a + B and a pick block a (vocabulary slice, token)): every row
// greedy (temperature 0, top_k 1 or min_p > 1) or sampling with top_k in 1..kLmheadScreenMaxTopK, without penalties,
// logit biases, bans, logprobs or forced rows - the common chat request (Qwen3's generation_config: top_k 20, top_p
// 0.95, temperature 0.6). A row's sampling distribution then depends only on the exact logits of its top k: the screen
// keeps every row whose upper bound reaches the k-th largest of the blocks' lower bounds (at least k rows lie at or
// above it), the pick evaluates those exactly and keeps each block's best k, and the draw runs the GPU sampler's own
// set path (sampling_kernel.cuh's draw_in_set: the same filters and fixed-point masses, the token drawn in vocabulary
// order) on the merged candidates - the token sample() draws from logits equal to the exact pass's. params: [rows]
// device (temperature, top_k, top_p, min_p, random of each row); out_ids[rows].
constexpr int kLmheadScreenMaxTopK = 64;
bool lmhead_screen_topk_supported(int rows, int K, int vocab);
void lmhead_screen_topk(const bf16* x, int rows, int K, const bf16* w, const void* screen_weights, float amax_all,
                        int vocab, const SampleRowParams* params, int32_t* out_ids, void* workspace,
                        cudaStream_t stream);
// Tests: the candidates the last lmhead_screen_topk launch on `workspace` passed to its draw, per token row (id,
// exact logit), in pick-block order (synchronizes).
std::vector<std::vector<std::pair<int, float>>> lmhead_screen_topk_candidates(const void* workspace, int rows,
                                                                              int vocab, int K);

// Diagnostics of the last 9-64-row launch on `workspace` (synchronizes): the longest list of rows a (token, block)
// and how many (token, block) lists overflowed (each overflow makes the pick evaluate all rows of that block).
struct LmheadScreenLists {
  int longest = 0, overflowed = 0;
};
LmheadScreenLists lmhead_screen_wide_lists(const void* workspace, int rows, int K, int vocab);

}  // namespace moeserve::cuda
