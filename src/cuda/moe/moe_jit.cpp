// "jit": the fused MoE kernels compiled at prepare() time with NVRTC for the device's exact architecture, with
// the model's hidden and intermediate sizes as compile-time constants, loaded through the CUDA runtime's
// library API (no driver API: libcuda is absent where CI builds). Cubins are cached on disk under
// $MOESERVE_CACHE/jit or ~/.cache/moeserve/jit, keyed by a hash of everything that affects the code.
#include <cuda_runtime.h>
#include <fmt/format.h>
#include <nvrtc.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "cuda/moe/moe_internal.h"
#include "moe_jit_sources.h"  // generated: the kernel sources as string literals (see moe/embed_jit_sources.cmake)

namespace moeserve::cuda {

namespace fs = std::filesystem;
using namespace moe_kernels;

JitSource jit_embedded_source() {
  JitSource s;
  s.main = kMoeJitSource_moe_gemm_kernels_cuh;
  s.headers = {{"moe_kernel_params.h", kMoeJitSource_moe_kernel_params_h},
               {"moe_ptx.cuh", kMoeJitSource_moe_ptx_cuh},
               {"moe_gemm_ws.cuh", kMoeJitSource_moe_gemm_ws_cuh}};
  return s;
}

std::string jit_arch_for(const DeviceInfo& dev) {
  const int sm = sm_version(dev);
  return sm == 90 ? "sm_90a" : sm_name(sm);
}

// --split-compile=0: NVRTC optimizes the kernels on as many threads as the machine has (the cubin a fresh
// machine compiles at its first start: 4.7 s -> 3.1 s on the 2-core development VM; H200 machine: 5.6 s before).
std::vector<std::string> jit_options(const std::string& arch, const MoeShape& shape, bool depth_variants) {
  std::vector<std::string> o = {"--gpu-architecture=" + arch, "-std=c++17", "--split-compile=0", "-DMOE_JIT=1",
                                fmt::format("-DMOE_JIT_HIDDEN={}", shape.hidden),
                                fmt::format("-DMOE_JIT_INTER={}", shape.inter)};
  if (depth_variants) o.push_back("-DMOE_JIT_DOWN_GEMV_VARIANTS=1");
  return o;
}

std::string jit_compile(const JitSource& src, const std::vector<std::string>& options, std::string& cubin) {
  cubin.clear();
  std::vector<const char*> hdr_text, hdr_name, opts;
  for (auto& [name, text] : src.headers) hdr_name.push_back(name.c_str()), hdr_text.push_back(text.c_str());
  for (auto& o : options) opts.push_back(o.c_str());
  nvrtcProgram prog = nullptr;
  nvrtcResult r = nvrtcCreateProgram(&prog, src.main.c_str(), "moe_gemm_kernels.cu", int(hdr_text.size()),
                                     hdr_text.data(), hdr_name.data());
  if (r != NVRTC_SUCCESS) return fmt::format("nvrtcCreateProgram failed: {}", nvrtcGetErrorString(r));
  r = nvrtcCompileProgram(prog, int(opts.size()), opts.data());
  std::string log;
  size_t log_size = 0;
  if (nvrtcGetProgramLogSize(prog, &log_size) == NVRTC_SUCCESS && log_size > 1) {
    log.resize(log_size);
    nvrtcGetProgramLog(prog, log.data());
    log.resize(log_size - 1);  // drop the terminating NUL
  }
  std::string result;
  if (r != NVRTC_SUCCESS) {
    constexpr size_t kMaxLog = 2000;
    result = fmt::format("NVRTC compile failed ({}): {}{}", nvrtcGetErrorString(r), log.substr(0, kMaxLog),
                         log.size() > kMaxLog ? " [...]" : "");
  } else {
    size_t size = 0;
    if ((r = nvrtcGetCUBINSize(prog, &size)) != NVRTC_SUCCESS || size == 0) {
      result = fmt::format("nvrtcGetCUBINSize failed: {}", nvrtcGetErrorString(r));
    } else {
      cubin.resize(size);
      if ((r = nvrtcGetCUBIN(prog, cubin.data())) != NVRTC_SUCCESS) {
        cubin.clear();
        result = fmt::format("nvrtcGetCUBIN failed: {}", nvrtcGetErrorString(r));
      }
    }
  }
  nvrtcDestroyProgram(&prog);
  return result;
}

namespace {

uint64_t fnv1a(uint64_t h, std::string_view s) {
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// "" when there is nowhere to cache (no HOME, unwritable directory): then every start compiles.
fs::path cache_dir() {
  fs::path dir;
  if (const char* c = std::getenv("MOESERVE_CACHE"); c && *c)
    dir = fs::path(c) / "jit";
  else if (const char* h = std::getenv("HOME"); h && *h)
    dir = fs::path(h) / ".cache" / "moeserve" / "jit";
  else
    return {};
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir)) {
    log_debug("moe jit: no disk cache ({}: {})", dir.string(), ec.message());
    return {};
  }
  return dir;
}

bool read_file(const fs::path& p, std::string& out) {
  std::ifstream f(p, std::ios::binary);
  if (!f) return false;
  std::ostringstream ss;
  ss << f.rdbuf();
  out = ss.str();
  return !out.empty();
}

// Written to a unique temporary name, then renamed: a concurrent reader sees the whole file or none.
void write_file_atomic(const fs::path& p, const std::string& data) {
  static std::atomic<unsigned> counter{0};
  fs::path tmp = p;
  tmp += fmt::format(".tmp.{}.{}", getpid(), counter++);
  {
    std::ofstream f(tmp, std::ios::binary);
    f.write(data.data(), std::streamsize(data.size()));
    if (!f.good()) {
      std::error_code ec;
      fs::remove(tmp, ec);
      log_debug("moe jit: could not write {}", tmp.string());
      return;
    }
  }
  std::error_code ec;
  fs::rename(tmp, p, ec);
  if (ec) fs::remove(tmp, ec);
}

class JitBackend final : public FusedBackendBase {
 public:
  explicit JitBackend(std::string source_override) : override_(std::move(source_override)) {
    spec_.name = "jit";
    spec_.family = OpFamily::Moe;
    spec_.archs = {};  // compiles for whatever it runs on (sm_80+)
    spec_.formats = {"bf16"};
    spec_.jit = true;
    spec_.capturable = true;
    spec_.summary = "the fused kernels compiled by NVRTC for this GPU and these shapes (disk-cached)";
  }
  ~JitBackend() override { unload(); }

