// Taking named weights out of a checkpoint with the checks every architecture needs: present, the shape
// the config implies, a dtype we can compute with. Tracks what was used so the unknown rest is reported.
#pragma once

#include <set>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/safetensors.h"

namespace moeserve {

class WeightLoader {
 public:
  explicit WeightLoader(const Checkpoint& ckpt) : ckpt_(ckpt) {}

  bool has(const std::string& name) const { return ckpt_.contains(name); }
  // A zero-copy view; UserError if missing, of another shape, or not F32 / BF16 / F16.
  Tensor take(const std::string& name, const Shape& shape);
  // An f32 copy (norm weights, biases, routers: small tensors read in f32 by every kernel).
  Tensor take_f32(const std::string& name, const Shape& shape) { return to_f32(take(name, shape)); }
  // Marks a tensor as known but not needed (e.g. lm_head.weight next to tied embeddings).
  void skip(const std::string& name) { used_.insert(name); }
  std::vector<std::string> unused() const;
  // Logs a warning listing tensors no architecture code asked for.
  void report_unused() const;

 private:
  const Checkpoint& ckpt_;
  std::set<std::string> used_;
};

}  // namespace moeserve
