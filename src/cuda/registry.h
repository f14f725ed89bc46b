// Kernel-backend registries: every op family (attention, MoE, dense GEMM, FP4 GEMM, GDN, all-reduce,
// sampling) lists backends that declare the GPU architectures and weight formats they support. Before use the
// claim is checked against the device (compute capability) and against this binary (is there code for this
// SM?), a JIT backend compiles for the exact architecture, and a self-test against the CPU reference decides
// whether the backend may serve. `auto` then picks the fastest that passed by a short timed trial.
#pragma once

#include <string>
#include <vector>

#include "cuda/device.h"

namespace moeserve::cuda {

enum class OpFamily { Attention, Moe, Gemm, Fp4Gemm, Gdn, AllReduce, Sampling };
const char* op_family_name(OpFamily f);

// What a backend claims about itself.
struct BackendSpec {
  std::string name;                  // as given to --moe-runner-backend etc.
  OpFamily family = OpFamily::Moe;
  std::vector<int> archs;            // SM versions it is written for, e.g. {90} or {100}; empty: any >= 80
  std::vector<std::string> formats;  // weight formats: "bf16", "fp8_block128", "nvfp4"
  bool jit = false;                  // compiled at startup with NVRTC for the device's exact architecture
  bool capturable = true;            // may be recorded in a CUDA graph (no host syncs, fixed launch shapes)
  std::string summary;               // one line for `moeserve backends`
};

// What the engine found when it checked a backend on this machine.
struct BackendStatus {
  std::string code;          // "sm_90a in binary", "JIT sm_90a (0.42 s)", "JIT sm_90a (disk cache)", "absent"
  bool runnable = false;     // architecture, code and preparation all fine
  std::string reason;        // why not runnable (empty when runnable)
  std::string self_test;     // "pass (max err 3.1e-03)", "FAIL: ...", "not run"
  bool self_test_passed = false;
  double self_test_ms = 0;
  double trial_us = 0;       // timed trial on the model's shapes (0: not timed)
  bool chosen = false;
  std::string why_chosen;
};

struct BackendReport {
  BackendSpec spec;
  BackendStatus status;
};

// "sm_90" for 9.0; "sm_90a" when the arch-specific variant is meant.
std::string sm_name(int sm, bool arch_specific = false);
inline int sm_version(const DeviceInfo& d) { return d.sm_major * 10 + d.sm_minor; }

// Does the spec's architecture claim cover this device? Returns "" or the reason (e.g. "written for sm_100;
// this GPU is sm_90").
std::string check_arch_claim(const BackendSpec& spec, const DeviceInfo& dev);

// Does this binary hold code that runs on the current device for the given __global__ function?
// Returns "" or "no code for sm_90 in this binary (it holds code for sm_100a only)"-style text.
std::string check_kernel_present(const void* kernel, const DeviceInfo& dev);

// Picks a backend from reports: an explicit name must be runnable and have passed its self-test, else a
// UserError names the reason and the backends that can run; "auto" picks the passing backend with the least
// trial time (ties: list order). Marks the chosen report and fills why_chosen. Returns its index.
size_t choose_backend(std::vector<BackendReport>& reports, const std::string& requested, const std::string& flag);

}  // namespace moeserve::cuda
