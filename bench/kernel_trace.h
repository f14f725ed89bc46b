// Kernel timeline through CUPTI's activity API: one record a kernel (CUDA graph nodes included) with its start and
// end on the GPU clock, collected without events between the kernels, so programmatic dependent launches keep their
// overlap (gpu_profile's per-op events break it). libcupti (CUDA toolkit) is loaded at run time: binaries that
// never trace run where it is missing, and tracing says why it cannot start.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace moeserve::bench {

struct KernelRecord {
  std::string name;  // demangled, without template arguments and namespaces
  uint64_t start_ns = 0, end_ns = 0;
};

// One trace a process (CUPTI's buffer callbacks are process-wide). Start it before CUDA graphs are instantiated so
// that their kernel nodes are recorded too; tracing stays on until the process ends (its timings are of a traced
// run: compare its step span with an untraced run).
class KernelTrace {
 public:
  // Loads libcupti and enables concurrent-kernel records; "" or why it cannot.
  std::string start();
  // Waits for the device and returns (and forgets) every kernel recorded so far, sorted by start.
  std::vector<KernelRecord> take();
};

// Per-step view of `steps` identical steps traced back to back: the kernels of one step in order, each with its
// median time from the previous kernel's end to its own end ("chain": what it adds to the step, programmatic
// overlap included) and its median own duration (start to end, waiting included). Empty `error` on success.
struct StepTimeline {
  struct Kernel {
    std::string name;
    double chain_us = 0, duration_us = 0;
  };
  std::vector<Kernel> kernels;
  double span_us = 0;  // median of first start to last end of a step
  std::string error;
};
StepTimeline step_timeline(const std::vector<KernelRecord>& records, int steps);

// A table of the timeline: one row per kernel, then the chain time summed by kernel name.
std::string format_timeline(const StepTimeline& t);

}  // namespace moeserve::bench
