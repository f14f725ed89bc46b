// The CUDA executor's class and the step layouts it needs, shared by its two translation units: gpu_executor.cpp
// (construction, step metadata, launch and collection) and gpu_executor_sampling.cpp (the samplers and the capture
// of the decode CUDA graphs). Internal to src/cuda/model.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/threadpool.h"
#include "cuda/model/gpu_executor.h"
#include "cuda/model/gpu_model.h"
#include "cuda/runtime/allocator.h"
#include "cuda/sampling/lmhead_argmax.h"
#include "cuda/sampling/lmhead_screen.h"
#include "cuda/sampling/sampling.h"

namespace moeserve::cuda::executor_detail {

inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

inline constexpr int kMaxTop = 20;      // top logprobs per row computed on the GPU (OpenAI allows up to 20)
inline constexpr int kMaxSplits = 16;   // split-KV parts of a decode sequence
// The fewest logit rows the lm_head's logits (and the sampler's workspace) hold, f32 each: 2 x 156 MB at a 151,936-token
// vocabulary. A prompt-logprob step runs its lm_head in slices of them; on an H100 the 151936 x 2048 lm_head costs
// 1.94 us a row in slices of 128, 1.10 in slices of 256, 0.89 in slices of 512 (docs/PERF.md session 53).
inline constexpr int kMinHeadRows = 256;
// How a step samples (and which set of captured graphs it replays): the general sampler; the all-greedy fast path (the
// lm_head screen at the sizes it takes); the all-greedy fast path where a row wants a logprob (no screen); the lm_head
// screen for sampled steps (lmhead_screen_topk: 1-64 rows, each greedy or with top_k in 1..64, no logprobs). And for
// steps whose grammar masks come while the forward runs (Executor::launch's `later`), the forward apart (up to the
// lm_head's input rows), then, once the masks are up, the lm_head and the general sampler, or for all-greedy steps of
// the screen's sizes the lm_head screen and the masked rows' argmax over their allowed tokens (lmhead_screen_masked),
// or, all-greedy with every row's mask allowing at most kMaskedOnlyTokens tokens, that argmax alone (no screen); or,
// sampled with every row's mask that small and no logprobs, the allowed tokens' logits alone (-inf elsewhere) and the
// general sampler (lmhead_masked_logits).
enum SamplerKind {
  kGeneral = 0,
  kGreedy = 1,
  kGreedyLogprob = 2,
  kTopK = 3,
  kForward = 4,
  kSampleGeneral = 5,
  kSampleMaskedGreedy = 6,
  kSampleMaskedOnly = 7,
  kSampleSparse = 8,
  kSamplerKinds = 9
};
// The most tokens a step's masks may allow, all rows together, for it to skip the screen (kSampleMaskedOnly) or the
// lm_head (kSampleSparse): each allowed token of each row is a warp dot over its weight row (4 KB at hidden 2,048).
// H100, q30b8l's lm_head (test_gpu_lmhead_screen DISABLED_MaskedTiming, docs/PERF.md session 62): the pick costs
// ~8 us + ~2.5 ns a token whatever the rows, the screen 109 us at 1 row and 122 at 16, the lm_head GEMV ~190. A JSON
// structure state allows 4-267 tokens, a free string ~150 k.
inline constexpr int64_t kMaskedOnlyTokens = 32768;

inline size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

// A step's samples in its buffer set's pinned host_out, for R rows: ids, logprobs, top ids, top logprobs, ranks.
struct HostOut {
  static size_t bytes(int R) { return size_t(R) * (12 + size_t(kMaxTop) * 8); }
  int32_t* ids;
  float* lps;
  int32_t* tids;
  float* tlps;
  int32_t* ranks;
  HostOut(void* base, int R) {
    char* h = static_cast<char*>(base);
    ids = reinterpret_cast<int32_t*>(h);
    lps = reinterpret_cast<float*>(h + size_t(R) * 4);
    tids = reinterpret_cast<int32_t*>(h + size_t(R) * 8);
    tlps = reinterpret_cast<float*>(h + size_t(R) * 8 + size_t(R) * kMaxTop * 4);
    ranks = reinterpret_cast<int32_t*>(h + size_t(R) * 8 + size_t(R) * kMaxTop * 8);
  }
};

// Offsets of the per-step inputs inside one host (pinned) and one device buffer, so that a step uploads them
// with a single copy and the captured graphs always find them at the same device addresses. A step of more than
// max_rows logit rows (prompt logprobs: up to a row a token) keeps its rows and sampling parameters in the wide
// region after the block tables, copied only by such steps, so that every other step's copy stays as small.
struct MetaLayout {
  size_t tokens, prev_rows, positions, slots, kv_lens, new_lens, q_rows, logit_rows, params, block_tables;
  size_t wide_logit_rows, wide_params, end;
  int max_tokens, max_seqs, max_rows, max_pages;
  MetaLayout(int T, int S, int R, int P) : max_tokens(T), max_seqs(S), max_rows(R), max_pages(P) {
    size_t o = 0;
    auto take = [&](size_t bytes) {
      size_t at = o;
      o = align_up(o + bytes, 256);
      return at;
    };
    tokens = take(size_t(T) * 4);
    prev_rows = take(size_t(T) * 4);
    positions = take(size_t(T) * 4);
    slots = take(size_t(T) * 4);
    kv_lens = take(size_t(S) * 4);
    new_lens = take(size_t(S) * 4);
    q_rows = take(size_t(S) * 4);
    logit_rows = take(size_t(R) * 4);
    params = take(size_t(R) * sizeof(SampleRowParams));
    block_tables = take(size_t(S) * size_t(P) * 4);
    wide_logit_rows = take(size_t(T) * 4);
    wide_params = take(size_t(T) * sizeof(SampleRowParams));
    end = o;
  }
  // Where a step of R logit rows keeps them and their sampling parameters.
  size_t rows_at(int R) const { return R > max_rows ? wide_logit_rows : logit_rows; }
  size_t params_at(int R) const { return R > max_rows ? wide_params : params; }
};

class GpuExecutor : public Executor {
 public:
  GpuExecutor(const std::string& model_dir, const GpuOptions& opts);
  ~GpuExecutor() override;
  const ModelConfig& config() const override { return cfg_; }
  KVPool& kv() override { return *kv_; }
  void step(const ForwardBatch& batch, const std::vector<SampleSpec>& specs, std::vector<Sampled>& out) override;
  using Executor::launch;
  void launch(const ForwardBatch& batch, const std::vector<SampleSpec>& specs,
              const std::vector<int32_t>& later) override;
  void complete_launch(std::vector<std::vector<uint32_t>>& masks) override;
  void collect(std::vector<Sampled>& out) override;
  void drop_launched() override;
  void forward_logits(const ForwardBatch& batch, std::vector<float>& logits) override;
  std::string device_name() const override { return fmt::format("cuda:{} ({})", dev_.index, dev_.name); }
  size_t active_weight_bytes() const override { return active_bytes_; }
  nlohmann::json info() const override;
  std::string profile_step(const ForwardBatch& batch) override;
  int64_t max_top_logprobs() const override { return kMaxTop; }
  // A row a token: steps of more rows than the lm_head's logits hold run it and the sampler in slices.
  int64_t max_logit_rows() const override { return layout_ ? layout_->max_tokens : 1; }

