#include "cuda/model/gpu_executor.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <unordered_map>

#include <fmt/format.h>

#include "core/env.h"
#include "core/log.h"
#include "core/threadpool.h"
#include "cuda/model/gpu_executor_impl.h"
#include "cuda/model/gpu_model.h"
#include "cuda/runtime/allocator.h"
#include "cuda/sampling/greedy.h"
#include "cuda/sampling/lmhead_argmax.h"
#include "cuda/sampling/lmhead_screen.h"
#include "cuda/sampling/sampling.h"
#include "model/arch/qwen3.h"

namespace moeserve::cuda {

namespace {

// Experiment (MOESERVE_META_2D=0 turns it off for A/B): each step copies only the used part of every block-table
// row (one 2-D copy) instead of whole rows.
bool meta_2d_copy() {
  static const bool on = env_flag("MOESERVE_META_2D", true);
  return on;
}

// A/B switch (MOESERVE_STEP_STREAMS=0: off): the metadata upload and the samples' copy back of a step launched while
// another is in flight run on two side streams ordered by events, so that the compute stream holds nothing but the
// steps' kernels and the next step's graph starts as soon as the last one ends (H200, q30b8l decode at bs 1: the gap
// between two steps' kernels 23.6 -> 2.1 us, the overlapped step 591-595 -> 576 us). Off: both on the compute
// stream.
bool side_stream_copies() {
  static const bool on = env_flag("MOESERVE_STEP_STREAMS", true);
  return on;
}

}  // namespace

namespace executor_detail {

GpuExecutor::GpuExecutor(const std::string& model_dir, const GpuOptions& opts) : opts_(opts) {
  const double t_start = now_s();
  auto devs = list_devices();
  if (devs.empty())
    throw_user("--device cuda: no CUDA GPU is visible (check the driver with nvidia-smi, CUDA_VISIBLE_DEVICES)");
  if (opts_.device < 0 || opts_.device >= int(devs.size()))
    throw_user("GPU {} does not exist; this machine has {} GPU(s)", opts_.device, devs.size());
  dev_ = devs[size_t(opts_.device)];
  MS_CUDA_CHECK(cudaSetDevice(dev_.index));
  MS_CUDA_CHECK(cudaMemGetInfo(&dev_.free_memory, &dev_.total_memory));
  log_info("GPU {}: {} ({}), {} SMs, {} total, {} free", dev_.index, dev_.name, sm_name(sm_version(dev_)),
           dev_.multiprocessors, format_bytes(dev_.total_memory), format_bytes(dev_.free_memory));
  MS_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  MS_CUDA_CHECK(cudaStreamCreateWithFlags(&upload_stream_, cudaStreamNonBlocking));
  MS_CUDA_CHECK(cudaStreamCreateWithFlags(&download_stream_, cudaStreamNonBlocking));
  pool_ = std::make_unique<ThreadPool>(opts_.threads);

  // Weights: the CPU loader validates and maps the checkpoint; the GPU model copies from its views.
  {
    std::unique_ptr<CausalLM> cpu = load_model(model_dir);
    auto* q = dynamic_cast<Qwen3Model*>(cpu.get());
    if (!q) throw_user("--device cuda: architecture {} has no GPU implementation yet", cpu->config().architecture);
    cfg_ = q->config();
    active_bytes_ = cpu->active_weight_bytes();
    double t0 = now_s();
    model_ = std::make_unique<GpuQwen3>(*q, alloc_, stream_, *pool_);
    double dt = now_s() - t0;
    log_info("weights: {} on the GPU in {:.1f} s ({:.1f} GB/s)", format_bytes(model_->weight_bytes()), dt,
             double(model_->weight_bytes()) / std::max(dt, 1e-9) / 1e9);
  }  // the host-side mappings are released here

  // Step limits: every buffer (and the MoE backends' workspaces) is planned for the largest step.
  const int max_seqs = int(std::max<int64_t>(opts_.max_running_requests, 1));
  const int max_tokens = int(std::max<int64_t>(opts_.max_tokens_per_step, max_seqs));
  // The lm_head's logits rows: a step of more (prompt logprobs) runs the lm_head and the sampler in slices of these,
  // each slice reading the whole lm_head: at least kMinHeadRows.
  const int max_rows = std::min(std::max(max_seqs, kMinHeadRows), max_tokens);

  // Backends for this model's shapes.
  be_ = select_backends(dev_, model_shapes(cfg_, max_tokens), opts_.backends);
  ModelBackends mb{be_.gemm, be_.moe, be_.attention == "reference_paged"};
  // Opt-in (MOESERVE_FUSED_DECODE=1): on the H200 the fused norm prologues cost more than the launches they
  // save (served q30b8l decode step at batch 1: 829.9 us fused, 786.2 us without; docs/PERF.md).
  mb.fused_small_steps = be_.gemm->spec().name == "gemv" && env_flag("MOESERVE_FUSED_DECODE", false);
  mb.fused_attention_input = env_flag("MOESERVE_ATTN_FUSED_IN", true);
  mb.residual_fusion = env_flag("MOESERVE_RESIDUAL_FUSION", true);
  mb.moe_combine_norm = env_flag("MOESERVE_MOE_COMBINE_NORM", false);
  // Opt-in (MOESERVE_ROUTER_FOLD_MID=1): on the H200 the exact candidates cost what the router launches did (served
  // q30b8l bs 64 +8 to +17 us, 64 concurrent -0.4%; without them -32 us, +0.7%, but routing flips: docs/PERF.md
  // session 36).
  mb.folded_mid_route = env_flag("MOESERVE_ROUTER_FOLD_MID", false);
  if (const char* v = std::getenv("MOESERVE_PROFILE_SKIP_OPS"); v != nullptr && *v != 0) {
    mb.skip_ops = parse_skip_ops(v);
    if (mb.skip_ops != 0)
      log_warn("MOESERVE_PROFILE_SKIP_OPS={}: ops are left out of every step (timing only; outputs are wrong)", v);
  }

  // Activations, metadata and sampling buffers for the largest step.
  const int64_t ctx = cfg_.max_position_embeddings;
  const int max_pages = int((ctx + opts_.page_size - 1) / opts_.page_size + 1);
  size_t before = alloc_.in_use();
  model_->plan_workspace(max_tokens, max_rows, max_seqs, kMaxSplits, mb);
  layout_ = std::make_unique<MetaLayout>(max_tokens, max_seqs, max_rows, max_pages);
  for (StepBuffers& b : buf_) {
    b.host_meta = PinnedBuffer(layout_->end);
    b.host_out = PinnedBuffer(HostOut::bytes(max_tokens));
    b.meta = DeviceArray<uint8_t>(alloc_, layout_->end, "activations");
    MS_CUDA_CHECK(cudaMemset(b.meta.get(), 0, layout_->end));
    // The samples' outputs: a row a token (steps of more rows than max_rows sample them in slices).
    b.out_ids = DeviceArray<int32_t>(alloc_, size_t(max_tokens), "activations");
    b.out_lp = DeviceArray<float>(alloc_, size_t(max_tokens), "activations");
    b.out_rank = DeviceArray<int32_t>(alloc_, size_t(max_tokens), "activations");
    b.top_ids = DeviceArray<int32_t>(alloc_, size_t(max_tokens) * kMaxTop, "activations");
    b.top_lp = DeviceArray<float>(alloc_, size_t(max_tokens) * kMaxTop, "activations");
    b.host_masks = PinnedBuffer(size_t(max_seqs) * mask_words() * 4);
    b.masks = DeviceArray<uint32_t>(alloc_, size_t(max_seqs) * mask_words(), "activations");
    for (cudaEvent_t* e : {&b.meta_ready, &b.done, &b.out_ready})
      MS_CUDA_CHECK(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
  }
  sample_ws_ = DeviceArray<uint8_t>(alloc_, std::max<size_t>(sample_workspace_bytes(max_rows, int(cfg_.vocab_size)), 256),
                                    "activations");
  greedy_ws_ = DeviceArray<uint8_t>(alloc_, greedy_workspace_bytes(), "activations");
  MS_CUDA_CHECK(cudaMemset(greedy_ws_.get(), 0, greedy_ws_.bytes()));
  if (be_.lmhead_argmax)  // select_backends: self-test passed, MOESERVE_LMHEAD_ARGMAX not 0
    head_argmax_ws_ = DeviceArray<uint8_t>(alloc_, lmhead_argmax_workspace_bytes(64, int(cfg_.vocab_size)),
                                           "activations");
  if (be_.lmhead_screen || be_.lmhead_screen_topk) {  // select_backends: self-test passed, switch not 0
    const int V = int(cfg_.vocab_size), H = int(cfg_.hidden_size);
    screen_weights_ = DeviceArray<uint8_t>(alloc_, lmhead_screen_weight_bytes(V, H), "weights");
    lmhead_screen_quantize(model_->head_weight(), V, H, screen_weights_.get(), stream_);
    screen_amax_ = lmhead_screen_amax(screen_weights_.get(), V, H, stream_);
    screen_ws_ = DeviceArray<uint8_t>(alloc_, lmhead_screen_workspace_bytes(V, H), "activations");
    lmhead_screen_workspace_init(screen_ws_.get(), V, H, stream_);
    screen_masked_ws_ = DeviceArray<uint8_t>(alloc_, lmhead_screen_masked_workspace_bytes(max_seqs), "activations");
    MS_CUDA_CHECK(cudaMemsetAsync(screen_masked_ws_.get(), 0, screen_masked_ws_.bytes(), stream_));
    log_info("lm_head screen: an int8 copy of the lm_head ({}) for {}", format_bytes(screen_weights_.bytes()),
             be_.lmhead_screen && be_.lmhead_screen_topk ? "greedy and sampled (top_k <= 64) steps of 1-64 rows"
             : be_.lmhead_screen                         ? "greedy steps of 1-64 rows"
                                                         : "sampled steps of 1-64 rows (top_k <= 64)");
  }
  log_info("activations: {} for steps of up to {} tokens, {} sequences", format_bytes(alloc_.in_use() - before),
           max_tokens, max_seqs);

  // KV cache from the memory fraction: weights + activations + KV <= fraction x total.
  const double frac = opts_.mem_fraction_static > 0 ? opts_.mem_fraction_static : 0.85;
  const size_t per_token = GpuQwen3::kv_bytes_per_token(cfg_);
  size_t free_now = 0, total = 0;
  MS_CUDA_CHECK(cudaMemGetInfo(&free_now, &total));
  const double budget = frac * double(total) - double(alloc_.in_use());
  const size_t reserve = size_t(1) << 30;  // graphs, cuBLAS workspaces, NVRTC modules
  double kv_bytes = std::min(budget, double(free_now) - double(reserve));
  int64_t tokens = kv_bytes > 0 ? int64_t(kv_bytes / double(per_token)) : 0;
  if (opts_.max_total_tokens > 0) {
    if (opts_.max_total_tokens > tokens)
      log_warn("--max-total-tokens {} does not fit in --mem-fraction-static {:.2f}; using {}", opts_.max_total_tokens,
               frac, tokens);
    tokens = std::min(tokens, opts_.max_total_tokens);
  }
  const int64_t pages = tokens / opts_.page_size;
  if (pages < 2)
    throw_user("no GPU memory left for the KV cache after {} of weights and activations (--mem-fraction-static "
               "{:.2f} of {}); raise --mem-fraction-static or use a smaller model",
               format_bytes(alloc_.in_use()), frac, format_bytes(total));
  model_->allocate_kv(pages, int(opts_.page_size));
  // The startup memsets (KV cache, activations, the kernels' zeroed counters) run on the legacy stream, which
  // does not order with the executor's non-blocking stream: finish them before any step or graph warm-up.
  MS_CUDA_CHECK(cudaDeviceSynchronize());
  KVPoolShape ks;
  ks.num_layers = cfg_.num_layers;
  ks.num_pages = pages;
  ks.page_size = opts_.page_size;
  ks.kv_heads = cfg_.num_kv_heads;
  ks.head_dim = cfg_.head_dim;
  kv_ = std::make_unique<KVPool>(ks, /*host_storage=*/false);
  log_info("KV cache: {} tokens in {} pages of {} ({}, bf16)", pages * opts_.page_size, pages, opts_.page_size,
           format_bytes(size_t(pages * opts_.page_size) * per_token));

  // Every library GEMM kernel a prompt step can pick, run once now: the first launch of one inside a served step
  // blocks the host until the device drains (H200 step traces, session 19: one 20-30 ms launch a benchmark run).
  // MOESERVE_GEMM_WARMUP=0 skips it (A/B switch).
  if (env_flag("MOESERVE_GEMM_WARMUP", true)) {
    const double t0 = now_s();
    const int runs = model_->warm_up_gemms(stream_);
    log_info("GEMM warm-up: {} runs over the prompt steps' token counts in {:.2f} s", runs, now_s() - t0);
  }
  if (opts_.disable_cuda_graph) log_info("CUDA graphs: disabled by --disable-cuda-graph");
  else if (!be_.capturable) log_warn("CUDA graphs: skipped (a chosen backend cannot be captured)");
  else capture_graphs();
  log_info("GPU ready in {:.1f} s; memory in use: {}", now_s() - t_start, [&] {
    std::string s;
    for (auto& [part, b] : alloc_.by_part())
      if (b) s += fmt::format("{}{} {}", s.empty() ? "" : ", ", part, format_bytes(b));
    return s;
  }());
}

nlohmann::json GpuExecutor::info() const {
  nlohmann::json b = nlohmann::json::object(), all = nlohmann::json::array();
  for (auto& r : be_.reports) {
    all.push_back({{"backend", r.spec.name}, {"family", op_family_name(r.spec.family)}, {"runnable", r.status.runnable},
                   {"code", r.status.code}, {"reason", r.status.reason}, {"self_test", r.status.self_test},
                   {"trial_us", r.status.trial_us}, {"capturable", r.spec.capturable}});
    if (r.status.chosen)
      b[op_family_name(r.spec.family)] = {{"backend", r.spec.name}, {"reason", r.status.why_chosen}};
  }
  nlohmann::json sizes = nlohmann::json::array();
  for (auto& [bs, g] : buf_[0].graphs[0]) sizes.push_back(bs);
  std::string why = opts_.disable_cuda_graph ? "--disable-cuda-graph"
                    : !be_.capturable        ? "a chosen backend cannot be captured"
                                             : "decode batches padded to the next captured size";
  return {{"device", device_name()},
          {"kernel_backends", b},
          {"backend_reports", all},
          {"cuda_graphs", {{"enabled", !buf_[0].graphs[0].empty()}, {"batch_sizes", sizes}, {"reason", why}}},
          {"kv_cache_tokens", kv_->shape().num_pages * kv_->shape().page_size}};
}

void GpuExecutor::sync_streams(bool check) const {
  for (cudaStream_t s : {stream_, upload_stream_, download_stream_}) {
    if (!s) continue;
    if (check) MS_CUDA_CHECK(cudaStreamSynchronize(s));
    else cudaStreamSynchronize(s);
  }
}

GpuExecutor::~GpuExecutor() {
  sync_streams(false);
  for (StepBuffers& b : buf_) {
    for (cudaEvent_t e : {b.meta_ready, b.done, b.out_ready})
      if (e) cudaEventDestroy(e);
    for (auto& set : b.graphs)
      for (auto& [bs, g] : set) cudaGraphExecDestroy(g);
  }
  for (cudaStream_t s : {stream_, upload_stream_, download_stream_})
    if (s) cudaStreamDestroy(s);
}

StepInputs GpuExecutor::prepare(const ForwardBatch& batch, const std::vector<SampleSpec>& specs, int pad_to,
                                cudaStream_t upload, const std::vector<int32_t>* later) {
  const MetaLayout& L = *layout_;
  const int T = int(batch.tokens.size()), S = int(batch.seqs.size()), R = int(batch.logit_rows.size());
  MS_CHECK(T > 0 && T <= L.max_tokens && S <= L.max_seqs && R <= L.max_tokens,
           "step of {} tokens / {} sequences / {} rows exceeds the executor's plan ({} / {} / {})", T, S, R,
           L.max_tokens, L.max_seqs, L.max_tokens);
  const bool wide = R > L.max_rows;  // (never a graph step: those have a row a sequence)
  MS_CHECK(!wide || pad_to <= T, "a padded step of {} logit rows", R);
  const int Tp = std::max(T, pad_to), Sp = std::max(S, pad_to), Rp = std::max(R, pad_to);
  char* h = host_meta();
  auto arr = [&](size_t off) { return reinterpret_cast<int32_t*>(h + off); };
  int32_t *tok = arr(L.tokens), *prev = arr(L.prev_rows), *pos = arr(L.positions), *slots = arr(L.slots);
  int32_t *kvl = arr(L.kv_lens), *nl = arr(L.new_lens), *qr = arr(L.q_rows), *lr = arr(L.rows_at(R));
  int32_t* bt = arr(L.block_tables);
  const int64_t ps = opts_.page_size;
  for (int t = 0; t < T; ++t) {
    tok[t] = batch.tokens[size_t(t)];
    prev[t] = batch.previous_samples.empty() ? -1 : batch.previous_samples[size_t(t)];
    pos[t] = int32_t(batch.positions[size_t(t)]);
  }
  for (int t = T; t < Tp; ++t) tok[t] = 0, prev[t] = -1, pos[t] = 0, slots[t] = -1;
  int max_new = 0;
  int64_t max_pages_used = 0;  // the block-table columns the step's sequences use
  for (int s = 0; s < S; ++s) {
    const kernels::AttnSeq& q = batch.seqs[size_t(s)];
    const int64_t kv_len = q.start + q.num_tokens;
    const int64_t np = (kv_len + ps - 1) / ps;
    MS_CHECK(np <= L.max_pages, "sequence of {} tokens exceeds the block table", kv_len);
    max_pages_used = std::max(max_pages_used, np);
    std::memcpy(bt + size_t(s) * L.max_pages, q.block_table, size_t(np) * 4);
    kvl[s] = int32_t(kv_len);
    nl[s] = int32_t(q.num_tokens);
    qr[s] = int32_t(q.row);
    max_new = std::max<int>(max_new, int(q.num_tokens));
    for (int64_t i = 0; i < q.num_tokens; ++i) {
      const int64_t p = q.start + i;
      slots[q.row + i] = q.block_table[p / ps] * int32_t(ps) + int32_t(p % ps);
    }
  }
  for (int s = S; s < Sp; ++s) kvl[s] = 0, nl[s] = 0, qr[s] = s;
  bool identity = R == T;
  for (int r = 0; r < R && identity; ++r) identity = batch.logit_rows[size_t(r)] == r;
  for (int r = 0; r < R; ++r) lr[r] = int32_t(batch.logit_rows[size_t(r)]);
  // Sampling parameters; the rows past R (graph padding) sample greedily and are ignored.
  auto* prm = reinterpret_cast<SampleRowParams*>(h + L.params_at(R));
  h_pen_ids_.clear();
  h_pen_counts_.clear();
  h_ban_ids_.clear();
  h_ban_values_.clear();
  mask_rows_ = 0;
  later_mask_rows_.clear();
  size_t next_later = 0;
  forced_before_.assign(size_t(Rp) + 1, 0);
  for (int r = 0; r < Rp; ++r) {
    forced_before_[size_t(r) + 1] = forced_before_[size_t(r)];
    SampleRowParams p;
    if (r < int(specs.size())) {
      const SampleSpec& s = specs[size_t(r)];
      p.temperature = s.sampler.temperature;
      p.top_k = int32_t(std::min<int64_t>(s.sampler.top_k, INT32_MAX));
      p.top_p = s.sampler.top_p;
      p.min_p = s.sampler.min_p;
      p.presence_penalty = s.presence_penalty;
      p.frequency_penalty = s.frequency_penalty;
      p.repetition_penalty = s.repetition_penalty;
      p.random = s.rng ? (*s.rng)() : 0;
      p.top_logprobs = int32_t(std::min<int64_t>(s.top_logprobs, kMaxTop));
      if (s.forced()) {
        MS_CHECK(s.forced_token < cfg_.vocab_size, "forced token {} outside the vocabulary of {}", s.forced_token,
                 cfg_.vocab_size);
        p.forced = s.forced_token;
        ++forced_before_[size_t(r) + 1];
      }
      p.pen_begin = p.pen_end = int32_t(h_pen_ids_.size());
      if (s.penalized()) {
        std::unordered_map<int32_t, int32_t> counts;
        if (s.output)
          for (int32_t t : *s.output) counts[t]++;
        if (s.repetition_penalty != 1.0f && s.prompt)
          for (int32_t t : *s.prompt) counts.emplace(t, 0);
        for (auto& [t, n] : counts) {
          h_pen_ids_.push_back(t);
          h_pen_counts_.push_back(n);
        }
        p.pen_end = int32_t(h_pen_ids_.size());
      }
      // The row's logit biases and bans as unique entries (the sampler writes each token's slot once): a banned
      // token's bias is dropped, repeated bans are kept once.
      // A row's marks in ban_mark_ carry its own stamp: no clearing, and linear in its entries (a JSON grammar's
      // mask bans most of the vocabulary).
      p.ban_begin = int32_t(h_ban_ids_.size());
      if (s.biased() || !s.banned.empty()) {
        if (ban_mark_.size() != size_t(cfg_.vocab_size) || ++ban_stamp_ == 0) {
          ban_mark_.assign(size_t(cfg_.vocab_size), 0);
          ban_stamp_ = 1;
        }
        for (int32_t t : s.banned) {
          MS_CHECK(t >= 0 && t < cfg_.vocab_size, "banned token {} outside the vocabulary of {}", t, cfg_.vocab_size);
          if (ban_mark_[size_t(t)] == ban_stamp_) continue;
          ban_mark_[size_t(t)] = ban_stamp_;
          h_ban_ids_.push_back(t), h_ban_values_.push_back(-INFINITY);
        }
        if (s.biased())
          for (auto [t, v] : *s.bias)
            if (ban_mark_[size_t(t)] != ban_stamp_) h_ban_ids_.push_back(t), h_ban_values_.push_back(v);
      }
      p.ban_end = int32_t(h_ban_ids_.size());
      const bool later_row = later != nullptr && next_later < later->size() && (*later)[next_later] == r;
      if (later_row || s.masked()) {
        MS_CHECK(mask_rows_ < L.max_seqs, "more than {} grammar masks in one step", L.max_seqs);
        if (later_row) ++next_later, later_mask_rows_.push_back(mask_rows_);  // its mask comes with complete_launch()
        else write_mask(buf_[cur_], mask_rows_, s.allowed);
        p.mask_row = mask_rows_++;
      }
    } else {
      p.temperature = 0.0f;
    }
    prm[r] = p;
  }
  MS_CHECK(later == nullptr || next_later == later->size(), "later mask rows not ascending rows of the step");
  if (meta_2d_copy()) {
    // Only the pages in use of each table row: at 128 sequences of 512 tokens that is 17 KB, where the whole rows
    // (max_pages = 2,561 at a 40,960-token context) are 1.3 MB on every step's critical path.
    upload_meta(upload, L.block_tables, S, int(max_pages_used));
  } else {
    upload_meta(upload, L.block_tables + size_t(std::max(S, 1)) * size_t(L.max_pages) * 4);
  }
  if (wide) {  // the rows and parameters of the wide region (after the block tables): those in use
    const size_t end = L.wide_params + size_t(R) * sizeof(SampleRowParams);
    MS_CUDA_CHECK(cudaMemcpyAsync(buf_[cur_].meta.get() + L.wide_logit_rows, h + L.wide_logit_rows,
                                  end - L.wide_logit_rows, cudaMemcpyHostToDevice, upload));
  }

  const char* d = reinterpret_cast<const char*>(buf_[cur_].meta.get());
  auto darr = [&](size_t off) { return reinterpret_cast<const int32_t*>(d + off); };
  StepInputs in;
  in.tokens = darr(L.tokens);
  in.prev_rows = darr(L.prev_rows);
  in.prev_ids = buf_[cur_ ^ 1].out_ids.get();  // the step launched before this one used the other set
  in.positions = darr(L.positions);
  in.slots = darr(L.slots);
  in.attn.block_tables = darr(L.block_tables);
  in.attn.max_pages = L.max_pages;
  in.attn.kv_lens = darr(L.kv_lens);
  in.attn.new_lens = darr(L.new_lens);
  in.attn.q_rows = darr(L.q_rows);
  in.attn.num_seqs = Sp;
  in.attn.page_size = int(ps);
  // Padded decode: rows are the sequences, in order; otherwise gathered unless they are the tokens in order.
  in.logit_rows = identity || pad_to > T ? nullptr : darr(L.rows_at(R));
  in.head_in_chunks = wide;
  in.T = Tp;
  in.R = pad_to > T ? Rp : R;
  in.max_new = max_new;
  in.decode = max_new == 1 && S == T;
  const AttnShape ash{int(cfg_.num_heads), int(cfg_.num_kv_heads), int(cfg_.head_dim)};
  in.decode_splits = paged_attention_decode_splits(ash, Sp, dev_.multiprocessors, kMaxSplits);
  for (auto& q : batch.seqs) {
    in.kv_tokens += double(q.start + q.num_tokens);
    in.attn_pairs += double(q.num_tokens) * double(q.start) + double(q.num_tokens) * double(q.num_tokens + 1) / 2;
  }
  return in;
}

void GpuExecutor::upload_meta(cudaStream_t s, size_t bytes, int table_rows, int table_pages) {
  uint8_t* dev = buf_[cur_].meta.get();
  MS_CUDA_CHECK(cudaMemcpyAsync(dev, host_meta(), bytes, cudaMemcpyHostToDevice, s));
  if (table_rows > 0 && table_pages > 0) {
    const size_t pitch = size_t(layout_->max_pages) * 4, off = layout_->block_tables;
    MS_CUDA_CHECK(cudaMemcpy2DAsync(dev + off, pitch, host_meta() + off, pitch, size_t(table_pages) * 4,
                                    size_t(table_rows), cudaMemcpyHostToDevice, s));
  }
  auto grow_upload = [&]<typename T>(DeviceArray<T>& dst, const std::vector<T>& src) {
    if (src.empty()) return;
    if (dst.size() < src.size()) {
      sync_streams(true);  // the old array may still be read by a step in flight
      dst = DeviceArray<T>(alloc_, src.size() * 2, "activations");
    }
    MS_CUDA_CHECK(cudaMemcpyAsync(dst.get(), src.data(), src.size() * sizeof(T), cudaMemcpyHostToDevice, s));
  };
  grow_upload(pen_ids_, h_pen_ids_);
  grow_upload(pen_counts_, h_pen_counts_);
  grow_upload(ban_ids_, h_ban_ids_);
  grow_upload(ban_values_, h_ban_values_);
  if (mask_rows_ > 0 && later_mask_rows_.empty())  // (else complete_launch() uploads them)
    MS_CUDA_CHECK(cudaMemcpyAsync(buf_[cur_].masks.get(), buf_[cur_].host_masks.get(),
                                  size_t(mask_rows_) * mask_words() * 4, cudaMemcpyHostToDevice, s));
}

void GpuExecutor::launch(const ForwardBatch& batch, const std::vector<SampleSpec>& specs,
                         const std::vector<int32_t>& later) {
  const int T = int(batch.tokens.size()), R = int(batch.logit_rows.size());
  MS_CHECK(specs.size() == size_t(R), "{} sampling specs for {} logit rows", specs.size(), R);
  MS_CHECK(in_flight_.size() < 2, "a third step launched while two are in flight");
  MS_CHECK(in_flight_.empty() || !in_flight_.back().pending,
           "a step launched before the one before it was completed (complete_launch)");
  MS_CHECK(batch.previous_samples.empty() || batch.previous_samples.size() == size_t(T),
           "previous_samples: {} entries for {} tokens", batch.previous_samples.size(), T);
  for (int32_t r : batch.previous_samples)
    MS_CHECK(r < 0 || (!in_flight_.empty() && r < in_flight_.back().rows() && in_flight_.back().buf == (cur_ ^ 1)),
             "a step takes sample {} of the previous step, which is not in flight or has fewer rows", r);
  // No penalties, logit biases, bans or forced tokens: the captured graphs handle the step (grammar masks too: they
  // live at a fixed address, and the general sampler reads them).
  const bool deferred = !later.empty();  // masks to come: the forward now, the general sampler in complete_launch()
  bool plain = true, masked = deferred;
  for (auto& s : specs) plain = plain && !s.listed() && !s.forced(), masked = masked || s.masked();
  bool greedy = plain && !masked;  // and every row greedy without top logprobs: the fast sampler
  bool topk = plain && !masked;  // or every row greedy or top_k 1..64, no logprobs: the screen for sampled steps
  bool logprob = false, greedy_rows = plain;  // greedy_rows: greedy, whatever the masks
  for (auto& s : specs) {
    const bool g = s.sampler.temperature <= 0.0f || s.sampler.top_k == 1;
    greedy = greedy && g && s.top_logprobs == 0;
    greedy_rows = greedy_rows && g && s.top_logprobs == 0;
    topk = topk && (g || (s.sampler.top_k >= 1 && s.sampler.top_k <= kLmheadScreenMaxTopK)) && s.top_logprobs == 0;
    logprob = logprob || s.logprob;
  }
  // The lm_head screen writes no logprob: a greedy step of its sizes that wants one takes the greedy path without it.
  const int kind = greedy                                     ? (logprob && screen_for(R) ? kGreedyLogprob : kGreedy)
                   : topk && !logprob && screen_topk_for(R) ? kTopK
                                                               : kGeneral;
  StepBuffers& b = buf_[cur_];
  auto& graphs = b.graphs[deferred ? kForward : kind];
  bool is_decode = R == T && int(batch.seqs.size()) == T;
  for (auto& q : batch.seqs) is_decode = is_decode && q.num_tokens == 1;
  int graph_bs = 0;
  if (is_decode && plain && !graphs.empty()) {
    auto it = graphs.lower_bound(T);
    if (it != graphs.end()) graph_bs = it->first;
  }
  // The copies go to the side streams when a step is in flight (the overlap schedule's look-ahead launch); a step
  // launched alone keeps them on the compute stream, where the GPU has nothing else to do and the cross-stream
  // events would only add their latency. A side upload may start once the step that last used this set has read
  // its metadata, and, for a step with penalties, once the step before has read the penalty arrays it overwrites.
  const bool side = side_stream_copies() && !in_flight_.empty();
  cudaStream_t up = side ? upload_stream_ : stream_;
  if (side) {
    MS_CUDA_CHECK(cudaStreamWaitEvent(up, b.done, 0));
    if (!plain) MS_CUDA_CHECK(cudaStreamWaitEvent(up, buf_[cur_ ^ 1].done, 0));
  }
  StepInputs in = prepare(batch, specs, graph_bs, up, deferred ? &later : nullptr);
  if (side) {
    MS_CUDA_CHECK(cudaEventRecord(b.meta_ready, up));
    MS_CUDA_CHECK(cudaStreamWaitEvent(stream_, b.meta_ready, 0));
  }
  Launched l;
  l.want_rank = forced_before_.back() > 0;
  l.buf = cur_;
  l.side = side;
  for (auto& s : specs) {
    l.want_lp |= s.logprob, l.want_top |= s.top_logprobs > 0;
    l.top_n.push_back(int(std::min<int64_t>(s.top_logprobs, kMaxTop)));
  }
  l.pen = !h_pen_ids_.empty() || !h_ban_ids_.empty();
  if (deferred) {
    // (Look-ahead steps carry no scored prompt positions, so the lm_head never runs in slices here.)
    MS_CHECK(!in.head_in_chunks && !l.want_rank, "a step with later masks scores prompt positions");
    if (graph_bs > 0) {
      MS_CUDA_CHECK(cudaGraphLaunch(graphs.at(graph_bs), stream_));
    } else {
      in.head_argmax = true;  // up to the lm_head's input rows
      model_->forward(in, stream_);
    }
    l.pending = true;
    l.greedy = greedy_rows && !logprob && be_.lmhead_screen;
    l.sparse = !l.want_lp && !l.want_top && be_.lmhead_screen;  // (the masked kernels ship with the screen)
    deferred_in_ = in;
    l.graph_bs = graph_bs;
    l.mask_rows = mask_rows_;
    l.later_mask_rows = later_mask_rows_;
  } else if (graph_bs > 0) {
    MS_CUDA_CHECK(cudaGraphLaunch(graphs.at(graph_bs), stream_));
  } else {
    in.head_argmax = kind != kGeneral && R > 0 && head_argmax_for(R, kind);
    model_->forward(in, stream_);
    if (R > 0) over_head_slices(in, [&](int r0, int n) { sample_rows(b, r0, n, R, kind, l.pen, in.head_argmax); });
  }
  if (!deferred) enqueue_copies_back(l);
  in_flight_.push_back(std::move(l));
  cur_ ^= 1;
}

void GpuExecutor::complete_launch(std::vector<std::vector<uint32_t>>& masks) {
  MS_CHECK(!in_flight_.empty() && in_flight_.back().pending,
           "complete_launch() without a step launched with later masks");
  Launched& l = in_flight_.back();
  MS_CHECK(masks.size() == l.later_mask_rows.size(), "{} masks for {} later rows", masks.size(),
           l.later_mask_rows.size());
  StepBuffers& b = buf_[l.buf];
  const size_t W = mask_words();
  // (An empty mask: not constraining - a reasoning section -, or a row dropped at collection.)
  for (size_t i = 0; i < masks.size(); ++i) write_mask(b, l.later_mask_rows[i], masks[i]);
  // Every mask row of the step (those known at launch are in host_masks already), then the sampler.
  cudaStream_t up = l.side ? upload_stream_ : stream_;
  MS_CUDA_CHECK(cudaMemcpyAsync(b.masks.get(), b.host_masks.get(), size_t(l.mask_rows) * W * 4,
                                cudaMemcpyHostToDevice, up));
  if (l.side) {
    MS_CUDA_CHECK(cudaEventRecord(b.meta_ready, up));
    MS_CUDA_CHECK(cudaStreamWaitEvent(stream_, b.meta_ready, 0));
  }
  const int R = l.rows();
  // Greedy: the screen + the refused rows' argmax, or that argmax alone where every mask is small; sampled without
  // logprobs where every mask is small: the allowed tokens' logits alone; else the lm_head + the general sampler.
  bool small = (l.greedy || l.sparse) && l.mask_rows == R;  // every row masked
  int64_t n = 0;  // the tokens the step's masks allow, all rows together
  for (int r = 0; r < l.mask_rows && small; ++r) {
    const uint32_t* m = static_cast<const uint32_t*>(b.host_masks.get()) + size_t(r) * W;
    for (size_t i = 0; i < W && n <= kMaskedOnlyTokens; ++i) n += __builtin_popcount(m[i]);
    small = n <= kMaskedOnlyTokens;
  }
  const int kind = l.greedy ? (small ? kSampleMaskedOnly : screen_for(R) ? kSampleMaskedGreedy : kSampleGeneral)
                   : small  ? kSampleSparse
                            : kSampleGeneral;
  if (l.graph_bs > 0) {
    MS_CUDA_CHECK(cudaGraphLaunch(b.graphs[kind].at(l.graph_bs), stream_));
  } else if (R > 0) {
    sample_after_forward(b, deferred_in_, R, kind, l.pen);
  }
  enqueue_copies_back(l);
  l.pending = false;
}

void GpuExecutor::write_mask(StepBuffers& b, int row, const std::vector<uint32_t>& allowed) const {
  const size_t W = mask_words();
  MS_CHECK(allowed.size() <= W, "a grammar mask of {} words for a vocabulary of {} tokens", allowed.size(),
           cfg_.vocab_size);
  uint32_t* m = static_cast<uint32_t*>(b.host_masks.get()) + size_t(row) * W;
  if (allowed.empty()) {
    std::fill(m, m + W, ~0u);
  } else {
    std::copy(allowed.begin(), allowed.end(), m);
    std::fill(m + allowed.size(), m + W, 0u);
  }
  if (cfg_.vocab_size % 32) m[W - 1] &= (1u << (cfg_.vocab_size % 32)) - 1u;  // no token past the vocabulary
}

void GpuExecutor::enqueue_copies_back(const Launched& l) {
  StepBuffers& b = buf_[l.buf];
  MS_CUDA_CHECK(cudaEventRecord(b.done, stream_));
  // The samples back to the host. The set's outputs are next overwritten by the step launched after the one
  // after this, which the overlap schedule launches only once this one is collected, i.e. these copies are done.
  cudaStream_t down = l.side ? download_stream_ : stream_;
  if (l.side) MS_CUDA_CHECK(cudaStreamWaitEvent(down, b.done, 0));
  const int R = l.rows();
  const HostOut h(b.host_out.get(), R);
  if (R > 0) MS_CUDA_CHECK(cudaMemcpyAsync(h.ids, b.out_ids.get(), size_t(R) * 4, cudaMemcpyDeviceToHost, down));
  if (l.want_lp) MS_CUDA_CHECK(cudaMemcpyAsync(h.lps, b.out_lp.get(), size_t(R) * 4, cudaMemcpyDeviceToHost, down));
  if (l.want_rank)
    MS_CUDA_CHECK(cudaMemcpyAsync(h.ranks, b.out_rank.get(), size_t(R) * 4, cudaMemcpyDeviceToHost, down));
  if (l.want_top) {
    MS_CUDA_CHECK(cudaMemcpyAsync(h.tids, b.top_ids.get(), size_t(R) * kMaxTop * 4, cudaMemcpyDeviceToHost, down));
    MS_CUDA_CHECK(cudaMemcpyAsync(h.tlps, b.top_lp.get(), size_t(R) * kMaxTop * 4, cudaMemcpyDeviceToHost, down));
  }
  MS_CUDA_CHECK(cudaEventRecord(b.out_ready, down));
}

void GpuExecutor::collect(std::vector<Sampled>& out) {
  MS_CHECK(!in_flight_.empty(), "collect() without a launched step");
  MS_CHECK(!in_flight_.front().pending, "collect() of a step whose masks were not given (complete_launch)");
  const Launched l = std::move(in_flight_.front());
  in_flight_.pop_front();
  MS_CUDA_CHECK(cudaEventSynchronize(buf_[l.buf].out_ready));
  const int R = l.rows();
  const HostOut h(buf_[l.buf].host_out.get(), R);
  out.resize(size_t(R));
  for (int r = 0; r < R; ++r) {
    Sampled& o = out[size_t(r)];
    o.token = h.ids[r];
    MS_CHECK(o.token >= 0 && o.token < cfg_.vocab_size, "the GPU sampler returned token {} (vocab {})", o.token,
             cfg_.vocab_size);
    o.logprob = l.want_lp ? h.lps[r] : 0.0f;
    o.rank = l.want_rank ? h.ranks[r] : 0;
    o.top.clear();
    for (int j = 0; j < l.top_n[size_t(r)]; ++j) o.top.push_back({h.tids[r * kMaxTop + j], h.tlps[r * kMaxTop + j]});
  }
}

void GpuExecutor::drop_launched() {
  sync_streams(false);  // the buffers of a dropped step are reused only once it has run
  in_flight_.clear();
}

void GpuExecutor::step(const ForwardBatch& batch, const std::vector<SampleSpec>& specs, std::vector<Sampled>& out) {
  MS_CHECK(in_flight_.empty(), "step() while launched steps wait for collect()");
  launch(batch, specs);
  collect(out);
}

void GpuExecutor::forward_logits(const ForwardBatch& batch, std::vector<float>& logits) {
  MS_CHECK(in_flight_.empty(), "forward_logits() while launched steps wait for collect()");
  StepInputs in = prepare(batch, {}, 0, stream_);
  model_->forward(in, stream_);
  const size_t V = size_t(cfg_.vocab_size);
  logits.resize(batch.logit_rows.size() * V);
  over_head_slices(in, [&](int r0, int n) {
    MS_CUDA_CHECK(cudaMemcpyAsync(logits.data() + size_t(r0) * V, model_->logits(), size_t(n) * V * 4,
                                  cudaMemcpyDeviceToHost, stream_));
    MS_CUDA_CHECK(cudaStreamSynchronize(stream_));  // the next slice overwrites the logits
  });
}

std::string GpuExecutor::profile_step(const ForwardBatch& batch) {
  MS_CHECK(in_flight_.empty(), "profile_step() while launched steps wait for collect()");
  // Floors at the H200's measured copy bandwidth and dense BF16 rate (docs/PERF.md).
  const double bw = 4.3e12, rate = 790e12;
  StepInputs in = prepare(batch, {}, 0, stream_);
  model_->forward(in, stream_, &profile_);
  std::string out = "eager launches (small ops include host launch gaps):\n" + profile_.report(bw, rate);
  // The same pass recorded in a CUDA graph, with external event nodes between the ops: the device-side cost of
  // each op as a replayed graph runs it.
  cudaGraph_t g = nullptr;
  cudaGraphExec_t exec = nullptr;
  try {
    MS_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    try {
      model_->forward(in, stream_, &profile_);
    } catch (...) {
      cudaStreamEndCapture(stream_, &g);
      throw;
    }
    MS_CUDA_CHECK(cudaStreamEndCapture(stream_, &g));
    MS_CUDA_CHECK(cudaGraphInstantiate(&exec, g, 0));
    for (int i = 0; i < 3; ++i) MS_CUDA_CHECK(cudaGraphLaunch(exec, stream_));
    MS_CUDA_CHECK(cudaStreamSynchronize(stream_));
    out += "in a CUDA graph:\n" + profile_.report(bw, rate);
  } catch (const std::exception& e) {
    cudaGetLastError();
    out += std::string("in a CUDA graph: not measured (") + e.what() + ")\n";
  }
  if (exec) cudaGraphExecDestroy(exec);
  if (g) cudaGraphDestroy(g);
  return out;
}

template <class F>
void GpuExecutor::over_head_slices(const StepInputs& in, F f) {
  if (!in.head_in_chunks) {
    if (in.R > 0) f(0, in.R);
    return;
  }
  const int C = model_->max_head_rows();
  for (int r0 = 0; r0 < in.R; r0 += C) {
    const int n = std::min(C, in.R - r0);
    model_->head_chunk(in, r0, n, stream_);
    f(r0, n);
  }
}

}  // namespace executor_detail

std::vector<int> cuda_graph_sizes(const GpuOptions& opts) {
  std::vector<int> s;
  if (!opts.cuda_graph_bs.empty()) {
    for (int64_t b : opts.cuda_graph_bs)
      if (b > 0) s.push_back(int(b));
  } else {
    for (int b : {1, 2, 4, 8, 12, 16, 24, 32}) s.push_back(b);
    for (int b = 40; b <= opts.cuda_graph_max_bs; b += 8) s.push_back(b);
  }
  s.erase(std::remove_if(s.begin(), s.end(), [&](int b) { return b > opts.cuda_graph_max_bs; }), s.end());
  std::sort(s.begin(), s.end(), std::greater<int>());
  s.erase(std::unique(s.begin(), s.end()), s.end());
  return s;
}

std::unique_ptr<Executor> make_gpu_executor(const std::string& model_dir, const GpuOptions& opts) {
  return std::make_unique<executor_detail::GpuExecutor>(model_dir, opts);
}

}  // namespace moeserve::cuda