  std::string prepare(const DeviceInfo& dev, const MoeShape& shape, std::string& code) override {
    ready_ = false;
    code = "JIT not compiled";
    if (std::string r = check_arch_claim(spec_, dev); !r.empty()) return r;
    if (std::string r = fused_shape_check(shape); !r.empty()) return r;

    const std::string arch = jit_arch_for(dev);
    code = fmt::format("JIT {} failed", arch);
    JitSource src = jit_embedded_source();
    if (!override_.empty()) src.main = override_;
    // The down GEMV's other ring depths only when this shape (or MOESERVE_MOE_DOWN_GEMV_STAGES) takes one.
    const bool depth_variants = down_gemv_variant(shape, dev.multiprocessors) != 0;
    const std::vector<std::string> options = jit_options(arch, shape, depth_variants);
    int driver = 0, nv_major = 0, nv_minor = 0;
    cudaDriverGetVersion(&driver);
    nvrtcVersion(&nv_major, &nv_minor);
    uint64_t h = 14695981039346656037ull;
    h = fnv1a(h, src.main);
    for (auto& [name, text] : src.headers) h = fnv1a(fnv1a(h, name), text);
    for (auto& o : options) h = fnv1a(h, o + '\n');
    h = fnv1a(h, fmt::format("{}|driver {}|nvrtc {}.{}", arch, driver, nv_major, nv_minor));
    const std::string key = fmt::format("{:016x}", h);

    if (!(library_ && key == key_)) {  // a second prepare with the same shapes keeps the loaded library
      unload();
      if (std::string r = load(key, arch, src, options, shape, code_); !r.empty()) return r;
      key_ = key;
    }
    code = code_;
    KernelTable t{};
    if (std::string r = lookup(t, depth_variants); !r.empty()) return r;
    t.pdl = sm_version(dev) >= 90;
    t.wgmma = arch == "sm_90a";
    t.num_sms = dev.multiprocessors;
    if (std::string r = fused_check_kernels(t, dev); !r.empty()) return r;
    return set_ready(t, shape);
  }

