// Kernel launches with programmatic dependent launch (PDL, sm_90+). A kernel launched through launch_pdl may be
// scheduled while the previous kernel on the stream is still running: its blocks become resident and run their
// preamble (e.g. prefetching weights, which no kernel writes) and then block in pdl_wait() until the previous
// grid has completed and its memory is visible. Inside a CUDA graph this turns every kernel boundary of a decode
// step into a programmatic edge, so the next kernel's launch latency and first weight loads hide behind the
// current kernel's tail.
//
// The contract for every kernel launched this way (device side in cuda/pdl.cuh):
//  - call pdl_wait() before reading anything an earlier kernel writes and before writing anything an earlier
//    kernel may still read; every block calls it (also blocks that return early), so that the grid completes
//    only after its predecessor and the chain stays transitive;
//  - call pdl_launch_dependents() only after pdl_wait(), so at most one grid runs ahead of the one that works.
// The first kernel after a memory copy and kernels whose predecessor may be a library kernel need nothing
// special: the attribute then behaves as a normal stream dependency.
//
// MOESERVE_PDL=0 in the environment turns the attribute off (A/B measurements); it is also off on GPUs older
// than sm_90.
#pragma once

#include <utility>

#include "cuda/common.h"

namespace moeserve::cuda {

// Whether launches use the PDL attribute: sm >= 90 on the current device and MOESERVE_PDL != "0". Decided
// once per process (the first call), so a captured graph and its eager twin launch the same way.
bool pdl_enabled();

// A launch configuration with the PDL attribute when `programmatic` and pdl_enabled(); `attr` must outlive it.
inline cudaLaunchConfig_t pdl_config(dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                                     cudaLaunchAttribute& attr, bool programmatic = true) {
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = &attr;
  cfg.numAttrs = programmatic && pdl_enabled() ? 1 : 0;
  return cfg;
}

// The same with thread-block clusters of cluster_x blocks along x (grid.x a multiple of it).
template <typename... Params, typename... Args>
void launch_pdl_cluster(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                        unsigned cluster_x, Args&&... args) {
  cudaLaunchAttribute attrs[2];
  cudaLaunchConfig_t cfg = pdl_config(grid, block, smem, stream, attrs[0]);
  attrs[cfg.numAttrs].id = cudaLaunchAttributeClusterDimension;
  attrs[cfg.numAttrs].val.clusterDim.x = cluster_x;
  attrs[cfg.numAttrs].val.clusterDim.y = 1;
  attrs[cfg.numAttrs].val.clusterDim.z = 1;
  cfg.attrs = attrs;
  cfg.numAttrs += 1;
  MS_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

template <typename... Params, typename... Args>
void launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                Args&&... args) {
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t cfg = pdl_config(grid, block, smem, stream, attr);
  MS_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

}  // namespace moeserve::cuda
