#include "cuda/model/uploader.h"

#include <chrono>
#include <cstring>

#include "core/log.h"

namespace moeserve::cuda {

namespace {
double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

WeightUploader::WeightUploader(cudaStream_t stream, size_t total_bytes, ThreadPool& pool, size_t buffer_bytes)
    : stream_(stream), pool_(pool), total_(total_bytes), buffer_bytes_(buffer_bytes) {
  for (int i = 0; i < 2; ++i) {
    buf_[i] = PinnedBuffer(buffer_bytes_);
    MS_CUDA_CHECK(cudaEventCreateWithFlags(&ready_[i], cudaEventDisableTiming));
    MS_CUDA_CHECK(cudaEventRecord(ready_[i], stream_));
  }
  start_s_ = last_log_s_ = now_s();
}

WeightUploader::~WeightUploader() {
  for (auto& e : ready_) cudaEventDestroy(e);
}

void WeightUploader::flush() {
  if (pieces_.empty()) return;
  char* base = static_cast<char*>(buf_[cur_].get());
  for (auto& p : pieces_) MS_CUDA_CHECK(cudaMemcpyAsync(p.dst, base + p.offset, p.bytes, cudaMemcpyHostToDevice, stream_));
  MS_CUDA_CHECK(cudaEventRecord(ready_[cur_], stream_));
  pieces_.clear();
  fill_ = 0;
  cur_ ^= 1;
  // The other buffer may still be draining: wait for its copies before the CPU writes into it.
  MS_CUDA_CHECK(cudaEventSynchronize(ready_[cur_]));
  double t = now_s();
  if (t - last_log_s_ > 3.0) {
    last_log_s_ = t;
    log_info("loading weights to the GPU: {} of {} ({:.0f}%, {:.1f} GB/s)", format_bytes(done_), format_bytes(total_),
             100.0 * double(done_) / double(std::max<size_t>(total_, 1)), double(done_) / (t - start_s_) / 1e9);
  }
}

void WeightUploader::copy(const Tensor& t, bf16* dst) {
  MS_CHECK(t.dtype == DType::BF16 || t.dtype == DType::F32 || t.dtype == DType::F16,
           "weights of dtype {} cannot be uploaded as BF16", dtype_name(t.dtype));
  const int64_t n = t.numel();
  const size_t esz = dtype_size(t.dtype);
  const size_t per_buffer = buffer_bytes_ / sizeof(uint16_t);
  for (int64_t begin = 0; begin < n;) {
    size_t room = (buffer_bytes_ - fill_) / sizeof(uint16_t);
    if (room < 4096 && room < size_t(n - begin)) {
      flush();
      room = per_buffer;
    }
    const int64_t cnt = std::min<int64_t>(int64_t(room), n - begin);
    uint16_t* out = reinterpret_cast<uint16_t*>(static_cast<char*>(buf_[cur_].get()) + fill_);
    const char* src = static_cast<const char*>(t.data) + size_t(begin) * esz;
    // Several threads read the page cache (one thread cannot reach the copy engine's bandwidth).
    pool_.parallel_for(cnt, 1 << 18, [&](int64_t b, int64_t e) {
      if (t.dtype == DType::BF16) {
        std::memcpy(out + b, src + size_t(b) * 2, size_t(e - b) * 2);
      } else if (t.dtype == DType::F32) {
        const float* s = reinterpret_cast<const float*>(src);
        for (int64_t i = b; i < e; ++i) out[i] = f32_to_bf16(s[i]);
      } else {
        const uint16_t* s = reinterpret_cast<const uint16_t*>(src);
        for (int64_t i = b; i < e; ++i) out[i] = f32_to_bf16(f16_to_f32(s[i]));
      }
    });
    pieces_.push_back({fill_, size_t(cnt) * 2, dst + begin});
    fill_ += (size_t(cnt) * 2 + 255) / 256 * 256;
    done_ += size_t(cnt) * 2;
    begin += cnt;
    if (fill_ >= buffer_bytes_) flush();
  }
}

void WeightUploader::finish() {
  flush();
  MS_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

}  // namespace moeserve::cuda
