#include "cpu/ggml_type.h"

#include <array>
#include <cctype>

#include "base/error.h"

namespace strata {
namespace {



bool iequal(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i])))
      return false;
  }
  return true;
}

}  // namespace

std::optional<GgmlTypeTraits> ggml_type_traits(uint32_t id) {
  for (const auto& t : kGgmlTypeTable) {
    if (static_cast<uint32_t>(t.type) == id) return t;
  }
  return std::nullopt;
}

const GgmlTypeTraits& ggml_traits(GgmlType type) {
  for (const auto& t : kGgmlTypeTable) {
    if (t.type == type) return t;
  }
  STRATA_CHECK(false, "GgmlType value outside the table");
}

std::optional<GgmlType> ggml_type_from_name(std::string_view name) {
  for (const auto& t : kGgmlTypeTable) {
    if (iequal(t.name, name)) return t.type;
  }
  return std::nullopt;
}

std::string_view ggml_type_name(GgmlType type) { return ggml_traits(type).name; }

}  // namespace strata
