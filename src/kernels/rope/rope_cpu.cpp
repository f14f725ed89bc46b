#include <cmath>
#include <vector>

#include "kernels/rope/rope.h"

namespace moeserve::kernels {

void apply_rope(float* x, int64_t T, int64_t token_stride, int64_t heads, int64_t head_dim, const int64_t* positions,
                const RopeTable& table) {
  const int64_t half = int64_t(table.inv_freq.size());
  std::vector<float> cs(half), sn(half);
  for (int64_t t = 0; t < T; ++t) {
    // As transformers: freqs = inv_freq * position in f32, then cos/sin in f32, times the attention scaling.
    float pos = float(positions[t]);
    for (int64_t i = 0; i < half; ++i) {
      float f = table.inv_freq[i] * pos;
      cs[i] = std::cos(f) * table.attention_scaling;
      sn[i] = std::sin(f) * table.attention_scaling;
    }
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x + t * token_stride + h * head_dim;
      for (int64_t i = 0; i < half; ++i) {
        float a = v[i], b = v[i + half];
        v[i] = a * cs[i] - b * sn[i];
        v[i + half] = b * cs[i] + a * sn[i];
      }
    }
  }
}

}  // namespace moeserve::kernels
