#include "cuda/device.h"

#include <cuda_runtime.h>

#include <cstdlib>
#include <map>
#include <set>
#include <mutex>
#include <tuple>
#include <string>

#include <fmt/format.h>

#include "core/env.h"
#include "core/error.h"
#include "cuda/launch.h"
#include "cuda/pdl.cuh"

namespace moeserve::cuda {

bool pdl_enabled() {
  static const bool enabled = [] {
    if (!env_flag("MOESERVE_PDL", true)) return false;
    return current_device_sm() >= 90;
  }();
  return enabled;
}

namespace {
__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// t[0]: A's end. A lets its dependent start at once, then spins.
__global__ void pdl_probe_a(unsigned long long* t, unsigned long long spin_ns) {
  pdl_enter();
  const unsigned long long start = global_ns();
  unsigned long long now = start;
  while (now - start < spin_ns) now = global_ns();
  __threadfence();
  if (threadIdx.x == 0) t[0] = global_ns();
}

// t[1]: B's entry, before the wait; t[2]: after it.
__global__ void pdl_probe_b(unsigned long long* t) {
  const unsigned long long entry = global_ns();
  pdl_wait();
  if (threadIdx.x == 0) {
    t[1] = entry;
    t[2] = global_ns();
  }
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw InternalError(fmt::format("CUDA {} failed: {}", what, cudaGetErrorString(e)));
}

// One block per row; a block-wide sum of squares in f32.
__global__ void rmsnorm_kernel(const float* x, const float* w, float eps, int dim, float* out) {
  extern __shared__ float partial[];
  const float* xr = x + size_t(blockIdx.x) * dim;
  float s = 0;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) s += xr[i] * xr[i];
  partial[threadIdx.x] = s;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  float inv = rsqrtf(partial[0] / float(dim) + eps);
  for (int i = threadIdx.x; i < dim; i += blockDim.x) out[size_t(blockIdx.x) * dim + i] = w[i] * (xr[i] * inv);
}
}  // namespace

PdlProbe pdl_overlap_probe(double spin_us) {
  unsigned long long* d = nullptr;
  check(cudaMalloc(&d, 3 * sizeof(unsigned long long)), "cudaMalloc");
  cudaStream_t st = nullptr;
  check(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "cudaStreamCreate");
  const auto spin_ns = static_cast<unsigned long long>(spin_us * 1000.0);
  auto launch = [&] {
    pdl_probe_a<<<1, 32, 0, st>>>(d, spin_ns);
    launch_pdl(pdl_probe_b, dim3(1), dim3(32), 0, st, d);
  };
  auto read = [&](double& entry, double& after) {
    unsigned long long h[3];
    check(cudaStreamSynchronize(st), "cudaStreamSynchronize");
    check(cudaMemcpy(h, d, sizeof(h), cudaMemcpyDeviceToHost), "cudaMemcpy");
    entry = (double(h[1]) - double(h[0])) / 1000.0;
    after = (double(h[2]) - double(h[0])) / 1000.0;
  };
  PdlProbe r;
  launch();
  read(r.eager_b_entry_us, r.eager_b_after_wait_us);
  cudaGraph_t g = nullptr;
  cudaGraphExec_t exec = nullptr;
  check(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
  launch();
  check(cudaStreamEndCapture(st, &g), "cudaStreamEndCapture");
  check(cudaGraphInstantiate(&exec, g, 0), "cudaGraphInstantiate");
  check(cudaGraphLaunch(exec, st), "cudaGraphLaunch");
  read(r.graph_b_entry_us, r.graph_b_after_wait_us);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(g);
  cudaStreamDestroy(st);
  cudaFree(d);
  return r;
}

int current_device_multiprocessors() {
  int dev = 0, sms = 0;
  MS_CUDA_CHECK(cudaGetDevice(&dev));
  MS_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  return sms;
}

int current_device_sm() {
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return 10 * major + minor;
}

bool raise_dynamic_smem(const void* kernel, size_t bytes) {
  if (bytes <= (48u << 10)) return true;  // every kernel's default ceiling: nothing to raise (eager launches)
  static std::mutex mu;
  static std::map<const void*, size_t> ceiling;  // what each kernel's attribute holds now
  std::lock_guard<std::mutex> lock(mu);
  size_t& now = ceiling[kernel];
  if (bytes <= now) return true;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)) != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky: the caller reports it
    return false;
  }
  now = bytes;
  return true;
}

