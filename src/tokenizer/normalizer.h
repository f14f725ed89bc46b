// tokenizer.json "normalizer": NFC/NFD/NFKC/NFKD, Prepend, Replace, Strip and Sequence of those.
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json_fwd.hpp>

namespace moeserve::tok {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual void normalize(std::string& s) const = 0;
};

// nullptr for a JSON null. Throws UserError naming `where` for an unsupported or malformed normalizer.
std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& j, const std::string& where);

}  // namespace moeserve::tok
