//===- DType.cpp - element types of runtime buffers -------------------------===//

#include "ernie/runtime/DType.h"

#include <array>
#include <utility>

namespace ernie::runtime {
namespace {
struct DTypeInfo {
  DType type;
  std::string_view name;
  std::size_t bytes;
  bool isFloat;
};
constexpr std::array<DTypeInfo, 9> kInfo = {{
    {DType::F64, "f64", 8, true},
    {DType::F32, "f32", 4, true},
    {DType::F16, "f16", 2, true},
    {DType::BF16, "bf16", 2, true},
    {DType::F8E4M3FN, "f8E4M3FN", 1, true},
    {DType::F8E5M2, "f8E5M2", 1, true},
    {DType::I64, "i64", 8, false},
    {DType::I32, "i32", 4, false},
    {DType::I1, "i1", 1, false},
}};
const DTypeInfo &info(DType type) {
  return kInfo[static_cast<std::size_t>(type)];
}
} // namespace

std::size_t byteSize(DType type) { return info(type).bytes; }
std::string_view name(DType type) { return info(type).name; }
bool isFloat(DType type) { return info(type).isFloat; }

std::optional<DType> parseDType(std::string_view spelling) {
  for (const DTypeInfo &entry : kInfo)
    if (entry.name == spelling)
      return entry.type;
  return std::nullopt;
}

} // namespace ernie::runtime
