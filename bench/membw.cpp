// Measures sustained memory read bandwidth with all cores (the floor of CPU decode: every active weight byte
// is read once per token). Prints GB/s for a buffer much larger than the caches.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "core/threadpool.h"

int main(int argc, char** argv) {
  size_t mb = argc > 1 ? size_t(std::atoll(argv[1])) : 2048;
  size_t n = mb * (1 << 20) / sizeof(float);
  std::vector<float> buf(n, 1.0f);
  moeserve::ThreadPool pool(argc > 2 ? std::atoi(argv[2]) : 0);
  double best = 0;
  volatile float sink = 0;
  for (int rep = 0; rep < 5; ++rep) {
    std::vector<float> partial(pool.num_threads() * 16, 0.0f);
    auto t0 = std::chrono::steady_clock::now();
    pool.parallel_for(int64_t(n / 4096), 1, [&](int64_t b, int64_t e) {
      float s0 = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0, s5 = 0, s6 = 0, s7 = 0;
      for (size_t i = size_t(b) * 4096; i < size_t(e) * 4096; i += 8) {
        s0 += buf[i]; s1 += buf[i + 1]; s2 += buf[i + 2]; s3 += buf[i + 3];
        s4 += buf[i + 4]; s5 += buf[i + 5]; s6 += buf[i + 6]; s7 += buf[i + 7];
      }
      sink = sink + s0 + s1 + s2 + s3 + s4 + s5 + s6 + s7;
    });
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, double(n * sizeof(float)) / s / 1e9);
  }
  std::printf("read bandwidth: %.1f GB/s (%zu MiB buffer, %d threads, best of 5)\n", best, mb, pool.num_threads());
  return 0;
}
