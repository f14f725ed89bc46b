#include "model/weights.h"

#include "core/error.h"
#include "core/log.h"

namespace moeserve {

Tensor WeightLoader::take(const std::string& name, const Shape& shape) {
  auto info = ckpt_.info(name);
  if (!info) throw_user("checkpoint {}: missing tensor '{}'", ckpt_.dir(), name);
  if (info->shape != shape)
    throw_user("checkpoint {}: tensor '{}' in {} has shape {}, but config.json implies {}", ckpt_.dir(), name,
               ckpt_.file_of(name), shape_str(info->shape), shape_str(shape));
  if (info->dtype != DType::F32 && info->dtype != DType::BF16 && info->dtype != DType::F16)
    throw_user("checkpoint {}: tensor '{}' in {} has dtype {}; this build computes with F32, BF16 or F16 weights "
               "(quantized formats need their quantization_config)",
               ckpt_.dir(), name, ckpt_.file_of(name), dtype_name(info->dtype));
  used_.insert(name);
  return ckpt_.get(name);
}

std::vector<std::string> WeightLoader::unused() const {
  std::vector<std::string> r;
  for (auto& n : ckpt_.names())
    if (!used_.count(n)) r.push_back(n);
  return r;
}

void WeightLoader::report_unused() const {
  auto u = unused();
  if (u.empty()) return;
  std::string list;
  for (size_t i = 0; i < u.size() && i < 8; ++i) list += (i ? ", " : "") + u[i];
  if (u.size() > 8) list += fmt::format(", ... ({} more)", u.size() - 8);
  log_warn("checkpoint {}: {} tensor(s) not used by the model: {}", ckpt_.dir(), u.size(), list);
}

}  // namespace moeserve
