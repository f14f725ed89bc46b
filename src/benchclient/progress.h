// A tqdm-style progress bar on a stream (stderr):
//   Benchmark:  45%|█████████           | 450/1000 [00:12<00:15, 36.20req/s]
// Redrawn at most every 100 ms (and at the end); on a non-terminal, at most every 10 s, one line each.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace moeserve::bench {

class ProgressBar {
 public:
  ProgressBar(std::FILE* out, std::string label, size_t total, bool enabled);
  void update(size_t done);
  void finish();  // final draw and newline

  static std::string render(const std::string& label, size_t done, size_t total, double elapsed_s, int width);

 private:
  void draw(size_t done);
  std::FILE* out_;
  std::string label_;
  size_t total_, last_done_ = 0, drawn_ = SIZE_MAX;
  bool enabled_, tty_, finished_ = false;
  double start_s_, last_draw_s_ = -1;
};

}  // namespace moeserve::bench
