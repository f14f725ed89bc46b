// Host-to-device weight upload: tensors are read from the mmapped checkpoint (converted to BF16 where the
// checkpoint holds another float type) into two pinned staging buffers by several threads while the copy
// engine drains the other buffer, with a progress line every few seconds.
#pragma once

#include <string>
#include <vector>

#include "core/tensor.h"
#include "core/threadpool.h"
#include "cuda/runtime/allocator.h"

namespace moeserve::cuda {

class WeightUploader {
 public:
  WeightUploader(cudaStream_t stream, size_t total_bytes, ThreadPool& pool, size_t buffer_bytes = size_t(64) << 20);
  ~WeightUploader();
  // Queues the whole tensor, as BF16, for dst (numel elements).
  void copy(const Tensor& t, bf16* dst);
  // Waits for every queued copy.
  void finish();
  size_t bytes_done() const { return done_; }

 private:
  struct Piece {
    size_t offset, bytes;
    bf16* dst;
  };
  void flush();
  cudaStream_t stream_;
  ThreadPool& pool_;
  size_t total_, done_ = 0, buffer_bytes_;
  PinnedBuffer buf_[2];
  cudaEvent_t ready_[2];
  int cur_ = 0;
  size_t fill_ = 0;
  std::vector<Piece> pieces_;
  double start_s_, last_log_s_;
};

}  // namespace moeserve::cuda
