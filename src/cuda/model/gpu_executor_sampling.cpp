// The CUDA executor's samplers (the general one, the all-greedy fast path, the lm_head argmax and screen) and the
// capture of its decode CUDA graphs; the rest of GpuExecutor is in gpu_executor.cpp.
#include "cuda/model/gpu_executor_impl.h"

#include <algorithm>
#include <vector>

#include "core/log.h"
#include "cuda/sampling/greedy.h"
#include "cuda/sampling/lmhead_argmax.h"
#include "cuda/sampling/lmhead_screen.h"
#include "cuda/sampling/sampling.h"
#include "cuda/sampling/score.h"

namespace moeserve::cuda::executor_detail {

void GpuExecutor::run_sampling(StepBuffers& b, int r0, int rows, int step_rows, bool with_penalties) {
  SampleArgs a;
  a.logits = model_->logits();
  a.rows = rows;
  a.vocab = int(cfg_.vocab_size);
  a.params = reinterpret_cast<const SampleRowParams*>(b.meta.get() + layout_->params_at(step_rows)) + r0;
  a.pen_ids = with_penalties ? pen_ids_.get() : nullptr;
  a.pen_counts = with_penalties ? pen_counts_.get() : nullptr;
  a.ban_ids = with_penalties ? ban_ids_.get() : nullptr;
  a.ban_values = with_penalties ? ban_values_.get() : nullptr;
  a.allowed = b.masks.get();  // (every step: the general sampler's graphs take constrained rows)
  a.max_top = kMaxTop;
  a.out_ids = b.out_ids.get() + r0;
  a.out_logprobs = b.out_lp.get() + r0;
  a.top_ids = b.top_ids.get() + size_t(r0) * kMaxTop;
  a.top_logprobs = b.top_lp.get() + size_t(r0) * kMaxTop;
  a.out_ranks = b.out_rank.get() + r0;
  a.workspace = sample_ws_.get();
  // Forced rows to score_forced_rows, the others to sample() (which skips forced rows).
  MS_CHECK(r0 >= 0 && size_t(r0 + rows) < forced_before_.size(), "sampling rows {} .. {} of a step of {}", r0,
           r0 + rows, forced_before_.size() - 1);
  const int forced = forced_before_[size_t(r0 + rows)] - forced_before_[size_t(r0)];
  if (forced > 0) score_forced_rows(a, stream_);
  if (forced < rows) sample(a, stream_);
}

void GpuExecutor::sample_rows(StepBuffers& b, int r0, int rows, int step_rows, int kind, bool with_penalties,
                              bool head_argmax) {
  const bool greedy = kind == kGreedy || kind == kGreedyLogprob;
  MS_CHECK(!head_argmax || (r0 == 0 && rows == step_rows), "the lm_head + argmax sampler over a slice of a step");
  if (kind == kTopK && head_argmax)
    lmhead_screen_topk(model_->head_rows(), rows, int(cfg_.hidden_size), model_->head_weight(), screen_weights_.get(),
                       screen_amax_, int(cfg_.vocab_size),
                       reinterpret_cast<const SampleRowParams*>(b.meta.get() + layout_->params_at(step_rows)),
                       b.out_ids.get(), screen_ws_.get(), stream_);
  else if (kind == kGreedy && head_argmax && screen_for(rows))
    lmhead_screen(model_->head_rows(), rows, int(cfg_.hidden_size), model_->head_weight(), screen_weights_.get(),
                  screen_amax_, int(cfg_.vocab_size), b.out_ids.get(), screen_ws_.get(), stream_);
  else if (greedy && head_argmax)
    lmhead_argmax(model_->head_rows(), rows, int(cfg_.hidden_size), model_->head_weight(), int(cfg_.vocab_size),
                  b.out_ids.get(), b.out_lp.get(), head_argmax_ws_.get(), stream_);
  else if (greedy)
    sample_greedy(model_->logits(), rows, int(cfg_.vocab_size), b.out_ids.get() + r0, b.out_lp.get() + r0, stream_,
                  greedy_ws_.get());
  else run_sampling(b, r0, rows, step_rows, with_penalties);
}

void GpuExecutor::record_decode(int bs, StepInputs& in, int kind) {
  if (kind >= kSampleGeneral) {  // after kForward's graph
    sample_after_forward(buf_[cur_], in, bs, kind, false);
    return;
  }
  in.head_argmax = kind == kForward || (kind != kGeneral && head_argmax_for(bs, kind));
  model_->forward(in, stream_);
  if (kind != kForward) sample_rows(buf_[cur_], 0, bs, bs, kind, false, in.head_argmax);
}

void GpuExecutor::sample_after_forward(StepBuffers& b, const StepInputs& in, int rows, int kind,
                                       bool with_penalties) {
  if (kind == kSampleMaskedGreedy || kind == kSampleMaskedOnly) {
    const int H = int(cfg_.hidden_size), V = int(cfg_.vocab_size);
    const bool picked = kind == kSampleMaskedGreedy;
    if (picked)
      lmhead_screen(model_->head_rows(), rows, H, model_->head_weight(), screen_weights_.get(), screen_amax_, V,
                    b.out_ids.get(), screen_ws_.get(), stream_);
    lmhead_screen_masked(model_->head_rows(), rows, H, model_->head_weight(), V, b.masks.get(),
                         reinterpret_cast<const SampleRowParams*>(b.meta.get() + layout_->params_at(rows)),
                         b.out_ids.get(), screen_masked_ws_.get(), stream_, picked);
    return;
  }
  if (kind == kSampleSparse)
    lmhead_masked_logits(model_->head_rows(), rows, int(cfg_.hidden_size), model_->head_weight(), int(cfg_.vocab_size),
                         b.masks.get(),
                         reinterpret_cast<const SampleRowParams*>(b.meta.get() + layout_->params_at(rows)),
                         model_->logits(), stream_);
  else
    model_->head_logits(in, stream_);
  sample_rows(b, 0, rows, rows, kGeneral, with_penalties, false);
}

void GpuExecutor::capture_graphs() {
  std::vector<int> sizes = cuda_graph_sizes(opts_);
  sizes.erase(std::remove_if(sizes.begin(), sizes.end(),
                             [&](int b) { return b > layout_->max_seqs || b > layout_->max_tokens; }),
              sizes.end());
  if (sizes.empty()) return;
  const double t0 = now_s();
  size_t free0 = 0, free1 = 0, total = 0;
  MS_CUDA_CHECK(cudaStreamSynchronize(stream_));
  MS_CUDA_CHECK(cudaMemGetInfo(&free0, &total));
  // A dummy decode batch: every sequence holds one token in page 0 (its slot is not written).
  std::vector<int32_t> page0(1, 0);
  for (int bs : sizes) {  // largest first
    ForwardBatch fb;
    std::vector<SampleSpec> specs(static_cast<size_t>(bs));
    for (int i = 0; i < bs; ++i) {
      fb.tokens.push_back(0);
      fb.positions.push_back(0);
      fb.seqs.push_back({page0.data(), 0, 1, i});
      fb.logit_rows.push_back(i);
      specs[size_t(i)].sampler.temperature = 0.0f;
    }
    for (cur_ = 0; cur_ < 2; ++cur_) {  // a graph for each buffer set
      StepInputs in = prepare(fb, specs, bs, stream_);
      // The dummy must not write into page 0 of a live cache: no slots.
      int32_t* slots = reinterpret_cast<int32_t*>(host_meta() + layout_->slots);
      for (int i = 0; i < bs; ++i) slots[i] = -1;
      upload_meta(stream_, layout_->block_tables + size_t(bs) * size_t(layout_->max_pages) * 4);
      for (int kind = 0; kind < kSamplerKinds; ++kind) {
        if (kind == kGreedyLogprob && !screen_for(bs)) continue;  // the same graph as kGreedy's
        if (kind == kTopK && !screen_topk_for(bs)) continue;     // kGeneral's
        if (kind == kSampleMaskedGreedy && !(be_.lmhead_screen && screen_for(bs))) continue;
        if ((kind == kSampleMaskedOnly || kind == kSampleSparse) && !be_.lmhead_screen) continue;  // (ships with it)
        record_decode(bs, in, kind);  // eager warm-up: libraries pick algorithms, load modules outside capture
        MS_CUDA_CHECK(cudaStreamSynchronize(stream_));
        cudaGraph_t g = nullptr;
        MS_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
        try {
          record_decode(bs, in, kind);
        } catch (...) {
          cudaStreamEndCapture(stream_, &g);
          if (g) cudaGraphDestroy(g);
          cur_ = 0;
          throw;
        }
        MS_CUDA_CHECK(cudaStreamEndCapture(stream_, &g));
        cudaGraphExec_t exec = nullptr;
        MS_CUDA_CHECK(cudaGraphInstantiate(&exec, g, 0));
        cudaGraphDestroy(g);
        buf_[cur_].graphs[kind][bs] = exec;
      }
    }
    cur_ = 0;
  }
  MS_CUDA_CHECK(cudaStreamSynchronize(stream_));
  MS_CUDA_CHECK(cudaMemGetInfo(&free1, &total));
  log_info("CUDA graphs: {} decode batch sizes ({}..{}), each with the general and the greedy sampler for both "
           "buffer sets ({} with a greedy form that writes logprobs beside the lm_head screen's, {} with the screen for "
           "sampled steps; the general one also as forward and sampler apart, for grammar masks computed while the "
           "forward runs), captured in {:.2f} s, {}",
           buf_[0].graphs[kGeneral].size(), sizes.back(), sizes.front(), buf_[0].graphs[kGreedyLogprob].size(),
           buf_[0].graphs[kTopK].size(),
           now_s() - t0,
           format_bytes(free0 > free1 ? free0 - free1 : 0));
}

}  // namespace moeserve::cuda::executor_detail