bool cluster_fits_device(const void* kernel, int cluster_x, int threads, size_t smem) {
  static std::mutex mu;
  static std::map<std::tuple<const void*, int, int, size_t>, bool> known;  // one device per process
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_tuple(kernel, cluster_x, threads, smem);
  if (auto it = known.find(key); it != known.end()) return it->second;
  MS_CHECK(raise_dynamic_smem(kernel, smem), "the device refuses {} bytes of shared memory a block", smem);
  MS_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(unsigned(cluster_x));
  cfg.blockDim = dim3(unsigned(threads));
  cfg.dynamicSmemBytes = smem;
  cudaLaunchAttribute attr;
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = unsigned(cluster_x);
  attr.val.clusterDim.y = attr.val.clusterDim.z = 1;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  int clusters = 0;
  const cudaError_t e = cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg);
  if (e != cudaSuccess) (void)cudaGetLastError();  // no cluster of this size here
  return known.emplace(key, e == cudaSuccess && clusters > 0).first->second;
}

bool l2_evict_first_weights() {
  static const bool on = env_flag("MOESERVE_L2_EVICT_FIRST", true);
  return on;
}

std::vector<DeviceInfo> list_devices() {
  std::vector<DeviceInfo> r;
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver / no device" error
    return r;
  }
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
    DeviceInfo d;
    d.index = i;
    d.name = p.name;
    d.sm_major = p.major;
    d.sm_minor = p.minor;
    d.multiprocessors = p.multiProcessorCount;
    d.total_memory = p.totalGlobalMem;
    if (cudaSetDevice(i) == cudaSuccess) cudaMemGetInfo(&d.free_memory, &d.total_memory);
    r.push_back(d);
  }
  return r;
}

std::vector<int> compiled_architectures() {
  cudaFuncAttributes attr{};
  // The PTX/SASS version of a kernel present in this binary for the current device; 0 when there is none.
  if (cudaFuncGetAttributes(&attr, rmsnorm_kernel) != cudaSuccess) {
    cudaGetLastError();
    return {};
  }
  return {attr.binaryVersion};
}

void rmsnorm_f32(const float* x_host, const float* w_host, float eps, int rows, int dim, float* out_host) {
  float *x = nullptr, *w = nullptr, *o = nullptr;
  size_t xb = size_t(rows) * dim * sizeof(float), wb = size_t(dim) * sizeof(float);
  check(cudaMalloc(&x, xb), "cudaMalloc");
  check(cudaMalloc(&w, wb), "cudaMalloc");
  check(cudaMalloc(&o, xb), "cudaMalloc");
  check(cudaMemcpy(x, x_host, xb, cudaMemcpyHostToDevice), "cudaMemcpy");
  check(cudaMemcpy(w, w_host, wb, cudaMemcpyHostToDevice), "cudaMemcpy");
  check(cudaMemset(o, 0xff, xb), "cudaMemset");  // poison: NaN where the kernel writes nothing
  rmsnorm_kernel<<<rows, 256, 256 * sizeof(float)>>>(x, w, eps, dim, o);
  check(cudaGetLastError(), "rmsnorm launch");
  check(cudaMemcpy(out_host, o, xb, cudaMemcpyDeviceToHost), "cudaMemcpy");
  cudaFree(x);
  cudaFree(w);
  cudaFree(o);
}

}  // namespace moeserve::cuda
