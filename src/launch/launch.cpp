#include "launch/launch.h"

#include <fmt/format.h>

#include "core/error.h"
#include "core/log.h"
#include "model/config.h"

#ifdef MOESERVE_HAVE_CUDA
#include "cuda/model/gpu_executor.h"
#endif

namespace moeserve {

bool cuda_device_available() {
#ifdef MOESERVE_HAVE_CUDA
  return !cuda::list_devices().empty();
#else
  return false;
#endif
}

std::string resolve_device(const std::string& device) {
  if (device == "cpu") return "cpu";
  if (device == "auto") return cuda_device_available() ? "cuda" : "cpu";
  if (device != "cuda") throw_user("--device {}: valid choices are auto, cuda, cpu", device);
#ifndef MOESERVE_HAVE_CUDA
  throw_user("--device cuda: this binary was built without the CUDA backend (nvcc was not found at build time)");
#else
  if (!cuda_device_available())
    throw_user("--device cuda: no CUDA GPU is visible (check nvidia-smi and CUDA_VISIBLE_DEVICES), or use --device cpu");
  return "cuda";
#endif
}

std::unique_ptr<ModelRunner> make_runner(const LaunchOptions& o) {
  const std::string dev = resolve_device(o.device);
  if (dev == "cpu") {
    // Every backend flag: the choices the CPU has for it (GEMM has no named CPU backend).
    struct CpuChoices {
      const char* flag;
      const std::string* value;
      bool has_cpu;
    };
    for (const CpuChoices& c : {CpuChoices{"--attention-backend", &o.attention_backend, true},
                                CpuChoices{"--moe-runner-backend", &o.moe_backend, true},
                                CpuChoices{"--gemm-backend", &o.gemm_backend, false}})
      if (*c.value != "auto" && !(c.has_cpu && *c.value == "cpu"))
        throw_user("{} {}: a GPU backend; this server runs on the CPU (--device cpu, or no GPU visible). Valid here: "
                   "{}",
                   c.flag, *c.value, c.has_cpu ? "auto, cpu" : "auto");
    log_info("device: cpu");
    return std::make_unique<ModelRunner>(load_model(o.model_path), o.runner);
  }
#ifdef MOESERVE_HAVE_CUDA
  if (o.moe_backend == "cpu" || o.attention_backend == "cpu")
    throw_user("--moe-runner-backend / --attention-backend cpu: the CPU kernels need --device cpu");
  cuda::GpuOptions g;
  g.mem_fraction_static = o.mem_fraction_static;
  g.max_total_tokens = o.runner.max_total_tokens;
  g.page_size = o.runner.page_size > 0 ? o.runner.page_size : 16;
  g.max_tokens_per_step = std::max<int64_t>(o.runner.chunked_prefill_size, 1);
  g.max_running_requests = o.max_running_requests;
  g.cuda_graph_bs = o.cuda_graph_bs;
  g.cuda_graph_max_bs = o.cuda_graph_max_bs;
  g.disable_cuda_graph = o.disable_cuda_graph;
  g.backends.attention = o.attention_backend;
  g.backends.moe = o.moe_backend;
  g.backends.gemm = o.gemm_backend;
  g.threads = o.runner.threads;
  return std::make_unique<ModelRunner>(cuda::make_gpu_executor(o.model_path, g), o.runner);
#else
  throw_user("--device cuda: this binary was built without the CUDA backend");
#endif
}

std::string backends_report(const std::string& model_path) {
#ifdef MOESERVE_HAVE_CUDA
  auto devs = cuda::list_devices();
  if (devs.empty()) return "no CUDA GPU is visible: only the CPU reference kernels can run here\n";
  cuda::ModelShapes shapes;  // Qwen3-30B-A3B shapes unless a model is given
  std::string which = "Qwen3-30B-A3B shapes (hidden 2048, 128 experts, top-8, moe_intermediate 768)";
  if (!model_path.empty()) {
    shapes = cuda::model_shapes(ModelConfig::from_file(model_path + "/config.json"), 512);
    which = model_path;
  }
  std::string out;
  for (auto& d : devs) {
    if (cudaSetDevice(d.index) != cudaSuccess) continue;
    cuda::BackendRequest req;
    req.timed_trials = true;
    auto sel = cuda::select_backends(d, shapes, req);  // chooses too, so the table shows what auto picks
    out += fmt::format("GPU {}: {} ({}, {} SMs); shapes: {}\n", d.index, d.name,
                       cuda::sm_name(cuda::sm_version(d)), d.multiprocessors, which);
    out += cuda::format_backend_table(sel.reports);
  }
  return out;
#else
  (void)model_path;
  return "this binary was built without the CUDA backend: only the CPU reference kernels can run here\n";
#endif
}

}  // namespace moeserve