 private:
  struct StepBuffers;  // (below: a step's inputs and outputs, two sets)
  // Fills buffer set `cur_`'s metadata for a batch and uploads it on `upload`; returns the step inputs. pad_to > T
  // pads a decode batch for a graph. `later` (ascending logit rows, may be null): masked rows whose masks come with
  // complete_launch() (their mask rows in later_mask_rows_; no mask is uploaded then).
  StepInputs prepare(const ForwardBatch& batch, const std::vector<SampleSpec>& specs, int pad_to,
                     cudaStream_t upload, const std::vector<int32_t>* later = nullptr);
  // Copies the first `bytes` of the metadata, then the first table_pages entries of table_rows block-table rows.
  void upload_meta(cudaStream_t s, size_t bytes, int table_rows = 0, int table_pages = 0);
  void run_sampling(StepBuffers& b, int r0, int rows, int step_rows, bool with_penalties);
  // The step's sampler over `rows` logit rows into buffer set b's outputs (b's parameters and masks): the all-greedy
  // fast path or the general one.
  // `kind` (SamplerKind): general, greedy, or greedy with a logprob (never the lm_head screen, which writes none).
  // r0 / step_rows: rows [r0, r0 + rows) of a step of step_rows rows, whose logits are logits()' first `rows`.
  void sample_rows(StepBuffers& b, int r0, int rows, int step_rows, int kind, bool with_penalties,
                   bool head_argmax = false);
  // After forward(in): f(r0, n) with logit rows [r0, r0 + n) in logits()' first n rows - once over all of in's rows,
  // or, when in.head_in_chunks, slice by slice of the logits' rows after head_chunk().
  template <class F>
  void over_head_slices(const StepInputs& in, F f);
  // Whether an all-greedy step of `rows` logit rows runs the lm_head inside the sampler (StepInputs::head_argmax):
  // at 32-64 rows on sm_90 (MOESERVE_LMHEAD_ARGMAX=0 turns it off). H200, session 40 (test_gpu_lmhead_argmax's
  // Timing, q30b8l's lm_head): 167.3 us flat from 16 to 64 rows against cuBLAS + greedy 166.1 / 174.7 / 186.1 at
  // 16 / 32 / 64 rows, 162.2 against 155.8 at one row.
  // Or, at 1-64 rows without logprobs, the lm_head screen (lmhead_screen.h; on by default since session 45,
  // MOESERVE_LMHEAD_SCREEN=0 off; it takes 32-64 rows from lmhead_argmax): a greedy step that wants a logprob is of
  // kind kGreedyLogprob, which never takes the screen.
  bool head_argmax_for(int rows, int kind) const {
    return (head_argmax_ws_.bytes() > 0 && rows >= 32 &&
            lmhead_argmax_supported(rows, int(cfg_.hidden_size), int(cfg_.vocab_size))) ||
           (kind == kGreedy && screen_for(rows)) || (kind == kTopK && screen_topk_for(rows));
  }
  bool screen_for(int rows) const {
    return be_.lmhead_screen && screen_ws_.bytes() > 0 &&
           lmhead_screen_supported(rows, int(cfg_.hidden_size), int(cfg_.vocab_size));
  }
  bool screen_topk_for(int rows) const {
    return be_.lmhead_screen_topk && screen_ws_.bytes() > 0 &&
           lmhead_screen_topk_supported(rows, int(cfg_.hidden_size), int(cfg_.vocab_size));
  }
  void capture_graphs();
  void record_decode(int bs, StepInputs& in, int kind);
  // A step with later masks, after its forward (in.head_argmax: head_rows()): the sampler of `kind`
  // (kSampleGeneral: the lm_head + the general sampler; kSampleMaskedGreedy: the screen + lmhead_screen_masked;
  // kSampleMaskedOnly: lmhead_screen_masked without picks; kSampleSparse: lmhead_masked_logits + the general sampler).
  void sample_after_forward(StepBuffers& b, const StepInputs& in, int rows, int kind, bool with_penalties);
  // Waits for everything queued on the compute and both copy streams (launched steps still use the buffers);
  // check: a CUDA error throws (not in the destructor or when dropping steps after a failure).
  void sync_streams(bool check) const;

