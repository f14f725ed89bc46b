#include "model/arch/qwen3.h"

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/log.h"
#include "core/threadpool.h"
#include "kernels/activation/activation.h"
#include "kernels/attention/attention.h"
#include "kernels/norm/rmsnorm.h"
#include "kv/kv_pool.h"
#include "model/weights.h"

namespace moeserve {

using kernels::LinearWeight;

namespace {

LinearWeight linear_weight(WeightLoader& wl, const std::string& name, int64_t out, int64_t in, bool bias) {
  LinearWeight w;
  w.weight = wl.take(name + ".weight", {out, in});
  if (bias) w.bias = wl.take_f32(name + ".bias", {out});
  return w;
}

LinearWeight view_weight(const Tensor& t) {
  LinearWeight w;
  w.weight = t;
  return w;
}

void load_experts(WeightLoader& wl, const ModelConfig& c, const std::string& p, kernels::MoEWeights& m) {
  const int64_t E = c.num_experts, I = c.moe_intermediate_size, H = c.hidden_size;
  m.experts.resize(E);
  if (wl.has(p + "experts.gate_up_proj")) {
    // Fused layout (transformers 5 in memory): gate_up [E, 2I, H] with gate rows first, down [E, H, I].
    Tensor gu = wl.take(p + "experts.gate_up_proj", {E, 2 * I, H});
    Tensor dn = wl.take(p + "experts.down_proj", {E, H, I});
    for (int64_t e = 0; e < E; ++e) {
      Tensor ge = gu.select0(e);
      m.experts[e].gate = view_weight(ge.rows(0, I));
      m.experts[e].up = view_weight(ge.rows(I, 2 * I));
      m.experts[e].down = view_weight(dn.select0(e));
    }
    return;
  }
  for (int64_t e = 0; e < E; ++e) {
    std::string ep = p + "experts." + std::to_string(e) + ".";
    m.experts[e].gate = linear_weight(wl, ep + "gate_proj", I, H, false);
    m.experts[e].up = linear_weight(wl, ep + "up_proj", I, H, false);
    m.experts[e].down = linear_weight(wl, ep + "down_proj", H, I, false);
  }
}

}  // namespace

std::unique_ptr<Qwen3Model> Qwen3Model::load(const ModelConfig& cfg, const Checkpoint& ckpt, const std::string& prefix) {
  auto m = std::unique_ptr<Qwen3Model>(new Qwen3Model());
  m->cfg_ = cfg;
  m->ckpt_ = ckpt;
  const ModelConfig& c = m->cfg_;
  WeightLoader wl(m->ckpt_);
  const int64_t H = c.hidden_size, D = c.head_dim;
  m->embed = wl.take(prefix + "embed_tokens.weight", {c.vocab_size, H});
  if (c.tie_word_embeddings) {
    m->lm_head = view_weight(m->embed);
    wl.skip("lm_head.weight");
  } else {
    m->lm_head = linear_weight(wl, "lm_head", c.vocab_size, H, false);
  }
  m->final_norm = wl.take_f32(prefix + "norm.weight", {H});
  m->layers.resize(c.num_layers);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    Qwen3Layer& L = m->layers[l];
    std::string p = prefix + "layers." + std::to_string(l) + ".";
    L.q = linear_weight(wl, p + "self_attn.q_proj", c.num_heads * D, H, c.attention_bias);
    L.k = linear_weight(wl, p + "self_attn.k_proj", c.num_kv_heads * D, H, c.attention_bias);
    L.v = linear_weight(wl, p + "self_attn.v_proj", c.num_kv_heads * D, H, c.attention_bias);
    L.o = linear_weight(wl, p + "self_attn.o_proj", H, c.num_heads * D, c.attention_bias);
    L.q_norm = wl.take_f32(p + "self_attn.q_norm.weight", {D});
    L.k_norm = wl.take_f32(p + "self_attn.k_norm.weight", {D});
    L.input_norm = wl.take_f32(p + "input_layernorm.weight", {H});
    L.post_norm = wl.take_f32(p + "post_attention_layernorm.weight", {H});
    L.is_moe = c.is_moe_layer(l);
    if (L.is_moe) {
      L.moe.router.weight = wl.take_f32(p + "mlp.gate.weight", {c.num_experts, H});
      L.moe.top_k = c.num_experts_per_tok;
      L.moe.norm_topk_prob = c.norm_topk_prob;
      load_experts(wl, c, p + "mlp.", L.moe);
    } else {
      L.gate = linear_weight(wl, p + "mlp.gate_proj", c.intermediate_size, H, false);
      L.up = linear_weight(wl, p + "mlp.up_proj", c.intermediate_size, H, false);
      L.down = linear_weight(wl, p + "mlp.down_proj", H, c.intermediate_size, false);
    }
  }
  wl.report_unused();
  m->rope.inv_freq = c.rope.inv_freq(int(D));
  m->rope.attention_scaling = c.rope.attention_scaling();
  return m;
}

