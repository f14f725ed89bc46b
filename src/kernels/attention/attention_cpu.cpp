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
  // Work items are (sequence token, kv head): the query heads of one group share every key and value load.
  struct Item {
    const AttnSeq* s;
    int64_t token;
  };
  std::vector<Item> items;
  for (const auto& s : seqs)
    for (int64_t i = 0; i < s.num_tokens; ++i) items.push_back({&s, i});
  const int64_t n = int64_t(items.size()) * kv.kv_heads;
  pool.parallel_for(n, 1, [&](int64_t b, int64_t e) {
    std::vector<float> scores;
    for (int64_t w = b; w < e; ++w) {
      const Item& it = items[w / kv.kv_heads];
      const int64_t kvh = w % kv.kv_heads;
      const int64_t row = it.s->row + it.token, ctx = it.s->start + it.token + 1;
      scores.resize(size_t(group * ctx));
      for (int64_t g0 = 0; g0 < group; g0 += 4) {
        const int nq = int(std::min<int64_t>(4, group - g0));
        const float* qs[4];
        for (int i = 0; i < nq; ++i) qs[i] = q + row * q_stride + (kvh * group + g0 + i) * D;
        float dots[4];
        for (int64_t j = 0; j < ctx; ++j) {
          dot_row(DType::F32, slot(kv.k, kv, it.s->block_table, j) + kvh * D, D, qs, nq, dots);
          for (int i = 0; i < nq; ++i) scores[(g0 + i) * ctx + j] = dots[i] * scale;
        }
      }
      for (int64_t g = 0; g < group; ++g) {
        float* sc = &scores[g * ctx];
        float mx = *std::max_element(sc, sc + ctx);
        double sum = 0;
        for (int64_t j = 0; j < ctx; ++j) sum += sc[j] = std::exp(sc[j] - mx);
        float inv = float(1.0 / sum);
        for (int64_t j = 0; j < ctx; ++j) sc[j] *= inv;
        float* o = out + row * out_stride + (kvh * group + g) * D;
        std::fill(o, o + D, 0.0f);
      }
      for (int64_t j = 0; j < ctx; ++j) {
        const float* vj = slot(kv.v, kv, it.s->block_table, j) + kvh * D;
        for (int64_t g = 0; g < group; ++g)
          axpy_f32(scores[g * ctx + j], vj, out + row * out_stride + (kvh * group + g) * D, D);
      }
    }
  });
}

}  // namespace moeserve::kernels
