#include "cuda/model/gpu_model.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include <fmt/format.h>

#include "core/env.h"
#include "core/log.h"
#include "core/tensor.h"
#include "cuda/model/attention_ref.h"
#include "cuda/model/model_kernels.h"
#include "cuda/model/uploader.h"

namespace moeserve::cuda {

namespace {

size_t numel_bytes(const Tensor& t) { return size_t(t.numel()) * sizeof(bf16); }

}  // namespace

unsigned parse_skip_ops(const std::string& list) {
  static const std::pair<const char*, unsigned> kNames[] = {
      {"norm", kSkipNorm},     {"qkv", kSkipQkv},     {"attention", kSkipAttention}, {"oproj", kSkipOproj},
      {"router", kSkipRouter}, {"route", kSkipRoute}, {"experts", kSkipExperts},     {"lmhead", kSkipLmHead}};
  unsigned mask = 0;
  size_t pos = 0;
  while (pos <= list.size()) {
    const size_t end = std::min(list.find(',', pos), list.size());
    const std::string name = list.substr(pos, end - pos);
    pos = end + 1;
    if (name.empty()) continue;
    auto it = std::find_if(std::begin(kNames), std::end(kNames), [&](auto& n) { return name == n.first; });
    if (it == std::end(kNames)) {
      log_warn("MOESERVE_PROFILE_SKIP_OPS: unknown op '{}' ignored (valid: norm, qkv, attention, oproj, router, "
               "route, experts, lmhead)", name);
      continue;
    }
    mask |= it->second;
  }
  return mask;
}

GpuQwen3::GpuQwen3(const Qwen3Model& cpu, CachingAllocator& alloc, cudaStream_t stream, ThreadPool& pool)
    : cfg_(cpu.config()), alloc_(alloc) {
  const ModelConfig& c = cfg_;
  if (c.attention_bias)
    throw_user("--device cuda: attention_bias=true checkpoints are not supported on the GPU yet (use --device cpu)");
  if (c.head_dim > 256 || c.head_dim % 2)
    throw_user("--device cuda: head_dim {} is not supported on the GPU (even, at most 256)", c.head_dim);
  upload(cpu, stream, pool);
}

size_t GpuQwen3::kv_bytes_per_token(const ModelConfig& c) {
  return size_t(c.num_layers) * 2 * size_t(c.num_kv_heads) * size_t(c.head_dim) * sizeof(bf16);
}

void GpuQwen3::upload(const Qwen3Model& cpu, cudaStream_t stream, ThreadPool& pool) {
  const ModelConfig& c = cfg_;
  const int64_t H = c.hidden_size, D = c.head_dim, Hq = c.num_heads, Hkv = c.num_kv_heads;
  const auto& layers = cpu.layer_weights();
  // Total bytes first, for the progress line.
  size_t total = numel_bytes(cpu.embed_weight()) + numel_bytes(cpu.final_norm_weight());
  if (!c.tie_word_embeddings) total += numel_bytes(cpu.lm_head_weight().weight);
  for (auto& L : layers) {
    total += numel_bytes(L.q.weight) + numel_bytes(L.k.weight) + numel_bytes(L.v.weight) + numel_bytes(L.o.weight);
    total += numel_bytes(L.q_norm) + numel_bytes(L.k_norm) + numel_bytes(L.input_norm) + numel_bytes(L.post_norm);
    if (L.is_moe) {
      total += numel_bytes(L.moe.router.weight);
      for (auto& e : L.moe.experts)
        total += numel_bytes(e.gate.weight) + numel_bytes(e.up.weight) + numel_bytes(e.down.weight);
    } else {
      total += numel_bytes(L.gate.weight) + numel_bytes(L.up.weight) + numel_bytes(L.down.weight);
    }
  }
  weight_bytes_ = total;
  log_info("loading {} of weights to the GPU", format_bytes(total));
  WeightUploader up(stream, total, pool);
  auto put = [&](const Tensor& t, const std::string& part = "weights") {
    DeviceArray<bf16> d(alloc_, size_t(t.numel()), part);
    up.copy(t, d.get());
    return d;
  };
  embed_ = put(cpu.embed_weight());
  if (c.tie_word_embeddings) {
    lm_head_ = DeviceArray<bf16>();
  } else {
    lm_head_ = put(cpu.lm_head_weight().weight);
  }
  final_norm_ = put(cpu.final_norm_weight());
  layers_.resize(layers.size());
  // The folded router (moe_route_folded) for the MoE layers whose input norm has no (near-)zero weight to divide by.
  // MOESERVE_ROUTER_FOLD=0: off (A/B).
  const bool fold = env_flag("MOESERVE_ROUTER_FOLD", true);
  const int64_t E_fold = c.is_moe() ? c.num_experts : 0;
  for (size_t l = 0; l < layers.size(); ++l) {
    const Qwen3Layer& L = layers[l];
    GpuLayer& G = layers_[l];
    G.router_folded = fold && L.is_moe && ((Hq + 2 * Hkv) * D) % 16 == 0 && H % 16 == 0 && [&] {
      const Tensor g = to_f32(L.input_norm);
      const float* p = g.ptr<float>();
      return std::all_of(p, p + g.numel(), [](float v) { return std::fabs(v) >= 1e-12f; });
    }();
    const int64_t extra = G.router_folded ? E_fold : 0;
    G.qkv = DeviceArray<bf16>(alloc_, size_t(((Hq + 2 * Hkv) * D + extra) * H), "weights");
    up.copy(L.q.weight, G.qkv.get());
    up.copy(L.k.weight, G.qkv.get() + Hq * D * H);
    up.copy(L.v.weight, G.qkv.get() + (Hq + Hkv) * D * H);
    G.o = DeviceArray<bf16>(alloc_, size_t((H + extra) * Hq * D), "weights");
    up.copy(L.o.weight, G.o.get());
    G.q_norm = put(L.q_norm);
    G.k_norm = put(L.k_norm);
    G.input_norm = put(L.input_norm);
    G.post_norm = put(L.post_norm);
    G.is_moe = L.is_moe;
    all_moe_ = all_moe_ && L.is_moe;
    if (L.is_moe) {
      const int64_t E = c.num_experts, I = c.moe_intermediate_size;
      G.router = put(L.moe.router.weight);
      G.gate_up = DeviceArray<bf16>(alloc_, size_t(E * 2 * I * H), "weights");
      G.down = DeviceArray<bf16>(alloc_, size_t(E * H * I), "weights");
      for (int64_t e = 0; e < E; ++e) {
        up.copy(L.moe.experts[e].gate.weight, G.gate_up.get() + e * 2 * I * H);
        up.copy(L.moe.experts[e].up.weight, G.gate_up.get() + e * 2 * I * H + I * H);
        up.copy(L.moe.experts[e].down.weight, G.down.get() + e * H * I);
      }
      G.moe.format = WeightFormat::BF16;
      G.moe.gate_up = G.gate_up.get();
      G.moe.down = G.down.get();
    } else {
      const int64_t I = c.intermediate_size;
      G.gate_up = DeviceArray<bf16>(alloc_, size_t(2 * I * H), "weights");
      up.copy(L.gate.weight, G.gate_up.get());
      up.copy(L.up.weight, G.gate_up.get() + I * H);
      G.down = put(L.down.weight);
    }
  }
  up.finish();
  for (GpuLayer& G : layers_)
    if (G.router_folded)
      fold_router_weights(G.router.get(), G.input_norm.get(), G.post_norm.get(), G.o.get(), int(E_fold), int(H),
                          int(Hq * D), G.qkv.get() + (Hq + 2 * Hkv) * D * H, G.o.get() + H * Hq * D, stream);
  MS_CUDA_CHECK(cudaStreamSynchronize(stream));
  const kernels::RopeTable& rt = cpu.rope_table();
  inv_freq_ = DeviceArray<float>(alloc_, rt.inv_freq.size(), "weights");
  MS_CUDA_CHECK(cudaMemcpy(inv_freq_.get(), rt.inv_freq.data(), rt.inv_freq.size() * sizeof(float),
                           cudaMemcpyHostToDevice));
  rope_.inv_freq = inv_freq_.get();
  rope_.rotary_dim = int(rt.inv_freq.size() * 2);
  rope_.attention_scaling = rt.attention_scaling;
}

void GpuQwen3::plan_workspace(int max_tokens, int max_rows, int max_seqs, int max_decode_splits,
                              const ModelBackends& b) {
  const ModelConfig& c = cfg_;
  be_ = b;
  max_tokens_ = max_tokens;
  max_rows_ = max_rows;
  const size_t T = size_t(max_tokens), H = size_t(c.hidden_size), D = size_t(c.head_dim);
  const size_t QKV = size_t(c.num_heads + 2 * c.num_kv_heads) * D, QD = size_t(c.num_heads) * D;
  const std::string part = "activations";
  residual_ = DeviceArray<float>(alloc_, T * H, part);
  xn_ = DeviceArray<bf16>(alloc_, T * H, part);
  // folded_mid_route, where the model's shapes take it: q/k/v and o_proj outputs of up to kFoldedMidMaxTokens rows
  // carry E columns more (u1, u2), in rows whose strides keep 16-byte vectors.
  const int E_fold = c.is_moe() ? int(c.num_experts) : 0;
  fold_mid_ok_ = b.folded_mid_route && c.is_moe() && (QKV + E_fold) % 8 == 0 && (H + E_fold) % 8 == 0 &&
                 moe_add_norm_route_fits(int(H), E_fold, int(c.num_experts_per_tok));
  const size_t E_mid = fold_mid_ok_ ? size_t(E_fold) : 0;
  const size_t mid = std::min(T, size_t(kFoldedMidMaxTokens));
  qkv_ = DeviceArray<bf16>(alloc_, std::max(T * QKV, mid * (QKV + E_mid)), part);
  attn_ = DeviceArray<bf16>(alloc_, T * QD, part);
  o_ = DeviceArray<bf16>(alloc_, std::max(T * H, mid * (H + E_mid)), part);
  final_rows_ = DeviceArray<bf16>(alloc_, size_t(max_rows) * H, part);
  logits_ = DeviceArray<float>(alloc_, size_t(max_rows) * size_t(c.vocab_size), part);
  if (c.is_moe()) {
    router_logits_ = DeviceArray<float>(alloc_, T * size_t(c.num_experts), part);
    router_u1_ = DeviceArray<float>(alloc_, size_t(kResidualGemvMaxM) * size_t(c.num_experts), part);
    router_u2_ = DeviceArray<float>(alloc_, size_t(kResidualGemvMaxM) * size_t(c.num_experts), part);
    if (fold_mid_ok_) {
      inv_h_ = DeviceArray<float>(alloc_, size_t(kFoldedMidMaxTokens), part);
      MS_CUDA_CHECK(cudaMemset(inv_h_.get(), 0, inv_h_.bytes()));
    }
    topk_ids_ = DeviceArray<int32_t>(alloc_, T * size_t(c.num_experts_per_tok), part);
    topk_w_ = DeviceArray<float>(alloc_, T * size_t(c.num_experts_per_tok), part);

    MoeShape ms{int(c.num_experts), int(H), int(c.moe_intermediate_size), int(c.num_experts_per_tok),
                WeightFormat::BF16, max_tokens};
    moe_ws_ = DeviceArray<uint8_t>(alloc_, std::max<size_t>(b.moe->workspace_bytes(ms), 256), part);
  }
  grid_counter_ = DeviceArray<int>(alloc_, kRouterTopkMaxGroups, part);  // (moe_router_topk: one a token group)
  MS_CUDA_CHECK(cudaMemset(grid_counter_.get(), 0, grid_counter_.bytes()));
  if (b.residual_fusion) {
    const size_t parts = size_t(kResidualGemvMaxM) * size_t(residual_gemv_parts(int(H)));
    part_attn_ = DeviceArray<float>(alloc_, parts, part);
    part_moe_ = DeviceArray<float>(alloc_, parts, part);
    MS_CUDA_CHECK(cudaMemset(part_attn_.get(), 0, part_attn_.bytes()));
    MS_CUDA_CHECK(cudaMemset(part_moe_.get(), 0, part_moe_.bytes()));
  }
  if (c.intermediate_size > 0) {
    mlp_ = DeviceArray<bf16>(alloc_, T * 2 * size_t(c.intermediate_size), part);
    mlp_act_ = DeviceArray<bf16>(alloc_, T * size_t(c.intermediate_size), part);
  }
  decode_ws_ = DeviceArray<uint8_t>(
      alloc_, std::max<size_t>(decode_workspace_bytes(max_seqs, int(c.num_heads), int(D), max_decode_splits), 256),
      part);
  init_decode_workspace(decode_ws_.get(), decode_ws_.bytes(), nullptr);
  // Rows that a padded (graph) step does not compute keep finite values: zero everything once.
  MS_CUDA_CHECK(cudaMemset(residual_.get(), 0, residual_.bytes()));
  MS_CUDA_CHECK(cudaMemset(xn_.get(), 0, xn_.bytes()));
  MS_CUDA_CHECK(cudaMemset(qkv_.get(), 0, qkv_.bytes()));
  MS_CUDA_CHECK(cudaMemset(attn_.get(), 0, attn_.bytes()));
  MS_CUDA_CHECK(cudaMemset(o_.get(), 0, o_.bytes()));
  if (router_logits_.get()) MS_CUDA_CHECK(cudaMemset(router_logits_.get(), 0, router_logits_.bytes()));
  if (topk_ids_.get()) {
    // Valid, distinct experts per token, as a routing would leave them (steps that skip the routing for timing
    // read these).
    const int E = int(c.num_experts), K = int(c.num_experts_per_tok);
    std::vector<int32_t> ids(T * size_t(K));
    for (size_t t = 0; t < T; ++t)
      for (int j = 0; j < K; ++j) ids[t * K + size_t(j)] = int32_t((t * 37 + size_t(j)) % size_t(E));
    MS_CUDA_CHECK(cudaMemcpy(topk_ids_.get(), ids.data(), ids.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
    std::vector<float> w(ids.size(), 1.0f / float(K));
    MS_CUDA_CHECK(cudaMemcpy(topk_w_.get(), w.data(), w.size() * sizeof(float), cudaMemcpyHostToDevice));
  }
}

void GpuQwen3::allocate_kv(int64_t num_pages, int page_size) {
  kv_pages_ = num_pages;
  page_size_ = page_size;
  const size_t per_layer = size_t(num_pages) * size_t(page_size) * size_t(cfg_.num_kv_heads) * size_t(cfg_.head_dim);
  kv_ = DeviceArray<bf16>(alloc_, per_layer * 2 * size_t(cfg_.num_layers), "kv cache");
  MS_CUDA_CHECK(cudaMemset(kv_.get(), 0, kv_.bytes()));  // finite values even in pages never written
}

void GpuQwen3::forward(const StepInputs& in, cudaStream_t s, StepProfile* prof) {
  const ModelConfig& c = cfg_;
  const int T = in.T, H = int(c.hidden_size), D = int(c.head_dim), Hq = int(c.num_heads), Hkv = int(c.num_kv_heads);
  const int QKV = (Hq + 2 * Hkv) * D, QD = Hq * D;
  const float eps = float(c.rms_norm_eps);
  MS_CHECK(T > 0 && T <= max_tokens_ && (in.R <= max_rows_ || in.head_in_chunks),
           "step of {} tokens / {} logit rows exceeds the plan", T, in.R);
  GemmBackend& gemm = *be_.gemm;
  const size_t layer_elems = size_t(kv_pages_) * size_t(page_size_) * size_t(Hkv) * size_t(D);
  const AttnShape ash{Hq, Hkv, D, 1.0f / std::sqrt(float(D))};
  // With a profile, an event after every op; bytes and flops give each op its floor. With
  // MOESERVE_SLOW_LAUNCH_MS=x (diagnostics), an op whose launches held the host for more than x ms is logged.
  static const double slow_ms = double(env_int("MOESERVE_SLOW_LAUNCH_MS", 0, 0, 1 << 20));
  auto t_op = slow_ms > 0 ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
  auto mark = [&](const char* op, double bytes, double flops) {
    if (prof) prof->mark(op, bytes, flops, s);
    if (slow_ms > 0) {
      const auto t = std::chrono::steady_clock::now();
      const double ms = std::chrono::duration<double, std::milli>(t - t_op).count();
      if (ms > slow_ms)
        log_warn("step of {} tokens ({} logit rows): launching '{}' held the host {:.2f} ms", T, in.R, op, ms);
      t_op = t;
    }
  };
  auto gemm_cost = [&](int M, int N, int K, int out_bytes) {
    return std::pair<double, double>{2.0 * N * K + 2.0 * M * K + double(out_bytes) * M * N, 2.0 * M * N * K};
  };
  const double act = double(T) * H;
  const unsigned skip = be_.skip_ops;  // timing only
  auto run_op = [&](unsigned op) { return (skip & op) == 0; };
  if (prof) prof->start(s);

  // Steps of a few tokens: the residual add + RMSNorm run inside the q/k/v GEMV and the router (no launch of
  // their own), and the router GEMV and top-k are one launch.
  const int E = int(c.num_experts), K = int(c.num_experts_per_tok);
  // The residual fusion (ModelBackends::residual_fusion): every layer MoE, the MoE epilogue at T tokens, no op
  // skipped. The MoE of layer l leaves the residual and part_moe_ for layer l + 1's q/k/v; o_proj leaves them and
  // part_attn_ for the router, which also writes xn_ for the experts.
  const int res_parts = residual_gemv_parts(H);
  const bool resfuse = be_.residual_fusion && skip == 0 && all_moe_ && residual_gemv_fits(T, H) &&
                       residual_gemv_fits(T, Hq * D) && be_.moe != nullptr && be_.moe->residual_parts(T) == res_parts;
  // The combine-norm fusion (ModelBackends::moe_combine_norm): the MoE of layer l also adds its output into the
  // residual and writes layer l + 1's normed input (the final norm's after the last layer) into xn_.
  const bool cnorm = be_.moe_combine_norm && !resfuse && skip == 0 && all_moe_ && be_.moe != nullptr &&
                     be_.moe->combine_norm_supported(T);
  const bool fuse_qkv_norm = !resfuse && !cnorm && be_.fused_small_steps && norm_gemv_fits(T, H);
  // The folded route of decode steps beyond the residual fusion (ModelBackends::folded_mid_route): in the layers with
  // folded rows, the q/k/v and o_proj GEMMs run over them too (u1 and u2 in E extra output columns) and
  // moe_add_norm_route replaces add_rmsnorm + the router GEMM + the top-k.
  const bool fold_mid = fold_mid_ok_ && !resfuse && !cnorm && !fuse_qkv_norm && skip == 0 && in.decode &&
                        T > kResidualGemvMaxM && T <= kFoldedMidMaxTokens;
  // Decode steps of up to 64 sequences, in models with RoPE over the whole head: the input stage runs inside
  // the attention launch. (H200, q30b8l served step: batch 1 -5 to -10 us, 64 even, 128 +16 us: there the
  // attention runs two waves of blocks, and each block's input stage lengthens both.)
  // Where the keys-as-M decode tiles apply (decode_gqa_usable), they take the input stage inside too
  // (decode_gqa_fused_input; before, they ran it as a launch of its own: faster at batch 1, 64 and 128 than the
  // 16-row tiles with the fused stage).
  const bool fused_input = in.decode && T <= 64 && !be_.reference_attention && be_.fused_attention_input &&
                           attention_input_stage_fusable(ash, rope_) &&
                           (!decode_gqa_usable(ash, T) || decode_gqa_fused_input());
  // With the residual fusion the embedding also leaves the partial sums, so the first layer's q/k/v GEMV applies
  // its input norm too (no norm launch) and its router folds like the others'. MOESERVE_EMBED_PARTIALS=0: off (A/B).
  static const bool embed_partials_on = env_flag("MOESERVE_EMBED_PARTIALS", true);
  const bool embed_parts = resfuse && embed_partials_on && H % 16 == 0;
  embedding(in.tokens, embed_.get(), T, H, residual_.get(), s, in.prev_rows, in.prev_ids,
            embed_parts ? part_moe_.get() : nullptr);
  mark("embedding", act * 6, 0);
  for (size_t l = 0; l < layers_.size(); ++l) {
    GpuLayer& L = layers_[l];
    auto g1 = gemm_cost(T, QKV, H, 2);
    bf16* kc = kv_.get() + l * 2 * layer_elems;
    bf16* vc = kc + layer_elems;
    // The folded router's first product rides in this layer's q/k/v GEMV, its second in o_proj (GpuLayer).
    const bool norm_in = resfuse && (l > 0 || embed_parts);
    const bool folded = norm_in && L.router_folded;
    const bool lfold = fold_mid && L.router_folded;  // (router_folded: an MoE layer with its folded rows)
    float* inv_h = lfold ? inv_h_.get() : nullptr;
    const int ldq = lfold ? QKV + E : QKV, ldo = lfold ? H + E : H;  // q/k/v's and o_proj's output strides
    if (norm_in) {  // the previous layer's MoE (or the embedding) updated the residual and left its partial sums
      gemv_norm_in(residual_.get(), part_moe_.get(), res_parts, L.input_norm.get(), eps, T, H, L.qkv.get(), QKV,
                   qkv_.get(), QKV, OutType::BF16, nullptr, s,
                   folded ? GemvExtraRows{E, router_u1_.get(), E} : GemvExtraRows{});
      mark("norm+gemm qkv", g1.first + act * 8, g1.second);
    } else if (fuse_qkv_norm) {
      norm_gemv(residual_.get(), l == 0 ? nullptr : o_.get(), L.input_norm.get(), eps, T, H, L.qkv.get(), QKV,
                qkv_.get(), QKV, grid_counter_.get(), s);
      mark("norm+gemm qkv", g1.first + act * 12, g1.second);
    } else {
      if (!run_op(kSkipNorm) || (cnorm && l > 0)) {  // (cnorm: the previous layer's MoE wrote xn_)
      } else if (l == 0) {
        rmsnorm(residual_.get(), L.input_norm.get(), eps, T, H, xn_.get(), s, inv_h);
      } else {
        add_rmsnorm(residual_.get(), o_.get(), L.input_norm.get(), eps, T, H, xn_.get(), s, inv_h);
      }
      mark("add_rmsnorm", act * 12, 0);
      if (run_op(kSkipQkv)) gemm.run(xn_.get(), H, T, H, L.qkv.get(), ldq, qkv_.get(), ldq, OutType::BF16, s);
      mark("gemm qkv", g1.first, g1.second);
    }
    if (!run_op(kSkipAttention)) {
    } else if (!fused_input) {
      qk_norm_rope_store_kv(qkv_.get(), ldq, T, Hq, Hkv, D, L.q_norm.get(), L.k_norm.get(), eps, in.positions,
                            rope_, in.slots, kc, vc, s);
      mark("qk_norm_rope_kv", 4.0 * T * QKV, 0);
    }
    if (!run_op(kSkipAttention)) {
    } else if (be_.reference_attention) {
      paged_attention_reference(qkv_.get(), ldq, kc, vc, in.attn, ash, in.decode ? 1 : in.max_new, attn_.get(), QD, s);
    } else if (fused_input) {
      const AttnInputStage stage{L.q_norm.get(), L.k_norm.get(), eps, in.positions, rope_, in.slots};
      paged_attention_decode_fused_input(qkv_.get(), ldq, kc, vc, in.attn, ash, stage, in.decode_splits,
                                         decode_ws_.get(), decode_ws_.bytes(), attn_.get(), QD, s);
    } else if (in.decode) {
      paged_attention_decode(qkv_.get(), ldq, kc, vc, in.attn, ash, in.decode_splits, decode_ws_.get(),
                             decode_ws_.bytes(), attn_.get(), QD, s);
    } else {
      paged_attention_prefill(qkv_.get(), ldq, kc, vc, in.attn, ash, in.max_new, attn_.get(), QD, s);
    }
    mark(fused_input ? "attention decode+qk_norm_rope_kv" : in.decode ? "attention decode" : "attention prefill",
         double(in.kv_tokens) * Hkv * D * 4 + 4.0 * T * QD, 4.0 * double(in.attn_pairs) * Hq * D);
    if (resfuse) {  // residual += o, and the partial sums for the router's norm
      gemv_residual_out(attn_.get(), QD, T, QD, L.o.get(), H, o_.get(), H, residual_.get(), part_attn_.get(), s,
                        folded ? GemvExtraRows{E, router_u2_.get(), E} : GemvExtraRows{});
    } else if (run_op(kSkipOproj)) {
      gemm.run(attn_.get(), QD, T, QD, L.o.get(), ldo, o_.get(), ldo, OutType::BF16, s);
    }
    auto g2 = gemm_cost(T, H, QD, 2);
    mark("gemm o_proj", g2.first, g2.second);
    const bool fuse_router_norm =
        !resfuse && L.is_moe && be_.fused_small_steps && moe_norm_router_topk_fits(T, H, E, K);
    if (!resfuse && !fuse_router_norm && !lfold && run_op(kSkipNorm)) {
      add_rmsnorm(residual_.get(), o_.get(), L.post_norm.get(), eps, T, H, xn_.get(), s);
      mark("add_rmsnorm", act * 12, 0);
    }
    if (L.is_moe) {
      const int I = int(c.moe_intermediate_size);
      auto g3 = gemm_cost(T, E, H, 4);
      if (folded) {  // the router's logits from the two products, the top-k, and xn_ for the experts
        FoldedRouterInputs f;
        f.u1 = router_u1_.get(), f.ld_u1 = E, f.u2 = router_u2_.get(), f.ld_u2 = E;
        f.part_h = part_moe_.get(), f.part_x = part_attn_.get(), f.nparts = res_parts;
        f.residual = residual_.get(), f.post_norm = L.post_norm.get(), f.eps = eps, f.H = H, f.xn_out = xn_.get();
        moe_route_folded(f, T, E, K, c.norm_topk_prob, topk_ids_.get(), topk_w_.get(), s);
        mark("moe route_folded", act * 8, 0);
      } else if (lfold) {  // add + RMSNorm and the route from the GEMMs' extra columns
        FoldedMidRoute f;
        f.router = L.router.get(), f.u1 = qkv_.get() + QKV, f.ld_u1 = ldq, f.u2 = o_.get() + H, f.ld_u2 = ldo;
        f.inv_h = inv_h;
        moe_add_norm_route(residual_.get(), o_.get(), ldo, L.post_norm.get(), eps, T, H, f, E, K, c.norm_topk_prob,
                           xn_.get(), topk_ids_.get(), topk_w_.get(), s);
        mark("add_rmsnorm + folded route", act * 12 + 8.0 * T * E, 0);
      } else if (resfuse) {  // the post-attention norm inside the router GEMV, which also writes xn_ for the experts
        gemv_norm_in(residual_.get(), part_attn_.get(), res_parts, L.post_norm.get(), eps, T, H, L.router.get(), E,
                     router_logits_.get(), E, OutType::F32, xn_.get(), s);
        mark("norm+gemm router", g3.first + act * 8, g3.second);
        moe_route_topk(router_logits_.get(), T, E, K, c.norm_topk_prob, topk_ids_.get(), topk_w_.get(), s);
        mark("moe route_topk", 4.0 * T * E, 0);
      } else if (fuse_router_norm) {  // decode of a few tokens: norm, router and top-k in one launch
        moe_norm_router_topk(residual_.get(), o_.get(), L.post_norm.get(), eps, xn_.get(), L.router.get(), T, H, E, K,
                             c.norm_topk_prob, router_logits_.get(), grid_counter_.get(), topk_ids_.get(),
                             topk_w_.get(), s);
        mark("norm+router+topk", g3.first + act * 12, g3.second);
      } else if (be_.fused_small_steps && T <= kFusedRouterMaxTokens && moe_router_topk_fits(T, H, E, K)) {
        // router GEMV and top-k in one launch
        moe_router_topk(xn_.get(), L.router.get(), T, H, E, K, c.norm_topk_prob, router_logits_.get(),
                        grid_counter_.get(), topk_ids_.get(), topk_w_.get(), s);
        mark("router+topk", g3.first, g3.second);
      } else {
        if (run_op(kSkipRouter))
          gemm.run(xn_.get(), H, T, H, L.router.get(), E, router_logits_.get(), E, OutType::F32, s);
        mark("gemm router", g3.first, g3.second);
        if (run_op(kSkipRoute))
          moe_route_topk(router_logits_.get(), T, E, K, c.norm_topk_prob, topk_ids_.get(), topk_w_.get(), s);
        mark("moe route_topk", 4.0 * T * E, 0);
      }
      if (!run_op(kSkipExperts)) {
      } else if (resfuse) {  // residual += the MoE output, and the partial sums for the next norm
        be_.moe->run_residual(xn_.get(), T, topk_ids_.get(), topk_w_.get(), L.moe, o_.get(), residual_.get(),
                              part_moe_.get(), moe_ws_.get(), s);
      } else if (cnorm) {  // residual += the MoE output, and the next norm into xn_ (its last reader, the gate/up
                           // GEMM, has completed when the combine runs)
        const bf16* next_norm = l + 1 < layers_.size() ? layers_[l + 1].input_norm.get() : final_norm_.get();
        be_.moe->run_combine_norm(xn_.get(), T, topk_ids_.get(), topk_w_.get(), L.moe, o_.get(), residual_.get(),
                                  next_norm, eps, xn_.get(), moe_ws_.get(), s);
      } else {
        be_.moe->run(xn_.get(), T, topk_ids_.get(), topk_w_.get(), L.moe, o_.get(), moe_ws_.get(), s);
      }
      const double experts = std::min<double>(E, double(T) * K);  // distinct experts touched, at most
      mark("moe experts",
           experts * 3.0 * H * I * 2 + act * 4 + double(T) * K * I * 4, 6.0 * T * K * H * I);
    } else {
      const int I = int(c.intermediate_size);
      gemm.run(xn_.get(), H, T, H, L.gate_up.get(), 2 * I, mlp_.get(), 2 * I, OutType::BF16, s);
      silu_mul(mlp_.get(), T, I, mlp_act_.get(), s);
      gemm.run(mlp_act_.get(), I, T, I, L.down.get(), H, o_.get(), H, OutType::BF16, s);
      mark("dense mlp", 6.0 * H * I + act * 4, 6.0 * T * H * I);
    }
  }
  const bf16* head = head_weight();
  // With the residual fusion at up to 8 tokens, all of them logit rows, the final norm can run inside the streaming
  // lm_head GEMV from the last MoE's partial sums: no norm launch (MOESERVE_LMHEAD_NORM_IN=1; opt-in until measured).
  static const bool head_norm_in = env_flag("MOESERVE_LMHEAD_NORM_IN", false);
  if (resfuse && head_norm_in && !in.head_argmax && !in.head_in_chunks && !in.logit_rows && in.R == T &&
      gemv_stream_enabled() && gemv_stream_fits(T, H)) {
    if (run_op(kSkipLmHead))
      gemv_stream_norm_in(residual_.get(), part_moe_.get(), res_parts, final_norm_.get(), eps, T, H, head,
                          int(c.vocab_size), logits_.get(), c.vocab_size, OutType::F32, s);
    auto g4 = gemm_cost(in.R, int(c.vocab_size), H, 4);
    mark("gemm lm_head (final norm inside)", g4.first + act * 4, g4.second);
    return;
  }
  // The last layer's output joins the residual under the final norm (with the residual fusion it already has);
  // only the logit rows go to lm_head.
  if (resfuse)
    rmsnorm(residual_.get(), final_norm_.get(), eps, T, H, xn_.get(), s);
  else if (!cnorm)  // (cnorm: the last MoE wrote the final norm's rows into xn_)
    add_rmsnorm(residual_.get(), o_.get(), final_norm_.get(), eps, T, H, xn_.get(), s);
  mark("add_rmsnorm", act * 12, 0);
  if (in.head_in_chunks) return;  // the executor runs head_chunk() slice by slice
  const bf16* rows = head_input(in, 0, in.R, s);
  if (in.logit_rows) mark("gather rows", 4.0 * in.R * H, 0);
  if (in.head_argmax) {  // the sampler runs the lm_head (lmhead_argmax)
    head_rows_ = rows;
    return;
  }
  if (run_op(kSkipLmHead))
    gemm.run(rows, H, in.R, H, head, int(c.vocab_size), logits_.get(), c.vocab_size, OutType::F32, s);
  auto g4 = gemm_cost(in.R, int(c.vocab_size), H, 4);
  mark("gemm lm_head", g4.first, g4.second);
}

void GpuQwen3::head_logits(const StepInputs& in, cudaStream_t s) {
  MS_CHECK(head_rows_ != nullptr && in.R > 0 && !in.head_in_chunks, "head_logits() without a head_argmax forward");
  if ((be_.skip_ops & kSkipLmHead) != 0) return;  // timing only
  const int H = int(cfg_.hidden_size);
  be_.gemm->run(head_rows_, H, in.R, H, head_weight(), int(cfg_.vocab_size), logits_.get(), cfg_.vocab_size,
                OutType::F32, s);
}

void GpuQwen3::head_chunk(const StepInputs& in, int r0, int n, cudaStream_t s) {
  MS_CHECK(in.head_in_chunks && r0 >= 0 && n > 0 && n <= max_rows_ && r0 + n <= in.R,
           "lm_head slice of rows {} .. {} outside a chunked step of {} rows (slices of at most {})", r0, r0 + n, in.R,
           max_rows_);
  const int H = int(cfg_.hidden_size);
  be_.gemm->run(head_input(in, r0, n, s), H, n, H, head_weight(), int(cfg_.vocab_size), logits_.get(), cfg_.vocab_size,
                OutType::F32, s);
}

const bf16* GpuQwen3::head_input(const StepInputs& in, int r0, int n, cudaStream_t s) {
  const int H = int(cfg_.hidden_size);
  if (!in.logit_rows) return xn_.get() + size_t(r0) * size_t(H);  // the tokens in order
  gather_rows(xn_.get(), H, in.logit_rows + r0, n, H, final_rows_.get(), s);
  return final_rows_.get();
}

int GpuQwen3::warm_up_gemms(cudaStream_t s) {
  const ModelConfig& c = cfg_;
  const int H = int(c.hidden_size), QKV = int((c.num_heads + 2 * c.num_kv_heads) * c.head_dim);
  const int QD = int(c.num_heads * c.head_dim), E = int(c.num_experts), V = int(c.vocab_size);
  GemmBackend& gemm = *be_.gemm;
  const GpuLayer* moe_layer = nullptr;
  const GpuLayer* dense_layer = nullptr;
  for (const GpuLayer& L : layers_) (L.is_moe ? moe_layer : dense_layer) = &L;
  const GpuLayer& L0 = layers_.front();
  const bf16* head = head_weight();
  int runs = 0;
  // The calls of forward()'s prompt path, with its buffers (the library's choice depends on their alignment too).
  for (int M : gemm.warm_up_tokens(max_tokens_)) {
    gemm.run(xn_.get(), H, M, H, L0.qkv.get(), QKV, qkv_.get(), QKV, OutType::BF16, s);
    gemm.run(attn_.get(), QD, M, QD, L0.o.get(), H, o_.get(), H, OutType::BF16, s);
    runs += 2;
    if (moe_layer) {
      gemm.run(xn_.get(), H, M, H, moe_layer->router.get(), E, router_logits_.get(), E, OutType::F32, s);
      ++runs;
    }
    if (dense_layer) {
      const int I = int(c.intermediate_size);
      gemm.run(xn_.get(), H, M, H, dense_layer->gate_up.get(), 2 * I, mlp_.get(), 2 * I, OutType::BF16, s);
      gemm.run(mlp_act_.get(), I, M, I, dense_layer->down.get(), H, o_.get(), H, OutType::BF16, s);
      runs += 2;
    }
    // Decode steps with the folded route: q/k/v and o_proj with their extra columns.
    if (fold_mid_ok_ && moe_layer != nullptr && moe_layer->router_folded && M > kResidualGemvMaxM &&
        M <= kFoldedMidMaxTokens) {
      gemm.run(xn_.get(), H, M, H, moe_layer->qkv.get(), QKV + E, qkv_.get(), QKV + E, OutType::BF16, s);
      gemm.run(attn_.get(), QD, M, QD, moe_layer->o.get(), H + E, o_.get(), H + E, OutType::BF16, s);
      runs += 2;
    }
    // lm_head: its rows are xn_ or the gathered final_rows_, both allocator blocks (256-byte aligned, cuBLASLt's
    // largest alignment class), so both take the plans this run makes.
    if (M <= max_rows_) {
      gemm.run(xn_.get(), H, M, H, head, V, logits_.get(), V, OutType::F32, s);
      ++runs;
    }
  }
  MS_CUDA_CHECK(cudaStreamSynchronize(s));
  return runs;
}

namespace {
// Inside a stream capture an event must be recorded as an external event node to be timed after replay.
void record_event(cudaEvent_t e, cudaStream_t s) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  MS_CUDA_CHECK(cudaStreamIsCapturing(s, &st));
  if (st == cudaStreamCaptureStatusActive) MS_CUDA_CHECK(cudaEventRecordWithFlags(e, s, cudaEventRecordExternal));
  else MS_CUDA_CHECK(cudaEventRecord(e, s));
}
}  // namespace

void StepProfile::start(cudaStream_t s) {
  if (events_.empty()) {
    events_.resize(1024);
    for (auto& e : events_) MS_CUDA_CHECK(cudaEventCreate(&e));
  }
  ops_.clear();
  record_event(events_[0], s);
}

void StepProfile::mark(const char* op, double bytes, double flops, cudaStream_t s) {
  MS_CHECK(ops_.size() + 1 < events_.size(), "too many ops to profile");
  ops_.push_back({op, bytes, flops});
  record_event(events_[ops_.size()], s);
}

std::string StepProfile::report(double bandwidth, double flop_rate) {
  MS_CUDA_CHECK(cudaEventSynchronize(events_[ops_.size()]));
  struct Sum {
    double ms = 0, bytes = 0, flops = 0;
    int n = 0;
  };
  std::vector<std::pair<std::string, Sum>> sums;
  double total = 0, floor_total = 0;
  for (size_t i = 0; i < ops_.size(); ++i) {
    float ms = 0;
    MS_CUDA_CHECK(cudaEventElapsedTime(&ms, events_[i], events_[i + 1]));
    auto it = std::find_if(sums.begin(), sums.end(), [&](auto& p) { return p.first == ops_[i].name; });
    if (it == sums.end()) it = sums.insert(sums.end(), {ops_[i].name, {}});
    it->second.ms += ms;
    it->second.bytes += ops_[i].bytes;
    it->second.flops += ops_[i].flops;
    it->second.n++;
    total += ms;
  }
  std::string out = fmt::format("{:<20} {:>5} {:>10} {:>10} {:>10} {:>8}\n", "op", "calls", "time us", "floor us",
                                "GB moved", "x floor");
  for (auto& [name, v] : sums) {
    const double floor_us = 1e6 * std::max(v.bytes / bandwidth, v.flops / flop_rate);
    floor_total += floor_us;
    out += fmt::format("{:<20} {:>5} {:>10.1f} {:>10.1f} {:>10.3f} {:>8.2f}\n", name, v.n, v.ms * 1000, floor_us,
                       v.bytes / 1e9, v.ms * 1000 / std::max(floor_us, 1e-9));
  }
  out += fmt::format("{:<20} {:>5} {:>10.1f} {:>10.1f}\n", "total", "", total * 1000, floor_total);
  return out;
}

}  // namespace moeserve::cuda