 private:
  // Disk cache first, NVRTC otherwise. Fills `code` with what happened.
  std::string load(const std::string& key, const std::string& arch, const JitSource& src,
                   const std::vector<std::string>& options, const MoeShape& shape, std::string& code) {
    const fs::path dir = cache_dir();
    const fs::path file = dir.empty() ? fs::path() : dir / (key + ".cubin");
    std::string cubin;
    if (!file.empty() && read_file(file, cubin)) {
      if (load_cubin(cubin).empty()) {
        log_info("moe jit: {} kernels for hidden {} / inter {} loaded from disk cache {}", arch, shape.hidden,
                 shape.inter, file.string());
        code = fmt::format("JIT {} from disk cache", arch);
        return "";
      }
      log_warn("moe jit: ignoring unloadable cache file {}", file.string());
      std::error_code ec;
      fs::remove(file, ec);
    }
    const auto t0 = std::chrono::steady_clock::now();
    if (std::string r = jit_compile(src, options, cubin); !r.empty()) return r;
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (std::string r = load_cubin(cubin); !r.empty()) return r;
    if (!file.empty()) write_file_atomic(file, cubin);
    log_info("moe jit: compiled {} kernels for hidden {} / inter {} in {:.2f} s{}", arch, shape.hidden, shape.inter,
             secs, file.empty() ? " (no disk cache)" : ", cached as " + file.string());
    code = fmt::format("JIT {} in {:.2f} s", arch, secs);
    return "";
  }

  std::string load_cubin(const std::string& cubin) {
    cudaError_t e = cudaLibraryLoadData(&library_, cubin.data(), nullptr, nullptr, 0, nullptr, nullptr, 0);
    if (e != cudaSuccess) {
      cudaGetLastError();
      library_ = nullptr;
      return fmt::format("cudaLibraryLoadData failed: {}", cudaGetErrorString(e));
    }
    return "";
  }

  std::string lookup(KernelTable& t, bool depth_variants) {
    auto get = [&](const std::string& name, const void*& out) -> std::string {
      cudaKernel_t k = nullptr;
      cudaError_t e = cudaLibraryGetKernel(&k, library_, name.c_str());
      if (e != cudaSuccess) {
        cudaGetLastError();
        return fmt::format("JIT kernel {} not found: {}", name, cudaGetErrorString(e));
      }
      out = reinterpret_cast<const void*>(k);
      return "";
    };
    if (std::string r = get("moe_prep", t.prep); !r.empty()) return r;
    if (std::string r = get("moe_combine", t.combine); !r.empty()) return r;
    // The other ring depths are in the library only with depth_variants (jit_options); else their slots repeat the
    // default kernel, the only one launched then (down_gemv_variant gives 0).
    for (int v = 0; v < kNumDownGemvVariants; ++v) {
      if (v > 0 && !depth_variants) {
        t.down_gemv[v] = t.down_gemv[0];
        continue;
      }
      const std::string name =
          v == 0 ? "moe_down_gemv" : fmt::format("moe_down_gemv_s{}", kDownGemvStageVariants[v]);
      if (std::string r = get(name, t.down_gemv[v]); !r.empty()) return r;
    }
    for (int c = 0; c < kNumGemmConfigs; ++c) {
      if (std::string r = get(fmt::format("moe_gemm_{}_gu", c), t.gemm[c][kGateUp]); !r.empty()) return r;
      if (std::string r = get(fmt::format("moe_gemm_{}_dn", c), t.gemm[c][kDown]); !r.empty()) return r;
    }
    return "";
  }

  void unload() {
    if (library_) cudaLibraryUnload(library_);
    library_ = nullptr;
    key_.clear();
  }

  std::string override_;
  cudaLibrary_t library_ = nullptr;
  std::string key_, code_;
};

}  // namespace

std::unique_ptr<MoeBackend> make_jit_backend(std::string source_override) {
  return std::make_unique<JitBackend>(std::move(source_override));
}

}  // namespace moeserve::cuda
