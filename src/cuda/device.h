// CUDA device discovery. Compiled only when nvcc is found; everything else in moeserve works without it.
// This is the seed of the CUDA backend: kernels, registries and the graph runner grow here.
#pragma once

#include <string>
#include <vector>

namespace moeserve::cuda {

struct DeviceInfo {
  int index = 0;
  std::string name;
  int sm_major = 0, sm_minor = 0;
  int multiprocessors = 0;
  size_t total_memory = 0, free_memory = 0;
};

// Devices visible to this process; empty (never an error) when there is no GPU or no driver.
std::vector<DeviceInfo> list_devices();
// The SM architectures whose code this binary contains, e.g. {90} for sm_90a.
std::vector<int> compiled_architectures();
// Multiprocessors of the calling thread's current device (for launchers that get no DeviceInfo). Throws on CUDA
// errors.
int current_device_multiprocessors();
// The calling thread's current device's SM version as 10 major + minor (90 for sm_90), or 0 when there is no device
// or the query fails (the CUDA error cleared): for launchers choosing an architecture-specific kernel.
int current_device_sm();
// Raises `kernel`'s dynamic shared-memory ceiling to at least `bytes` (a launch above the ceiling fails with
// cudaErrorInvalidValue). Never lowers it, so that launchers caching what they set per (kernel, size) cannot
// leave a kernel launched at several sizes below its largest; one device per process. False (the CUDA error
// cleared) when the device refuses the size.
bool raise_dynamic_smem(const void* kernel, size_t bytes);
// Whether the current device can hold at least one thread-block cluster of `cluster_x` blocks of `kernel` (1-D
// clusters, `threads` a block, `smem` bytes of dynamic shared memory, which it raises to): allows non-portable sizes
// (above 8) on the kernel and asks the occupancy calculator. False (the CUDA error cleared) where such a cluster
// cannot run here; the caller then launches another way. Throws where the device refuses the shared memory. Asked
// once per (kernel, cluster, threads, smem) in a process (one device per process).
bool cluster_fits_device(const void* kernel, int cluster_x, int threads, size_t smem);
// Whether the weight streams of decode steps carry the L2 evict_first priority (the GEMV ring, the MoE's decode
// tiles and down GEMV): MOESERVE_L2_EVICT_FIRST, default on (0: no cache hint, as before). A weight byte is read
// once a step and a step reads far more than L2 holds; evict_first keeps those lines from pushing out the rest.
bool l2_evict_first_weights();

// Programmatic dependent launch, observed: kernel A (one block) spins for spin_us; kernel B, launched after it
// with launch_pdl, reads the global timer on entry (before pdl_wait) and after pdl_wait. Done eagerly and inside
// a captured graph. Times in us relative to A's end: b_entry < 0 means B was running while A still ran (the
// launch overlapped); b_after_wait must be >= 0 (the wait waited).
struct PdlProbe {
  double eager_b_entry_us = 0, eager_b_after_wait_us = 0, graph_b_entry_us = 0, graph_b_after_wait_us = 0;
};
PdlProbe pdl_overlap_probe(double spin_us);

// RMSNorm on the GPU for f32 rows (a first kernel, tested against the CPU reference). Throws InternalError
// on CUDA failures.
void rmsnorm_f32(const float* x_host, const float* w_host, float eps, int rows, int dim, float* out_host);

}  // namespace moeserve::cuda
