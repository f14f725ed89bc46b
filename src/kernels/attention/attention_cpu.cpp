#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/threadpool.h"
#include "kernels/attention/attention.h"
#include "kernels/simd_cpu.h"

namespace moeserve::kernels {

namespace {
inline float* slot(float* base, const PagedKV& kv, const int32_t* table, int64_t pos) {
  int64_t page = table[pos / kv.page_size], in_page = pos % kv.page_size;
  return base + page * kv.page_stride + in_page * kv.kv_heads * kv.head_dim;
}
}  // namespace

void write_kv(const PagedKV& kv, const std::vector<AttnSeq>& seqs, const float* k, int64_t k_stride, const float* v,
              int64_t v_stride) {
  const size_t bytes = size_t(kv.kv_heads * kv.head_dim) * sizeof(float);
  for (const auto& s : seqs)
    for (int64_t i = 0; i < s.num_tokens; ++i) {
      int64_t pos = s.start + i;
      std::memcpy(slot(kv.k, kv, s.block_table, pos), k + (s.row + i) * k_stride, bytes);
      std::memcpy(slot(kv.v, kv, s.block_table, pos), v + (s.row + i) * v_stride, bytes);
    }
}

void paged_attention(const float* q, int64_t q_stride, int64_t heads, const PagedKV& kv,
                     const std::vector<AttnSeq>& seqs, float scale, float* out, int64_t out_stride, ThreadPool& pool) {
  MS_CHECK(heads % kv.kv_heads == 0, "attention: {} heads over {} kv heads", heads, kv.kv_heads);
  const int64_t group = heads / kv.kv_heads, D = kv.head_dim;
  // Flatten (sequence, token, head) into independent work items.
  struct Item {
    const AttnSeq* s;
    int64_t token;
  };
  std::vector<Item> items;
  for (const auto& s : seqs)
    for (int64_t i = 0; i < s.num_tokens; ++i) items.push_back({&s, i});
  const int64_t n = int64_t(items.size()) * heads;
  pool.parallel_for(n, 1, [&](int64_t b, int64_t e) {
    std::vector<float> scores;
    for (int64_t w = b; w < e; ++w) {
      const Item& it = items[w / heads];
      const int64_t h = w % heads, kvh = h / group;
      const int64_t row = it.s->row + it.token, ctx = it.s->start + it.token + 1;
      const float* qv = q + row * q_stride + h * D;
      scores.resize(ctx);
      float mx = -INFINITY;
      for (int64_t j = 0; j < ctx; ++j) {
        const float* kj = slot(kv.k, kv, it.s->block_table, j) + kvh * D;
        scores[j] = dot_f32(kj, qv, D) * scale;
        mx = std::max(mx, scores[j]);
      }
      double sum = 0;
      for (int64_t j = 0; j < ctx; ++j) {
        scores[j] = std::exp(scores[j] - mx);
        sum += scores[j];
      }
      float inv = float(1.0 / sum);
      float* o = out + row * out_stride + h * D;
      std::fill(o, o + D, 0.0f);
      for (int64_t j = 0; j < ctx; ++j)
        axpy_f32(scores[j] * inv, slot(kv.v, kv, it.s->block_table, j) + kvh * D, o, D);
    }
  });
}

}  // namespace moeserve::kernels
