// gemm_self_test: every backend against kernels::linear_reference (double accumulation) on the same
// BF16-rounded inputs, for shapes that hit the edges: one token, one output row, tails of every tile size,
// padded strides. Outputs are poisoned with 0xFF bytes (NaN in both BF16 and F32) so that an element the
// backend forgot to write can never pass, and padding between rows must keep the poison.
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include <fmt/format.h>

#include "core/dtype.h"
#include "core/tensor.h"
#include "cuda/gemm/gemm.h"
#include "kernels/gemm/linear.h"

namespace moeserve::cuda {
namespace {

struct DeviceBuffer {
  void* p = nullptr;
  explicit DeviceBuffer(size_t bytes) { MS_CUDA_CHECK(cudaMalloc(&p, bytes)); }
  ~DeviceBuffer() { cudaFree(p); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

struct Stream {
  cudaStream_t s = nullptr;
  Stream() { MS_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  ~Stream() { cudaStreamDestroy(s); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
};

struct Case {
  int M, N, K;
  int x_pad, y_pad;  // extra elements per row beyond K (x) and N (y)
};

// Every M in {1, 7, 64, 257}, N in {1, 100, 513}, K in {8, 264, 2048} appears, most pairs too. K stays a
// multiple of 8 (and so do the x strides): the model dimensions are, and it keeps the BF16 rows 16-byte
// aligned, which cuBLAS's tensor-core paths and the gemv kernels need. M = 9, 16, 33, 64, 128 cover the gemv
// backend's all-tokens kernel (2, 4, 8 and 16 token tiles, partial last tiles); on a 132-SM GPU it runs
// K = 2048 as 32 splits of 64, K = 264 as 5 (the last one 8 wide), N = 4100 (65 row blocks, the last one 4
// rows) with K = 520 as 5 splits of 128, and K = 8 as one split that writes y directly.
const Case kCases[] = {
    {1, 1, 8, 0, 0},         {1, 513, 2048, 0, 0},   {1, 100, 264, 8, 3},    {7, 100, 264, 0, 0},
    {7, 513, 8, 16, 0},      {7, 1, 2048, 0, 5},     {64, 1, 264, 0, 0},     {64, 100, 2048, 8, 0},
    {64, 513, 8, 0, 1},      {257, 513, 264, 0, 0},  {257, 1, 2048, 0, 0},   {257, 100, 8, 8, 2},
    {9, 513, 2048, 0, 0},    {9, 100, 8, 8, 1},      {16, 100, 264, 8, 3},   {16, 1, 2048, 0, 0},
    {33, 513, 264, 0, 1},    {33, 4100, 520, 0, 0},  {64, 4100, 520, 8, 2},  {128, 100, 2048, 0, 0},
    {128, 513, 264, 16, 1},  {128, 1, 8, 0, 3},
};

const char* out_name(OutType t) { return t == OutType::BF16 ? "bf16" : "f32"; }

// The gap between the output and its reference allowed for one element. BF16 output: the rounding of the
// result (2^-9 relative) plus one more unit when accumulation-order differences move a value across a
// rounding boundary. F32 output: only accumulation order, a few 1e-7 of the row's magnitude; 2e-4 still
// catches a BF16 intermediate or a lost k-chunk.
double tolerance(OutType out, double ref, double row_scale) {
  return out == OutType::BF16 ? 1e-2 * std::fabs(ref) + 1e-4 * row_scale : 2e-4 * row_scale;
}

}  // namespace

std::string gemm_self_test(GemmBackend& b, double& max_err) {
  max_err = 0;
  std::mt19937 gen(20240607);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  Stream stream;
  for (const Case& c : kCases) {
    const int64_t ldx = c.K + c.x_pad, ldy = c.N + c.y_pad;
    std::vector<uint16_t> xb(size_t(c.M) * ldx), wb(size_t(c.N) * c.K);
    std::vector<float> xf(xb.size());
    for (size_t i = 0; i < xb.size(); ++i) xf[i] = bf16_to_f32(xb[i] = f32_to_bf16(uni(gen)));
    kernels::LinearWeight w;
    w.weight = Tensor::empty(DType::BF16, {c.N, c.K});
    for (size_t i = 0; i < wb.size(); ++i) wb[i] = f32_to_bf16(uni(gen));
    std::memcpy(w.weight.data, wb.data(), wb.size() * 2);
    std::vector<float> ref(size_t(c.M) * c.N);
    kernels::linear_reference(xf.data(), c.M, ldx, w, ref.data(), c.N);
    std::vector<double> row_scale(c.M, 0.0);
    for (int m = 0; m < c.M; ++m) {
      for (int n = 0; n < c.N; ++n) row_scale[m] = std::max(row_scale[m], double(std::fabs(ref[size_t(m) * c.N + n])));
      if (row_scale[m] == 0) row_scale[m] = 1;
    }

    DeviceBuffer dx(xb.size() * 2), dw(wb.size() * 2), dy(size_t(c.M) * ldy * 4);
    // Everything on the test's stream: a plain cudaMemcpy / cudaMemset runs on the legacy default stream, which a
    // non-blocking stream does not wait for (the poison memset once landed after the kernel's store: a NaN).
    MS_CUDA_CHECK(cudaMemcpyAsync(dx.p, xb.data(), xb.size() * 2, cudaMemcpyHostToDevice, stream.s));
    MS_CUDA_CHECK(cudaMemcpyAsync(dw.p, wb.data(), wb.size() * 2, cudaMemcpyHostToDevice, stream.s));
    for (OutType out : {OutType::BF16, OutType::F32}) {
      const std::string where = fmt::format("{}: M={} N={} K={} ldx={} ldy={} out={}", b.spec().name, c.M, c.N,
                                            c.K, ldx, ldy, out_name(out));
      const size_t elt = out == OutType::BF16 ? 2 : 4, bytes = size_t(c.M) * ldy * elt;
      MS_CUDA_CHECK(cudaMemsetAsync(dy.p, 0xFF, bytes, stream.s));
      try {
        b.run(static_cast<const bf16*>(dx.p), ldx, c.M, c.K, static_cast<const bf16*>(dw.p), c.N, dy.p, ldy, out,
              stream.s);
        MS_CUDA_CHECK(cudaStreamSynchronize(stream.s));
      } catch (const std::exception& e) {
        return where + ": " + e.what();
      }
      std::vector<uint8_t> got(bytes);
      MS_CUDA_CHECK(cudaMemcpyAsync(got.data(), dy.p, bytes, cudaMemcpyDeviceToHost, stream.s));
      MS_CUDA_CHECK(cudaStreamSynchronize(stream.s));
      for (int m = 0; m < c.M; ++m) {
        for (int64_t n = 0; n < ldy; ++n) {
          const size_t i = size_t(m) * ldy + n;
          float v;
          if (out == OutType::BF16) {
            uint16_t h;
            std::memcpy(&h, &got[i * 2], 2);
            if (n >= c.N) {
              if (h != 0xFFFF) return fmt::format("{}: wrote into the row padding at y[{}, {}]", where, m, n);
              continue;
            }
            v = bf16_to_f32(h);
          } else {
            uint32_t u;
            std::memcpy(&u, &got[i * 4], 4);
            if (n >= c.N) {
              if (u != 0xFFFFFFFFu) return fmt::format("{}: wrote into the row padding at y[{}, {}]", where, m, n);
              continue;
            }
            std::memcpy(&v, &u, 4);
          }
          const double want = ref[size_t(m) * c.N + n], err = std::fabs(double(v) - want);
          if (!std::isfinite(v) || err > tolerance(out, want, row_scale[m]))
            return fmt::format("{}: y[{}, {}] = {} expected {} (|err| {:.3g} > tolerance {:.3g}; row max |y| {:.4g})",
                               where, m, n, v, want, err, tolerance(out, want, row_scale[m]), row_scale[m]);
          max_err = std::max(max_err, err / row_scale[m]);
        }
      }
    }
  }
  return "";
}

}  // namespace moeserve::cuda