size_t Qwen3Model::active_weight_bytes() const {
  auto b = [](const LinearWeight& w) { return w.weight.defined() ? w.weight.nbytes() : 0; };
  size_t n = b(lm_head) + size_t(cfg_.hidden_size) * dtype_size(embed.dtype);
  for (auto& L : layers) {
    n += b(L.q) + b(L.k) + b(L.v) + b(L.o);
    if (L.is_moe)
      n += L.moe.router.weight.nbytes() +
           size_t(L.moe.top_k) * (b(L.moe.experts[0].gate) + b(L.moe.experts[0].up) + b(L.moe.experts[0].down));
    else
      n += b(L.gate) + b(L.up) + b(L.down);
  }
  return n;
}

void Qwen3Model::forward(const ForwardBatch& batch, KVPool& kv, float* logits, ThreadPool& pool) {
  const ModelConfig& c = cfg_;
  const int64_t N = int64_t(batch.tokens.size()), H = c.hidden_size, D = c.head_dim;
  const int64_t QD = c.num_heads * D, KD = c.num_kv_heads * D;
  MS_CHECK(int64_t(batch.positions.size()) == N, "positions {} for {} tokens", batch.positions.size(), N);
  const float eps = float(c.rms_norm_eps);

  std::vector<float> h(N * H), x(N * H), q(N * QD), k(N * KD), v(N * KD), attn(N * QD), tmp(N * H);
  for (int64_t t = 0; t < N; ++t) {
    int32_t id = batch.tokens[t];
    MS_CHECK(id >= 0 && id < c.vocab_size, "token id {} outside the vocabulary", id);
    const char* row = static_cast<const char*>(embed.data) + size_t(id) * H * dtype_size(embed.dtype);
    float* dst = &h[t * H];
    // Widen in place: no allocation per token on the decode path.
    if (embed.dtype == DType::F32) std::memcpy(dst, row, H * sizeof(float));
    else if (embed.dtype == DType::BF16)
      for (int64_t i = 0; i < H; ++i) dst[i] = bf16_to_f32(reinterpret_cast<const uint16_t*>(row)[i]);
    else
      for (int64_t i = 0; i < H; ++i) dst[i] = f16_to_f32(reinterpret_cast<const uint16_t*>(row)[i]);
  }
  std::vector<float> mlp_a, mlp_b;
  const float scale = 1.0f / std::sqrt(float(D));
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const Qwen3Layer& L = layers[l];
    kernels::rmsnorm(h.data(), L.input_norm.ptr<float>(), eps, N, H, x.data());
    kernels::grouped_linear({{x.data(), N, H, &L.q, q.data(), QD},
                             {x.data(), N, H, &L.k, k.data(), KD},
                             {x.data(), N, H, &L.v, v.data(), KD}},
                            pool);
    kernels::rmsnorm(q.data(), L.q_norm.ptr<float>(), eps, N * c.num_heads, D, q.data());
    kernels::rmsnorm(k.data(), L.k_norm.ptr<float>(), eps, N * c.num_kv_heads, D, k.data());
    kernels::apply_rope(q.data(), N, QD, c.num_heads, D, batch.positions.data(), rope);
    kernels::apply_rope(k.data(), N, KD, c.num_kv_heads, D, batch.positions.data(), rope);
    kernels::PagedKV pkv = kv.layer(l);
    kernels::write_kv(pkv, batch.seqs, k.data(), KD, v.data(), KD);
    kernels::paged_attention(q.data(), QD, c.num_heads, pkv, batch.seqs, scale, attn.data(), QD, pool);
    kernels::linear(attn.data(), N, QD, L.o, tmp.data(), H, pool);
    kernels::add_rmsnorm(h.data(), tmp.data(), L.post_norm.ptr<float>(), eps, N, H, x.data());
    if (L.is_moe) {
      kernels::RouterLogitsHook hook;  // empty (no call) unless a router hook is set
      if (router_hook_) hook = [&](float* lg, int64_t T, int64_t E) { router_hook_(l, lg, T, E); };
      kernels::moe_forward(x.data(), N, H, L.moe, tmp.data(), pool, &hook);
    } else {
      const int64_t I = c.intermediate_size;
      mlp_a.resize(N * I);
      mlp_b.resize(N * I);
      kernels::grouped_linear({{x.data(), N, H, &L.gate, mlp_a.data(), I}, {x.data(), N, H, &L.up, mlp_b.data(), I}},
                              pool);
      kernels::silu_mul(mlp_a.data(), mlp_b.data(), mlp_a.data(), N * I);
      kernels::linear(mlp_a.data(), N, I, L.down, tmp.data(), H, pool);
    }
    for (int64_t i = 0; i < N * H; ++i) h[i] += tmp[i];
  }
  // Only the rows whose logits are wanted go through the final norm and the (large) lm_head.
  const int64_t R = int64_t(batch.logit_rows.size());
  std::vector<float> last(R * H);
  for (int64_t r = 0; r < R; ++r) {
    int64_t row = batch.logit_rows[r];
    MS_CHECK(row >= 0 && row < N, "logit row {} of {}", row, N);
    kernels::rmsnorm(&h[row * H], final_norm.ptr<float>(), eps, 1, H, &last[r * H]);
  }
  kernels::linear(last.data(), R, H, lm_head, logits, c.vocab_size, pool);
}

}  // namespace moeserve
