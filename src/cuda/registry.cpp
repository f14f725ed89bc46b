#include "cuda/registry.h"

#include <cuda_runtime.h>

#include <algorithm>

#include <fmt/format.h>

#include "core/error.h"
#include "cuda/common.h"

namespace moeserve::cuda {

void throw_cuda_error(cudaError_t e, const char* what, const char* file, int line) {
  throw InternalError(fmt::format("CUDA error {} ({}) in {} at {}:{}", cudaGetErrorName(e), cudaGetErrorString(e),
                                  what, file, line));
}

const char* op_family_name(OpFamily f) {
  switch (f) {
    case OpFamily::Attention: return "attention";
    case OpFamily::Moe: return "moe";
    case OpFamily::Gemm: return "gemm";
    case OpFamily::Fp4Gemm: return "fp4_gemm";
    case OpFamily::Gdn: return "gdn";
    case OpFamily::AllReduce: return "all_reduce";
    case OpFamily::Sampling: return "sampling";
  }
  return "?";
}

std::string sm_name(int sm, bool arch_specific) { return fmt::format("sm_{}{}", sm, arch_specific ? "a" : ""); }

std::string check_arch_claim(const BackendSpec& spec, const DeviceInfo& dev) {
  const int sm = sm_version(dev);
  if (spec.archs.empty()) {
    if (sm >= 80) return "";
    return fmt::format("needs sm_80 or newer; this GPU ({}) is {}", dev.name, sm_name(sm));
  }
  if (std::find(spec.archs.begin(), spec.archs.end(), sm) != spec.archs.end()) return "";
  std::string list;
  for (int a : spec.archs) list += (list.empty() ? "" : ", ") + sm_name(a);
  return fmt::format("written for {}; this GPU ({}) is {}", list, dev.name, sm_name(sm));
}

std::string check_kernel_present(const void* kernel, const DeviceInfo& dev) {
  cudaFuncAttributes attr{};
  cudaError_t e = cudaFuncGetAttributes(&attr, kernel);
  if (e == cudaSuccess) return "";
  cudaGetLastError();  // not sticky, but keep the error state clean
  const int sm = sm_version(dev);
  if (e == cudaErrorNoKernelImageForDevice || e == cudaErrorInvalidDeviceFunction)
    return fmt::format("no code for {} in this binary", sm_name(sm));
  return fmt::format("kernel not loadable on {}: {}", sm_name(sm), cudaGetErrorString(e));
}

size_t choose_backend(std::vector<BackendReport>& reports, const std::string& requested, const std::string& flag) {
  MS_CHECK(!reports.empty(), "no backends registered for {}", flag);
  auto usable = [](const BackendReport& r) { return r.status.runnable && r.status.self_test_passed; };
  std::string can;
  for (auto& r : reports)
    if (usable(r)) can += (can.empty() ? "" : ", ") + r.spec.name;
  if (can.empty()) can = "none";
  if (requested != "auto") {
    for (size_t i = 0; i < reports.size(); ++i) {
      auto& r = reports[i];
      if (r.spec.name != requested) continue;
      if (!r.status.runnable)
        throw_user("{} {}: cannot run here: {}. Backends that can: {}", flag, requested, r.status.reason, can);
      if (!r.status.self_test_passed)
        throw_user("{} {}: its self-test against the reference failed: {}. Backends that can: {}", flag, requested,
                   r.status.self_test, can);
      r.status.chosen = true;
      r.status.why_chosen = "requested";
      return i;
    }
    std::string all;
    for (auto& r : reports) all += (all.empty() ? "" : ", ") + r.spec.name;
    throw_user("{} {}: unknown backend; valid choices: auto, {}", flag, requested, all);
  }
  size_t best = reports.size();
  for (size_t i = 0; i < reports.size(); ++i) {
    if (!usable(reports[i])) continue;
    if (best == reports.size() ||
        (reports[i].status.trial_us > 0 && reports[i].status.trial_us < reports[best].status.trial_us))
      best = i;
  }
  if (best == reports.size()) {
    std::string why;
    for (auto& r : reports)
      why += fmt::format("; {}: {}", r.spec.name, r.status.runnable ? r.status.self_test : r.status.reason);
    throw_user("{} auto: no backend can run on this GPU{}", flag, why);
  }
  auto& b = reports[best];
  b.status.chosen = true;
  std::string others;
  for (auto& r : reports)
    if (&r != &b && usable(r) && r.status.trial_us > 0)
      others += fmt::format(", {} {:.1f} us", r.spec.name, r.status.trial_us);
  b.status.why_chosen = b.status.trial_us > 0
                            ? fmt::format("auto: fastest in the timed trial ({:.1f} us{})", b.status.trial_us, others)
                            : "auto: the first backend that passed its self-test";
  return best;
}

}  // namespace moeserve::cuda