  GpuOptions opts_;
  DeviceInfo dev_;
  ModelConfig cfg_;
  size_t active_bytes_ = 0;
  cudaStream_t stream_ = nullptr;
  CachingAllocator alloc_;
  std::unique_ptr<ThreadPool> pool_;
  SelectedBackends be_;
  std::unique_ptr<GpuQwen3> model_;
  std::unique_ptr<KVPool> kv_;
  std::unique_ptr<MetaLayout> layout_;
  // Two sets of a step's inputs and outputs, alternating by launched step (the overlap schedule keeps up to two in
  // flight): the next step's metadata is uploaded while the last one runs, and the last one's samples are copied
  // back while the next one runs. Each set has its own CUDA graphs (their kernels read and write its buffers); a
  // step takes the samples of the step before (prev_rows) from the other set's out_ids.
  struct StepBuffers {
    PinnedBuffer host_meta, host_out;
    DeviceArray<uint8_t> meta;
    DeviceArray<int32_t> out_ids, top_ids, out_rank;
    DeviceArray<float> out_lp, top_lp;
    // The step's grammar masks (SampleArgs::allowed), a row a constrained sequence: at a fixed address, so that the
    // general sampler's graphs serve constrained decode steps too.
    PinnedBuffer host_masks;
    DeviceArray<uint32_t> masks;
    cudaEvent_t meta_ready = nullptr;  // upload stream: the metadata is on the device
    cudaEvent_t done = nullptr;        // compute stream: the step that used this set has run
    cudaEvent_t out_ready = nullptr;   // copy-back stream: the samples are in host_out
    // Decode batch size -> graph, by SamplerKind: [kGeneral] ends with the general sampler, [kGreedy] with the
    // all-greedy fast path (the lm_head screen where it applies), [kGreedyLogprob] with the all-greedy fast path that
    // writes a logprob (captured only at the sizes where [kGreedy] holds the screen), [kTopK] with the screen for
    // sampled steps (captured at the sizes it takes); a step with later grammar masks: [kForward] at launch, then
    // [kSampleGeneral] (the lm_head + the general sampler) or, all-greedy at the screen's sizes, [kSampleMaskedGreedy],
    // or, all-greedy with every row's mask small, [kSampleMaskedOnly], or, sampled so, [kSampleSparse] (every size).
    std::map<int, cudaGraphExec_t> graphs[kSamplerKinds];
  };
  StepBuffers buf_[2];
  int cur_ = 0;  // the set the next launch uses
  int mask_rows_ = 0;  // the grammar masks in the step being launched (buf_[cur_].host_masks' rows)
  std::vector<int> later_mask_rows_;  // of those, the rows whose masks come with complete_launch()
  StepInputs deferred_in_;  // the inputs of the step launched with later masks (its eager sampler needs them)
  size_t mask_words() const { return (size_t(cfg_.vocab_size) + 31) / 32; }
  // A grammar mask (SampleSpec::allowed; empty: every token) into row `row` of b's host masks, no token past the
  // vocabulary.
  void write_mask(StepBuffers& b, int row, const std::vector<uint32_t>& allowed) const;
  char* host_meta() { return static_cast<char*>(buf_[cur_].host_meta.get()); }
  cudaStream_t upload_stream_ = nullptr, download_stream_ = nullptr;
  // Penalty inputs (one set: a step with penalties orders its upload after both sets' steps) and the sampler's
  // workspace (used on the compute stream only).
  DeviceArray<int32_t> pen_ids_, pen_counts_, ban_ids_;
  DeviceArray<float> ban_values_;
  DeviceArray<uint8_t> sample_ws_, greedy_ws_, head_argmax_ws_;
  // The lm_head screen's int8 copy of the lm_head, its largest |w| and its workspace (be_.lmhead_screen).
  DeviceArray<uint8_t> screen_weights_, screen_ws_, screen_masked_ws_;
  float screen_amax_ = 0.0f;
  struct Launched {
    std::vector<int> top_n;  // top logprobs wanted per sampled row (its size: the rows)
    bool want_lp = false, want_rank = false, want_top = false;
    int buf = 0;
    bool side = false;  // its copies on the side streams
    int rows() const { return int(top_n.size()); }
    // Launched with later masks: only its forward is enqueued; complete_launch() enqueues the rest.
    bool pending = false;
    int graph_bs = 0, mask_rows = 0;
    bool pen = false;  // its sampler reads the penalty / ban arrays
    bool greedy = false;  // every row greedy without logprobs, whatever the masks: the masked greedy forms
    bool sparse = false;  // no logprobs: the allowed tokens' logits suffice where every mask is small
    std::vector<int> later_mask_rows;
  };
  // The end of a launched step on the streams: the set's done event, the samples' copies back, out_ready.
  void enqueue_copies_back(const Launched& l);
  std::deque<Launched> in_flight_;
  std::vector<int32_t> h_pen_ids_, h_pen_counts_, h_ban_ids_;
  std::vector<float> h_ban_values_;  // beside h_ban_ids_: the logit_bias value, -inf for a ban
  std::vector<uint32_t> ban_mark_;    // per token: ban_stamp_ where the row being filled has banned it
  uint32_t ban_stamp_ = 0;
  // The step being launched: forced_before_[r] = its forced rows (scored prompt positions) before row r, r <= rows.
  std::vector<int32_t> forced_before_;
  StepProfile profile_;
};

}  // namespace moeserve::cuda::executor_detail
