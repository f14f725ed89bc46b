#include "kernel_trace.h"

#include <cupti.h>
#include <cxxabi.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>

#include <cuda_runtime.h>
#include <fmt/format.h>

namespace moeserve::bench {
namespace {

// The CUPTI entry points used here, resolved from libcupti at run time.
struct Cupti {
  decltype(&cuptiActivityRegisterCallbacks) register_callbacks = nullptr;
  decltype(&cuptiActivityEnable) enable = nullptr;
  decltype(&cuptiActivityDisable) disable = nullptr;
  decltype(&cuptiActivityFlushAll) flush_all = nullptr;
  decltype(&cuptiActivityGetNextRecord) next_record = nullptr;
  decltype(&cuptiGetResultString) result_string = nullptr;
};

std::string load_cupti(Cupti& c) {
  void* lib = nullptr;
  for (const char* n : {"libcupti.so", "libcupti.so.13", "libcupti.so.12"})
    if ((lib = dlopen(n, RTLD_NOW | RTLD_LOCAL)) != nullptr) break;
  if (lib == nullptr)
    return "libcupti (CUDA toolkit) not found: add its folder (e.g. /usr/local/cuda/lib64 or "
           "/usr/local/cuda/extras/CUPTI/lib64) to LD_LIBRARY_PATH";
  auto sym = [&](auto& f, const char* name) {
    f = reinterpret_cast<std::remove_reference_t<decltype(f)>>(dlsym(lib, name));
    return f != nullptr;
  };
  if (!sym(c.register_callbacks, "cuptiActivityRegisterCallbacks") || !sym(c.enable, "cuptiActivityEnable") ||
      !sym(c.disable, "cuptiActivityDisable") || !sym(c.flush_all, "cuptiActivityFlushAll") ||
      !sym(c.next_record, "cuptiActivityGetNextRecord") || !sym(c.result_string, "cuptiGetResultString"))
    return "libcupti lacks the activity API entry points";
  return "";
}

// CUPTI hands records to C callbacks without a user pointer: the one trace of the process collects here.
struct Sink {
  Cupti api;
  bool loaded = false;
  std::mutex mu;
  std::vector<KernelRecord> records;
};
Sink& sink() {
  static Sink s;
  return s;
}

constexpr size_t kBufferBytes = size_t(8) << 20;

std::string short_name(const char* mangled) {
  int status = 0;
  char* d = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string s = status == 0 && d != nullptr ? d : mangled;
  std::free(d);
  // Drop the argument list, template arguments and namespaces: "ns::kernel<Cfg, 1>(Params)" -> "kernel".
  for (size_t p; (p = s.find("(anonymous namespace)::")) != std::string::npos;) s.erase(p, 23);
  if (auto p = s.find('('); p != std::string::npos) s.resize(p);
  std::string out;
  int depth = 0;
  for (char ch : s) {
    if (ch == '<') ++depth;
    if (depth == 0) out += ch;
    if (ch == '>') --depth;
  }
  if (auto p = out.rfind("::"); p != std::string::npos) out = out.substr(p + 2);
  if (auto p = out.rfind(' '); p != std::string::npos) out = out.substr(p + 1);
  return out;
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = kBufferBytes;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  Sink& s = sink();
  CUpti_Activity* rec = nullptr;
  std::vector<KernelRecord> got;
  while (s.api.next_record(buffer, valid, &rec) == CUPTI_SUCCESS) {
    if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
    got.push_back({short_name(k->name), k->start, k->end});
  }
  std::free(buffer);
  std::lock_guard<std::mutex> lock(s.mu);
  s.records.insert(s.records.end(), got.begin(), got.end());
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

std::string KernelTrace::start() {
  Sink& s = sink();
  if (!s.loaded) {
    if (std::string why = load_cupti(s.api); !why.empty()) return why;
    if (CUptiResult r = s.api.register_callbacks(buffer_requested, buffer_completed); r != CUPTI_SUCCESS) {
      const char* msg = "?";
      s.api.result_string(r, &msg);
      return fmt::format("cuptiActivityRegisterCallbacks: {}", msg);
    }
    s.loaded = true;
  }
  cudaDeviceSynchronize();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.records.clear();
  }
  if (CUptiResult r = s.api.enable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL); r != CUPTI_SUCCESS) {
    const char* msg = "?";
    s.api.result_string(r, &msg);
    return fmt::format("cuptiActivityEnable(CONCURRENT_KERNEL): {}", msg);
  }
  return "";
}

std::vector<KernelRecord> KernelTrace::take() {
  Sink& s = sink();
  cudaDeviceSynchronize();
  s.api.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  std::lock_guard<std::mutex> lock(s.mu);
  std::vector<KernelRecord> out = std::move(s.records);
  s.records.clear();
  std::sort(out.begin(), out.end(), [](const KernelRecord& a, const KernelRecord& b) { return a.start_ns < b.start_ns; });
  return out;
}

StepTimeline step_timeline(const std::vector<KernelRecord>& records, int steps) {
  StepTimeline t;
  if (steps < 1 || records.empty() || records.size() % size_t(steps) != 0) {
    t.error = fmt::format("{} kernel records do not split into {} identical steps", records.size(), steps);
    return t;
  }
  const size_t per = records.size() / size_t(steps);
  for (int s = 1; s < steps; ++s)
    for (size_t i = 0; i < per; ++i)
      if (records[size_t(s) * per + i].name != records[i].name) {
        t.error = fmt::format("step {} kernel {} is {}, step 0 had {}", s, i, records[size_t(s) * per + i].name,
                              records[i].name);
        return t;
      }
  std::vector<std::vector<double>> chain(per), dur(per);
  std::vector<double> span;
  for (int s = 0; s < steps; ++s) {
    const KernelRecord* r = records.data() + size_t(s) * per;
    uint64_t last_end = r[0].start_ns, step_end = 0;
    for (size_t i = 0; i < per; ++i) {
      const double end = double(r[i].end_ns);
      chain[i].push_back((end - double(last_end)) * 1e-3);  // kernel 0: from its own start
      dur[i].push_back(double(r[i].end_ns - r[i].start_ns) * 1e-3);
      last_end = std::max(last_end, r[i].end_ns);
      step_end = std::max(step_end, r[i].end_ns);
    }
    span.push_back(double(step_end - r[0].start_ns) * 1e-3);
  }
  for (size_t i = 0; i < per; ++i) t.kernels.push_back({records[i].name, median(chain[i]), median(dur[i])});
  t.span_us = median(span);
  return t;
}

std::string format_timeline(const StepTimeline& t) {
  if (!t.error.empty()) return "trace: " + t.error + "\n";
  std::string out = fmt::format("{:>4} {:<40} {:>9} {:>9}\n", "#", "kernel", "chain us", "own us");
  std::map<std::string, std::pair<int, double>> by_name;
  double sum = 0;
  for (size_t i = 0; i < t.kernels.size(); ++i) {
    const auto& k = t.kernels[i];
    out += fmt::format("{:>4} {:<40} {:>9.2f} {:>9.2f}\n", i, k.name.substr(0, 40), k.chain_us, k.duration_us);
    by_name[k.name].first += 1;
    by_name[k.name].second += k.chain_us;
    sum += k.chain_us;
  }
  out += fmt::format("step span (first kernel start to last end): {:.1f} us; chain times sum to {:.1f} us\n", t.span_us,
                     sum);
  out += fmt::format("{:<40} {:>6} {:>10}\n", "kernel", "count", "chain us");
  std::vector<std::pair<std::string, std::pair<int, double>>> rows(by_name.begin(), by_name.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.second > b.second.second; });
  for (const auto& [name, v] : rows) out += fmt::format("{:<40} {:>6} {:>10.1f}\n", name.substr(0, 40), v.first, v.second);
  return out;
}

}  // namespace moeserve::bench
