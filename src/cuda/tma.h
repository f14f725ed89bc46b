// TMA tensor-map descriptors for bf16 matrices, shared by the MoE GEMMs and the bandwidth benchmark.
#pragma once

#include <cstdint>

namespace moeserve::cuda {

// Writes into `out` (128 bytes, 64-byte aligned: the bits of a CUtensorMap) the descriptor of a [rows, K] bf16
// matrix at `base` (K contiguous, rows `ld` elements apart: K when ld is 0) read in boxes of 64 (K) x box_rows with
// the 128-byte swizzle and 256-byte L2 promotion. cuTensorMapEncodeTiled is a host-only driver call, reached through
// the runtime's entry-point query (the binaries do not link libcuda). Throws with a message when the driver lacks it
// or refuses the shape.
void encode_bf16_tma_2d(void* out, const void* base, int64_t rows, int K, int box_rows, int64_t ld = 0);

}  // namespace moeserve::cuda
