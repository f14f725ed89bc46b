#include "benchclient/progress.h"

#include <unistd.h>

#include <chrono>
#include <cmath>

#include <fmt/format.h>

namespace moeserve::bench {

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string clock_text(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  auto t = int64_t(s);
  if (t >= 3600) return fmt::format("{}:{:02}:{:02}", t / 3600, t / 60 % 60, t % 60);
  return fmt::format("{:02}:{:02}", t / 60, t % 60);
}

}  // namespace

ProgressBar::ProgressBar(std::FILE* out, std::string label, size_t total, bool enabled)
    : out_(out), label_(std::move(label)), total_(total), enabled_(enabled && out), start_s_(now_s()) {
  tty_ = enabled_ && isatty(fileno(out_));
  if (enabled_) draw(0);
}

std::string ProgressBar::render(const std::string& label, size_t done, size_t total, double elapsed, int width) {
  static const char* kEighths[] = {"", "▏", "▎", "▍", "▌", "▋", "▊", "▉"};
  double frac = total ? double(done) / double(total) : 1.0;
  int eighths = int(frac * width * 8);
  std::string bar;
  for (int i = 0; i < eighths / 8; ++i) bar += "█";
  int cells = eighths / 8;
  if (cells < width) {
    bar += kEighths[eighths % 8];
    cells += eighths % 8 ? 1 : 0;
  }
  bar += std::string(size_t(width - cells), ' ');
  double rate = elapsed > 0 ? double(done) / elapsed : 0;
  double remaining = rate > 0 ? double(total - done) / rate : NAN;
  return fmt::format("{}: {:3.0f}%|{}| {}/{} [{}<{}, {:.2f}req/s]", label, frac * 100, bar, done, total,
                     clock_text(elapsed), clock_text(remaining), rate);
}

void ProgressBar::draw(size_t done) {
  double t = now_s();
  last_draw_s_ = t;
  drawn_ = done;
  std::string line = render(label_, done, total_, t - start_s_, 20);
  if (tty_) std::fprintf(out_, "\r%s\033[K", line.c_str());
  else std::fprintf(out_, "%s\n", line.c_str());
  std::fflush(out_);
}

void ProgressBar::update(size_t done) {
  last_done_ = done;
  if (!enabled_ || finished_) return;
  double min_gap = tty_ ? 0.1 : 10.0;
  if (done == total_ || now_s() - last_draw_s_ >= min_gap) draw(done);
}

void ProgressBar::finish() {
  if (!enabled_ || finished_) return;
  finished_ = true;
  if (drawn_ != last_done_) draw(last_done_);
  if (tty_) std::fputc('\n', out_);
  std::fflush(out_);
}

}  // namespace moeserve::bench
